"""AlignAtt: commit what the model's own cross-attention says it has heard whole.

LocalAgreement (:mod:`captioner.engine.policy.local_agreement`) commits a word once two
consecutive hypotheses agree on it, so a word is final about one update interval after it could
be. AlignAtt (the policy of SimulStreaming, Papi et al. 2023 "AlignAtt: Using Attention-based
Audio-Translation Alignments as a Guide for Simultaneous Speech Translation"; Macháček et al.
2025) reads, for each token the decoder chose, where its alignment heads attended in the audio:
a token chosen while the model looks at the last few hundred milliseconds of what has been heard
may be a word cut off by the window's end, or a guess at what comes next; tokens before the
first such one were heard whole and are committed at once, from one hypothesis.

Rules, per update (times on the stream's clock; ``end`` = the end of the audio in the window):

1. Words are taken in order beyond the committed text; the first word whose tokens attended
   later than ``end - attend_margin_s`` or whose aligned end (DTW) lies there stops the commit.
2. Context before commitment: while fewer than ``first_words`` words of the segment (or of a new
   sentence) are committed, a word also needs ``first_context_s`` of speech after it in the
   window (up to the end of the last word heard). Whisper tiny.en hears JFK's "And so my fellow Americans" as "am I fellow" from every
   prefix of 2.7-3.3 s of the recording, and right from 4 s on, when "ask not" follows. A
   sentence that follows a committed sentence of the same segment (its speech in the window, or
   after a trim in the prompt) waits for ``sentence_context_s`` instead (in conversation, most
   words are among the first three of a short sentence: "How can I help you today?"). A pause
   keeps the segment open (the base policy's rule), so such words stay partial and the next
   speech is decoded in the same window; a silence of ``hold_s`` commits them.
3. Lines: a committed word that ends a sentence ends the caption line (the update's ``segment``
   moves on), as a pause does; so a line ends at a sentence end or a pause, wherever the
   updates happened to fall, and a replay of the same audio gives the same lines.
4. Unanchored text is not shown: when every word of a hypothesis attended to the window's first
   frames (within ``UNANCHORED_S``) of a window of a second or more, the alignment heads found
   nothing in the audio to follow: Whisper's " you" on music is such a text (every word of it
   on frame 0). It is treated as the decoder's guards
   treat invented text.
5. A hypothesis without attention (a model without alignment heads) falls back to agreement.
6. Hybrid (``commit_on_agreement``): what two consecutive hypotheses agree on is committed too,
   when that reaches further than the attention rule (a word whose attention runs into the
   margin but that the last update heard the same); the first-words rule holds for both.

The trade of lag for stability is in ``PolicyConfig``: ``attend_margin_s``, ``first_words``,
``first_context_s``, ``sentence_context_s``, ``first_words_per_sentence``, ``commit_on_agreement`` and
``close_overlap_s`` (where a segment's closing window starts); named
settings per device class are in :mod:`captioner.engine.policy.presets`.

Partial text, trimming, prompting and which pause closes a segment are LocalAgreement's. Called only by the
worker thread that owns the stream.
"""

from __future__ import annotations

from dataclasses import replace

from captioner.engine.policy.config import PolicyConfig
from captioner.engine.policy.local_agreement import LocalAgreementPolicy
from captioner.engine.policy.words import Hypothesis, Word, ends_sentence

UNANCHORED_S = 0.04
"""Two encoder frames: attention this close to a window's start, for every word, follows nothing."""
UNANCHORED_MIN_WINDOW_S = 1.0



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
        self._line_after_sentence = False  # the line follows a committed sentence of the segment

    def update(self, hypothesis: Hypothesis, emitted_audio_s: float, emitted_wall_s: float,
               close_segment: bool = False, close_at_s: float | None = None, cut_in_speech: bool = False):
        if not hypothesis.rejected and _unanchored(hypothesis):
            hypothesis = replace(hypothesis, rejected=True, reason="unanchored")
        return super().update(hypothesis, emitted_audio_s, emitted_wall_s, close_segment, close_at_s, cut_in_speech)

    def _agreed(self, tail: list[Word], hypothesis: Hypothesis) -> int:
        if not tail or any(w.attend_s is None for w in tail):
            return super()._agreed(tail, hypothesis)
        c = self.config
        limit_s = hypothesis.end_s - c.attend_margin_s
        in_context = self._in_context(tail, hypothesis)
        n = 0
        for w in tail:
            if w.attend_s > limit_s or w.end_s > limit_s or not in_context[n]:
                break
            n += 1
        if c.commit_on_agreement:
            # The hybrid (rule 6): agreement of two hypotheses commits too, where it reaches
            # further; the first words still wait for their context.
            agreed = super()._agreed(tail, hypothesis)
            k = 0
            while k < agreed and in_context[k]:
                k += 1
            n = max(n, k)
        return n

    def _in_context(self, tail: list[Word], hypothesis: Hypothesis) -> list[bool]:
        """Per word of ``tail`` (the hypothesis beyond the committed text), whether the
        first-words rule (rule 2) lets it be committed: counted from the line's start, and from
        every sentence end in ``tail`` too (the words after "that." in "with that. What is the
        transfer" are a sentence's first words, whether "that." is committed yet or not)."""
        c = self.config
        # Context is speech heard after the word: the silence of a pause says nothing about it
        # (JFK's "And so my fellow Americans" was "am I fellow" with 1.9 s of window after "my",
        # most of it the pause before "ask not").
        heard_s = max((w.end_s for w in hypothesis.words if w.key), default=hypothesis.start_s)
        line = self._line_words
        after_sentence = self._line_after_sentence
        out = []
        for w in tail:
            sure = c.sure_p is not None and w.confidence is not None and w.confidence >= c.sure_p
            need_s = c.first_context_s
            if after_sentence and c.sentence_context_s is not None:
                need_s = min(need_s, c.sentence_context_s)
            out.append(line >= c.first_words or sure or heard_s - w.end_s >= need_s)
            if ends_sentence(w) and c.first_words_per_sentence:
                line = 0
                after_sentence = True
            elif w.key:
                line += 1
        return out

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
                self._line_after_sentence = self.config.first_words_per_sentence
                piece = []
        if piece:
            super()._commit(emit, piece)
            self._line_words += sum(1 for w in piece if w.key)

    def _close(self, at_s: float, keep_segment: bool = False) -> None:
        super()._close(at_s, keep_segment)
        if not keep_segment:
            self._line_words = 0
            self._line_after_sentence = False


def _unanchored(hypothesis: Hypothesis) -> bool:
    words = [w for w in hypothesis.words if w.key]
    if not words or any(w.attend_s is None for w in words):
        return False
    if hypothesis.end_s - hypothesis.start_s < UNANCHORED_MIN_WINDOW_S:
        return False
    return all(w.attend_s <= hypothesis.start_s + UNANCHORED_S for w in words)
