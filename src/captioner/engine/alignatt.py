"""AlignAtt: commit what the model's own cross-attention says it has heard whole.

LocalAgreement (:mod:`captioner.engine.policy`) commits a word once two consecutive hypotheses
agree on it, so a word is final about one update interval after it could be. AlignAtt (the
policy of SimulStreaming, Papi et al. 2023 "AlignAtt: Using Attention-based Audio-Translation
Alignments as a Guide for Simultaneous Speech Translation"; Macháček et al. 2025) reads, for each
token the decoder chose, where its alignment heads attended in the audio: a token chosen while
the model looks at the last few hundred milliseconds of what has been heard may be a word cut
off by the window's end, or a guess at what comes next; tokens before the first such one were
heard whole and are committed at once, from one hypothesis.

Rules, per update (times on the stream's clock; ``end`` = the end of the audio in the window):

1. Words are taken in order beyond the committed text; the first word whose tokens attended
   later than ``end - attend_margin_s`` or whose aligned end (DTW) lies there stops the commit.
2. Context before commitment: while fewer than ``first_words`` words of the segment (or of a new
   sentence) are committed, a word also needs ``first_context_s`` of audio after it in the
   window. Whisper tiny.en hears JFK's "And so my fellow Americans" as "am I fellow" from every
   prefix of 2.7-3.3 s of the recording, and right from 4 s on, when "ask not" follows; so a
   pause does not close a segment whose first words still lack that context: the words stay
   partial and the next speech is decoded in the same window, unless the silence after the
   last word reaches ``hold_s`` (then, as at the end of a stream, everything is committed).
   While a close is held, the policy tells the engine it has nothing pending (so the engine
   neither retries the close at every tick nor decodes the silence) but keeps its buffer; the
   next speech, the end of the hold (seen through ``advance_idle``) or the stream's end
   resumes it.
3. Lines: a committed word that ends a sentence ends the caption line (the update's ``segment``
   moves on), as a pause does; so a line ends at a sentence end or a pause, wherever the
   updates happened to fall, and a replay of the same audio gives the same lines.
4. Unanchored text is not shown: when every word of a hypothesis attended to the window's first
   frames (within ``UNANCHORED_S``) of a window of a second or more, the alignment heads found
   nothing in the audio to follow: Whisper's " you" on music is such a text (measured: tones
   and chords, 2-3 s windows, every word on frame 0). It is treated as the decoder's guards
   treat invented text.
5. A hypothesis without attention (a model without alignment heads) falls back to agreement.
6. Hybrid (``commit_on_agreement``): what two consecutive hypotheses agree on is committed too,
   when that reaches further than the attention rule (a word whose attention runs into the
   margin but that the last update heard the same); the first-words rule holds for both.

The trade of lag for stability is in ``PolicyConfig``: ``attend_margin_s``, ``first_words``,
``first_context_s``, ``first_words_per_sentence``, ``hold_s``, ``commit_on_agreement`` and
``close_overlap_s`` (where a segment's closing window starts); named
settings per device class are in :mod:`captioner.engine.policies`.

Partial text, trimming, prompting and closing at a pause are LocalAgreement's. Called only by the
worker thread that owns the stream.
"""

from __future__ import annotations

import re
from dataclasses import replace

from captioner.engine.policy import Hypothesis, LocalAgreementPolicy, PolicyConfig, Word

UNANCHORED_S = 0.04
"""Two encoder frames: attention this close to a window's start, for every word, follows nothing."""
UNANCHORED_MIN_WINDOW_S = 1.0

_SENTENCE_END_RE = re.compile(r"[.?!\u3002\uff01\uff1f][\"'\u201d\u2019)\]]*$")


def ends_sentence(word: Word) -> bool:
    return bool(_SENTENCE_END_RE.search(word.text.strip()))


class AlignAttPolicy(LocalAgreementPolicy):
    """One stream's streaming state under the AlignAtt rule (see the module docstring)."""

    wants_alignment = True
    """Tells the engine to ask the recognizer for attention with this stream's windows."""

    def forced_prefix(self, window_start_s: float) -> tuple[int, ...]:
        """None: the rule reads the cross-attention of every word's tokens, and a prefix's tokens
        are prefilled, not stepped (no attention is recorded for them)."""
        return ()

    def __init__(self, stream: str, config: PolicyConfig | None = None, start_s: float = 0.0) -> None:
        super().__init__(stream, config, start_s)
        self._line_words = 0  # words committed since the segment or sentence began
        self._held_until_s: float | None = None  # a pause's close is held until this stream time

    @property
    def has_pending_text(self) -> bool:
        return self._held_until_s is None and super().has_pending_text

    def advance_idle(self, to_s: float) -> None:
        """While a close is held the buffer stays; once the hold is over the open text is
        pending again, so the engine closes the segment (and the policy commits it)."""
        if self._held_until_s is not None:
            if to_s >= self._held_until_s:
                self._held_until_s = None
            return
        super().advance_idle(to_s)

    def update(self, hypothesis: Hypothesis, emitted_audio_s: float, emitted_wall_s: float,
               close_segment: bool = False, close_at_s: float | None = None):
        self._held_until_s = None
        if not hypothesis.rejected and _unanchored(hypothesis):
            hypothesis = replace(hypothesis, rejected=True, reason="unanchored")
        held = close_segment and not hypothesis.rejected and self._defer_close(hypothesis)
        out = super().update(hypothesis, emitted_audio_s, emitted_wall_s, close_segment and not held, close_at_s,
                             keep_shown=held)
        if held and self._s.previous_tail:
            last_end_s = max(w.end_s for w in hypothesis.words)
            self._held_until_s = last_end_s + self.config.hold_s
        return out

    def flush(self, emitted_audio_s: float, emitted_wall_s: float):
        self._held_until_s = None
        return super().flush(emitted_audio_s, emitted_wall_s)

    def _defer_close(self, hypothesis: Hypothesis) -> bool:
        """A pause came while the segment's first words lack context: keep it open (see rule 2)."""
        c = self.config
        words = [w for w in hypothesis.words if w.key]
        if self._line_words >= c.first_words or not words or any(w.attend_s is None for w in words):
            return False
        if hypothesis.end_s - words[-1].end_s >= c.hold_s:
            return False
        first_open = words[min(len(words), len(self._s.committed) + c.first_words - self._line_words) - 1]
        return hypothesis.end_s - first_open.end_s < c.first_context_s

    def _agreed(self, tail: list[Word], hypothesis: Hypothesis) -> int:
        if not tail or any(w.attend_s is None for w in tail):
            return super()._agreed(tail, hypothesis)
        c = self.config
        limit_s = hypothesis.end_s - c.attend_margin_s
        n = 0
        for w in tail:
            if w.attend_s > limit_s or w.end_s > limit_s or not self._has_context(n, w, hypothesis):
                break
            n += 1
        if c.commit_on_agreement:
            # The hybrid (rule 6): agreement of two hypotheses commits too, where it reaches
            # further; the first words still wait for their context.
            agreed = super()._agreed(tail, hypothesis)
            k = 0
            while k < agreed and self._has_context(k, tail[k], hypothesis):
                k += 1
            n = max(n, k)
        return n

    def _has_context(self, n: int, word: Word, hypothesis: Hypothesis) -> bool:
        """Whether ``word``, the ``n``-th beyond the committed text, may be committed under the
        first-words rule (rule 2)."""
        c = self.config
        if self._line_words + n >= c.first_words:
            return True
        return hypothesis.end_s - word.end_s >= c.first_context_s

    def _commit(self, emit, words: list[Word]) -> None:
        """Commit ``words``, one caption per line: a sentence end closes the line."""
        piece: list[Word] = []
        for w in words:
            piece.append(w)
            if ends_sentence(w):
                super()._commit(emit, piece)
                self._s.segment += 1
                # Rule 2 after a sentence end, or only at a segment's start (then the sentence's
                # words count on towards ``first_words``).
                self._line_words = 0 if self.config.first_words_per_sentence else \
                    self._line_words + sum(1 for x in piece if x.key)
                piece = []
        if piece:
            super()._commit(emit, piece)
            self._line_words += sum(1 for w in piece if w.key)

    def _close(self, at_s: float, keep_segment: bool = False) -> None:
        super()._close(at_s, keep_segment)
        if not keep_segment:
            self._line_words = 0


def _unanchored(hypothesis: Hypothesis) -> bool:
    words = [w for w in hypothesis.words if w.key]
    if not words or any(w.attend_s is None for w in words):
        return False
    if hypothesis.end_s - hypothesis.start_s < UNANCHORED_MIN_WINDOW_S:
        return False
    return all(w.attend_s <= hypothesis.start_s + UNANCHORED_S for w in words)
