"""Streaming policy: turns a run of whole-window hypotheses into partial and committed captions.

Every update decodes the stream's audio buffer (from ``buffer_start_s`` to now) and hands the
result here as a :class:`Hypothesis` of timed words. The policy is LocalAgreement-2: the longest
common prefix of the two latest hypotheses, beyond what is already committed, is committed; the
rest of the latest hypothesis is the partial text. Committed text is never changed or repeated,
and the partial always continues it (the screen shows ``committed + partial``).

The buffer is trimmed at the end of a segment whose words are all committed, a sentence's end
first, so a window never fills; the text committed before the buffer becomes the prompt of the
next window. A pause does not cut the buffer by itself: a hesitation in the middle of a
sentence keeps the audio before it in the next windows; a long silence closes the segment
(:meth:`LocalAgreementPolicy.settle`), and so does the end of a stream, where the last
hypothesis is committed whole and the buffer restarts after it; a stream cut off inside speech
(a Ctrl-C mid-sentence) commits only the words the audio holds
(:func:`~captioner.engine.policy.words.heard_before_cut`).
Hypotheses the decoder's guards rejected (text invented on silence, loops) never reach the screen.

This module is pure Python: no model, no clock, no thread; the worker thread calls it.
:func:`captioner.engine.policy.presets.make_policy` builds the policy a
:class:`~captioner.engine.policy.config.PolicyConfig` names: LocalAgreement here, or AlignAtt
(:mod:`captioner.engine.policy.alignatt`: commits what the model's cross-attention says it has
heard whole, on one hypothesis).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from captioner.engine.policy.config import PolicyConfig
from captioner.engine.policy.words import (
    Hypothesis,
    Word,
    ends_sentence,
    heard_before_cut,
    join_dictated_digits,
    join_words,
    whole_words,
)
from captioner.events import CaptionUpdate

TRIM_GAP_S = 0.3
"""The least gap between two words' measured times that a buffer is cut in without a decoder
timestamp: a pause, not the joins of one phrase."""


@dataclass(slots=True)
class _State:
    buffer_start_s: float = 0.0
    committed: list[Word] = field(default_factory=list)  # committed words still inside the buffer
    previous_tail: list[Word] = field(default_factory=list)  # uncommitted words of the last hypothesis
    tail_heard_s: float = 0.0  # where the audio of the hypothesis that gave previous_tail ended
    partial_text: str = ""
    segment: int = 0
    # The texts (not the Words) of the committed words before the buffer, as many as a prompt
    # takes: a served model process holds this for hundreds of streams, and a named tuple is a
    # container that the cyclic GC walks in every full collection (a str is not); as Words they
    # were most of what a served GPU model process held (docs/serve.md).
    history: deque[str] = field(default_factory=deque)
    language: str = ""
    prefix: tuple[int, ...] = ()  # tokens of committed words at the buffer's start (see forced_prefix)
    prefix_start_s: float = float("nan")  # the window start those tokens' timestamps count from
    final_end_s: float = 0.0  # where the stream's last committed caption ends: time only moves on
    rejected: bool = False  # the guards rejected the last hypothesis


class LocalAgreementPolicy:
    """One stream's streaming state. Called only by the worker thread that owns the stream."""

    def __init__(self, stream: str, config: PolicyConfig | None = None, start_s: float = 0.0) -> None:
        self.stream = stream
        self.config = config or PolicyConfig()
        self._s = _State(buffer_start_s=start_s, history=deque(maxlen=self.config.prompt_words))
        self.committed_words_total = 0

    # -- what the worker asks -------------------------------------------------------------------
    @property
    def buffer_start_s(self) -> float:
        """Where the next window starts (seconds of the stream's clock)."""
        return self._s.buffer_start_s

    @property
    def segment(self) -> int:
        return self._s.segment

    @property
    def partial_text(self) -> str:
        return self._s.partial_text

    @property
    def has_pending_text(self) -> bool:
        """True while the segment is open: something is shown as partial or committed inside
        the buffer (a close must come: a pause after a sentence end, a long silence, the end)."""
        return bool(self._s.previous_tail or self._s.partial_text or self._s.committed)

    @property
    def has_uncommitted_text(self) -> bool:
        """True while words are shown that are not committed yet (the next update may commit
        them): an open segment whose words are all committed waits for speech or its close."""
        return bool(self._s.previous_tail or self._s.partial_text)

    def settle(self, silence_s: float, close_at_s: float, emitted_audio_s: float,
               emitted_wall_s: float) -> list[CaptionUpdate]:
        """A pause the last update already heard (``silence_s`` since the last speech): no model
        step. At ``hold_s`` the words still shown are committed (what waited for the words after
        it, a sentence's first words, a number, a compound, has waited enough); at
        ``long_pause_s``, or after a hypothesis the guards rejected, the segment closes: its words
        become the prompt and the next buffer starts at ``close_at_s``. A shorter pause, a
        hesitation, keeps the segment and its audio: the next windows hear the sentence whole
        (Whisper decoding the one or two seconds between hesitations, with only the prompt for
        context, lost 5 WER points on conversation, docs/latency.md)."""
        s, c = self._s, self.config
        out: list[CaptionUpdate] = []
        if s.previous_tail and silence_s >= c.hold_s:
            # A number at the end waits for the long pause: the speaker may go on with its digits;
            # so do words guessed in the pause: speech that resumes before it is heard again.
            n = len(s.previous_tail) if silence_s >= c.long_pause_s else self._held_words()
            if n:
                emit = _Emitter(self, emitted_audio_s, emitted_wall_s, out)
                self._commit(emit, s.previous_tail[:n])
                s.previous_tail = s.previous_tail[n:]
                emit.partial(s.previous_tail)
                s.prefix = ()
        if silence_s >= c.long_pause_s and not self.has_uncommitted_text and self.has_pending_text:
            self._close(close_at_s)
        return out

    def _held_words(self) -> int:
        """How many of the words shown a silence of ``hold_s`` commits: whole words, and not
        those guessed in the pause (:func:`_guessed_at_end`)."""
        s = self._s
        heard = len(s.previous_tail) - _guessed_at_end(s.previous_tail, s.tail_heard_s, self.config.hold_min_p)
        return whole_words(s.previous_tail, heard) if heard else 0

    @property
    def needs_closing_window(self) -> bool:
        """Whether the segment must close with a window of its own at the next pause: its last
        hypothesis was rejected (a loop, text on noise) while words are committed in the buffer.
        The words after them are heard again in a window that starts at the committed text
        (:meth:`start_after_committed`): a long window of crosstalk looped as "a real estate
        company, or a real estate company" and took the 13 s of speech in it along."""
        return self._s.rejected and bool(self._s.committed)

    def settles_at_s(self) -> float:
        """The silence at which :meth:`settle` next has something to do (``inf``: nothing open)."""
        s, c = self._s, self.config
        if s.previous_tail:
            return c.hold_s if self._held_words() else c.long_pause_s
        if s.committed or s.partial_text:
            return c.long_pause_s
        return float("inf")

    def prompt_text(self) -> str:
        """Recent committed text that precedes the buffer: the next window's prompt."""
        return "".join(self._s.history).strip()

    @property
    def history(self) -> tuple[str, ...]:
        """The committed words' texts (as decoded) that :meth:`prompt_text` is made of."""
        return tuple(self._s.history)

    def resume(self, history: Iterable[str]) -> None:
        """Take ``history`` as the words committed before this stream's audio: a restarted
        engine's stream then prompts its first windows as its predecessor's would have."""
        self._s.history.extend(history)

    def forced_prefix(self, window_start_s: float) -> tuple[int, ...]:
        """Tokens the next window's text is forced to begin with: those of the committed words at
        the start of the buffer, as the last hypothesis decoded them (timestamps included), for a
        window starting where that hypothesis' did (else none: its timestamps would be off).

        The committed words are never shown again nor changed, so decoding them afresh at every
        update was work for nothing: the buffer grows to 12 s and more, of which the words not yet
        committed are the last second or two. Empty after anything that moves the buffer's start
        (a trim, a close) or where the hypothesis and the committed words did not line up."""
        s = self._s
        if not self.config.forced_prefix or not s.prefix or abs(window_start_s - s.prefix_start_s) > 1e-6:
            return ()
        return s.prefix

    def _keep_prefix(self, hypothesis: Hypothesis, n_committed: int) -> None:
        """After an update whose first ``n_committed`` words are committed words of the buffer
        (and nothing before them): their tokens become the next window's prefix, cut at the last
        of them that ends on a token boundary."""
        s = self._s
        s.prefix = ()
        if not self.config.forced_prefix or not hypothesis.tokens or len(hypothesis.token_ends) != len(hypothesis.words):
            return
        for end in reversed(hypothesis.token_ends[:n_committed]):
            if 0 < end <= self.config.prefix_tokens:
                s.prefix = tuple(hypothesis.tokens[:end])
                s.prefix_start_s = hypothesis.start_s
                return

    def advance_idle(self, to_s: float) -> None:
        """Move the buffer start over audio that holds no speech (nothing open), so a later
        window starts near the speech. Ignored while a segment is open."""
        if not self.has_pending_text and to_s > self._s.buffer_start_s:
            self._s.buffer_start_s = to_s
            self._s.prefix = ()

    # -- updates ----------------------------------------------------------------------------------
    def update(
        self,
        hypothesis: Hypothesis,
        emitted_audio_s: float,
        emitted_wall_s: float,
        close_segment: bool = False,
        close_at_s: float | None = None,
        cut_in_speech: bool = False,
    ) -> list[CaptionUpdate]:
        """Fold in the hypothesis of one update and return the caption changes it causes.

        ``close_segment``: the stream ends (or its model changes); everything the hypothesis holds beyond the committed text is committed, and the
        next buffer starts at ``close_at_s`` (default: the hypothesis' end). ``cut_in_speech``
        (with ``close_segment``): the audio stops inside speech, so the words at its end that it
        does not hold are left out (:func:`heard_before_cut`), shown ones too.
        """
        s = self._s
        out: list[CaptionUpdate] = []
        if hypothesis.language:
            s.language = hypothesis.language
        s.rejected = hypothesis.rejected
        emit = _Emitter(self, emitted_audio_s, emitted_wall_s, out)

        if hypothesis.rejected:
            # The guards say this text is invented: none of it is shown. At a close, the partial
            # already on screen came from a hypothesis that passed them, so it is committed
            # rather than lost; otherwise agreement restarts.
            if close_segment:
                self._commit(emit, s.previous_tail)
                emit.partial([])
                self._close(close_at_s if close_at_s is not None else hypothesis.end_s)
            else:
                s.previous_tail = []
                emit.partial([])
            return out

        words = list(hypothesis.words)
        start_index = self._match_committed(words)
        if close_segment and self._kept_in_window():
            # Whichever of the two matches reaches further: a reworded kept word is matched by
            # the whole alignment, a kept word heard as two ("Americans asked" as "America and",
            # JFK) by the cut in time that _match_committed falls back to.
            start_index = max(start_index, self._match_kept(words))
        # Our committed word i corresponds to words[i - offset] of this hypothesis.
        offset = len(s.committed) - start_index
        tail = words[start_index:]

        if close_segment:
            closing = tail + self._shown_beyond(tail)
            if cut_in_speech:
                # Shown words after the closing window's are judged alike: the partial on screen
                # at a cut ends in the same guesses.
                closing = closing[:heard_before_cut(closing, hypothesis.end_s)]
            self._commit(emit, closing)
            emit.partial([])
            self._close(close_at_s if close_at_s is not None else hypothesis.end_s)
            return out

        if not tail and self._stops_short(words):
            # A long window decoded as its first committed sentence(s) alone (tiny.en, a window
            # fed faster than real time: 15 s from "Stuff it into you, his belly counseled him."
            # on, then end-of-text): it says nothing about the words after the committed text.
            # The partial on screen stays, and the buffer is not trimmed at that sentence's
            # end timestamp, which lay past audio no hypothesis had committed (the rest of the
            # recording was skipped and its shown words lost).
            if s.previous_tail and hypothesis.end_s - s.buffer_start_s >= self.config.max_buffer_s:
                self._commit(emit, s.previous_tail)
                emit.partial([])
                self._close(hypothesis.end_s, keep_segment=True)
            return out

        agreed = whole_words(tail, self._agreed(tail, hypothesis))
        new_commit = tail[:agreed]
        rest = tail[agreed:]
        shown_before = s.previous_tail
        self._commit(emit, new_commit)
        s.previous_tail = rest
        s.tail_heard_s = hypothesis.end_s
        emit.partial(rest)
        if offset == 0:  # the hypothesis begins with the committed words, and only they precede the new ones
            self._keep_prefix(hypothesis, start_index + agreed)
        else:
            s.prefix = ()

        buffer_s = hypothesis.end_s - s.buffer_start_s
        if buffer_s >= self.config.max_buffer_s and not self._trim(words, start_index + agreed, offset, hypothesis) \
                and not self._trim_at_word(rest, shown_before=shown_before):
            # No safe boundary inside a full buffer: commit what is there and restart after it.
            if rest:
                self._commit(emit, rest)
                emit.partial([])
            self._close(hypothesis.end_s, keep_segment=True)
        elif buffer_s >= self.config.trim_after_s:
            # A sentence's end first: a cut inside a sentence leaves its rest only the prompt.
            sentences_only = buffer_s < (self.config.trim_after_s + self.config.max_buffer_s) / 2
            if not self._trim(words, start_index + agreed, offset, hypothesis, sentences_only):
                self._trim_at_word(rest, sentences_only, shown_before)
        return out

    def start_after_committed(self) -> None:
        """A segment closes (a pause, or the stream ends): its last window starts where the
        committed text ends (that text becomes the prompt), when the committed words' times were
        measured (attention DTW).
        A long window that begins with committed sentences is sometimes decoded as those
        sentences alone (tiny.en, 15.6 s from a committed sentence and a pause: "Stuff it into
        you, his belly counseled him." and end-of-text), and the segment's last words were then
        never heard. Times spread over a segment are too rough to cut the audio at.
        With ``close_overlap_s`` the last committed words (those that start within it of the
        committed end) stay in the window, matched against its hypothesis as committed words,
        and the cut falls before them; after a rejected hypothesis (:attr:`needs_closing_window`)
        the window starts at the committed text's end, as unlike the one rejected as it can be."""
        s = self._s
        if not s.committed or any(w.attend_s is None for w in s.committed):
            return
        keep = 0
        if self.config.close_overlap_s > 0 and not s.rejected:
            # Keep the last committed words that start within the overlap (one at least); when
            # that is all of them the window stays where it is (it is short: nothing to cut).
            from_s = s.committed[-1].end_s - self.config.close_overlap_s
            while keep < len(s.committed) and (keep == 0 or s.committed[-1 - keep].start_s >= from_s):
                keep += 1
        out = s.committed[:len(s.committed) - keep]
        if not out:
            return
        s.history.extend(w.text for w in out)
        s.buffer_start_s = max(s.buffer_start_s, out[-1].end_s)
        s.committed = s.committed[len(out):]
        s.prefix = ()

    def flush(self, emitted_audio_s: float, emitted_wall_s: float) -> list[CaptionUpdate]:
        """Commit whatever partial text is left (the stream ended without a final update)."""
        out: list[CaptionUpdate] = []
        emit = _Emitter(self, emitted_audio_s, emitted_wall_s, out)
        if self._s.previous_tail:
            self._commit(emit, self._s.previous_tail)
            emit.partial([])
        self._close(emitted_audio_s)
        return out

    # -- internals ----------------------------------------------------------------------------------
    def _shown_beyond(self, tail: list[Word]) -> list[Word]:
        """Words of the partial on screen that lie after the end of ``tail`` (the closing
        hypothesis beyond the committed text). A closing window is sometimes decoded shorter
        than the one before it (tiny.en ends a 15 s window at its first sentence, then
        end-of-text); its words are committed, and so is the rest of what was shown, which
        would otherwise vanish from the screen at the close. A ``tail`` that is the start of
        the shown words, word for word, stops short of the rest whatever its times say (the
        attention of a last word often runs on over audio the text never reached)."""
        shown = self._s.previous_tail
        if not shown:
            return []
        tail_keys = [w.key for w in tail if w.key]
        shown_keys = [w.key for w in shown if w.key]
        if tail_keys and len(tail_keys) < len(shown_keys) and shown_keys[:len(tail_keys)] == tail_keys:
            reached = 0
            for i, w in enumerate(shown):
                reached += bool(w.key)
                if reached == len(tail_keys):
                    return list(shown[i + 1:])
        heard = [w for w in tail if w.key] or [w for w in self._s.committed if w.key]
        if not heard:
            return [] if tail else list(shown)
        end_s = heard[-1].end_s
        return [w for w in shown if (w.start_s + w.end_s) / 2 > end_s]

    def _stops_short(self, words: list[Word]) -> bool:
        """Whether a hypothesis with nothing beyond the committed text ends well before the
        committed text does: its words stop more than ``match_tolerance_s`` before the end of the
        last committed word (none at all counts as short too, with committed words in the buffer)."""
        committed = self._s.committed
        if not committed:
            return False
        heard = [w for w in words if w.key]
        return not heard or heard[-1].end_s < committed[-1].end_s - self.config.match_tolerance_s

    def _kept_in_window(self) -> bool:
        """Whether the closing window holds committed words on purpose (``close_overlap_s``,
        see :meth:`start_after_committed`): then its hypothesis hears them again, as they were,
        reworded, in part, or alone."""
        committed = self._s.committed
        return self.config.close_overlap_s > 0 and bool(committed) and all(w.attend_s is not None for w in committed)

    def _match_kept(self, words: list[Word]) -> int:
        """Index in ``words`` (a closing hypothesis) where the text beyond the committed words
        kept in its window starts.

        All the kept words are aligned to the start of the hypothesis (a word alignment whose
        substitutions cost more the further apart in time the two words lie, measured times on
        both sides), and the hypothesis' words after it are free: the boundary is where that
        alignment is cheapest. A reworded kept word is thus matched to its rewording, not
        committed again ("sauce." heard twice, "cabbage" heard "cabbages"), and a hypothesis
        that stops within the kept words leaves nothing beyond them (the words shown after them
        are then committed by :meth:`_shown_beyond`); :meth:`_match_committed` matches only the
        last few words and, failing that, cuts by time, which a rewording with other times fools.
        On a tie the boundary lies further on: a word heard where a kept word was is that word."""
        kept = self._s.committed
        n, m = len(words), len(kept)
        keys = [w.key for w in words]
        kkeys = [w.key for w in kept]
        if keys[:m] == kkeys:
            return m

        def substitution(w: Word, k: Word, wkey: str, kkey: str) -> float:
            apart_s = abs((w.start_s + w.end_s) - (k.start_s + k.end_s)) / 2
            return _substitution(wkey, kkey) + min(1.0, max(0.0, apart_s - 0.5))

        # cost[i][j]: words[:i] aligned with kept[:j]; a missing or extra word costs 1.
        cost = [[float(i + j) if i == 0 or j == 0 else 0.0 for j in range(m + 1)] for i in range(n + 1)]
        for i in range(1, n + 1):
            for j in range(1, m + 1):
                cost[i][j] = min(cost[i - 1][j - 1] + substitution(words[i - 1], kept[j - 1], keys[i - 1], kkeys[j - 1]),
                                 cost[i - 1][j] + 1.0, cost[i][j - 1] + 1.0)
        best_i = 0
        for i in range(1, n + 1):
            if cost[i][m] <= cost[best_i][m]:
                best_i = i
        return best_i

    def _agreed(self, tail: list[Word], hypothesis: Hypothesis) -> int:
        """How many words at the start of ``tail`` (the hypothesis beyond the committed text)
        to commit now: LocalAgreement's, those the previous hypothesis ended with too."""
        return _common_prefix(self._s.previous_tail, tail)

    def _commit(self, emit: _Emitter, words: list[Word]) -> None:
        """Show ``words`` as final and keep them as committed (nothing happens for none)."""
        emit.final(words)
        self._s.committed.extend(words)

    def _match_committed(self, words: list[Word]) -> int:
        """Index in ``words`` where the text beyond the committed words starts.

        The committed words still in the buffer are aligned to the start of the new hypothesis
        (a semi-global word alignment: the end of the committed text against any stretch of the
        hypothesis), so a re-heard word, a split or merged word or a changed punctuation does not
        make committed text appear twice, nor new text disappear."""
        committed = self._s.committed
        if not committed:
            return 0
        keys = [w.key for w in words]
        ckeys = [w.key for w in committed]
        n = len(committed)
        if keys[:n] == ckeys:
            return n
        m = min(n, self.config.match_words)
        tail = ckeys[-m:]
        limit = min(len(words), n + m + 2)  # the committed text sits at the start of the buffer
        inf = float("inf")
        # cost[k][i]: aligning tail[:k] so that it ends just before words[i] (free start in words).
        prev = [0.0] * (limit + 1)
        for k in range(1, m + 1):
            cur = [float(k)] + [inf] * limit
            for i in range(1, limit + 1):
                cur[i] = min(prev[i - 1] + _substitution(tail[k - 1], keys[i - 1]), prev[i] + 1.0, cur[i - 1] + 1.0)
            prev = cur
        last_end_s = committed[-1].end_s
        best_i, best_score = None, inf
        for i in range(1, limit + 1):
            if prev[i] > m / 2:
                continue
            distance_s = abs(words[i - 1].end_s - last_end_s)
            # Word times move between hypotheses (a word's DTW end before or after the pause that
            # follows it: "ranch" at 43.2 s, then 44.9 s); the same last words, word for word, are
            # an anchor that twice the tolerance does not make ambiguous.
            exact = prev[i] == 0 and m >= 3
            if distance_s > self.config.match_tolerance_s * (2 if exact else 1):
                continue
            if m < 3 and self._skips_new_speech(words[:i - 1], last_end_s):
                continue
            score = prev[i] + 0.1 * abs(i - n) + 0.2 * distance_s
            if score < best_score:
                best_i, best_score = i, score
        if best_i is not None:
            return best_i
        # No textual anchor: drop what lies in time before the end of the committed text.
        for i, w in enumerate(words):
            if (w.start_s + w.end_s) / 2 >= last_end_s:
                return i
        return len(words)

    def _skips_new_speech(self, before: list[Word], committed_end_s: float) -> bool:
        """Whether an anchor of one or two committed words would drop words heard after the
        committed text: with measured times, a word before the anchor that ends well after the
        committed end is new speech, and the anchor another use of a common word ("thy" matched
        the next line's "thy" 1.4 s on, and "foe, to" before it were never committed)."""
        margin_s = self.config.match_tolerance_s / 3
        return any(w.attend_s is not None and w.key and w.end_s > committed_end_s + margin_s for w in before)

    def _trim(self, words: list[Word], committed_upto: int, offset: int, hypothesis: Hypothesis,
              sentences_only: bool = False) -> bool:
        """Cut the buffer at the last segment end of ``hypothesis`` whose words are all
        committed (with ``sentences_only``, whose last word ends a sentence); return whether a
        cut was made."""
        s = self._s
        cut_index = None
        cut_s = None
        for seg_index, end_s in enumerate(hypothesis.segment_ends_s):
            seg_word_idx = [i for i, w in enumerate(words) if w.segment == seg_index]
            if not seg_word_idx:
                continue
            last = seg_word_idx[-1] + 1
            if last > committed_upto:
                break
            if end_s <= s.buffer_start_s or end_s > hypothesis.end_s:
                continue
            if sentences_only and not ends_sentence(words[last - 1]):
                continue
            cut_index, cut_s = last, end_s
        if cut_index is None or cut_s is None:
            return False
        self._cut(max(0, min(len(s.committed), cut_index + offset)), cut_s)
        return True

    def _cut(self, n_out: int, at_s: float) -> None:
        """Start the buffer at ``at_s``: the first ``n_out`` committed words leave it and become
        prompt history."""
        s = self._s
        s.history.extend(w.text for w in s.committed[:n_out])
        del s.committed[:n_out]
        s.buffer_start_s = at_s
        s.prefix = ()  # its timestamps counted from the old start

    def _trim_at_word(self, following: list[Word], sentences_only: bool = False,
                      shown_before: list[Word] = ()) -> bool:
        """Cut the buffer in a pause after a committed word (with ``sentences_only``, one that
        ends a sentence) where the committed words' times were measured (attention DTW):
        conversation often comes as one long decoder segment with no timestamp to cut at, and a
        full buffer then committed and restarted in the middle of a dictated number. Only where a
        gap of at least ``TRIM_GAP_S`` follows the word (``following``: the words after the
        committed ones), so the next window starts in silence, not on a word it could hear
        reworded; return whether a cut was made. A word's measured start moves from one
        hypothesis to the next: the word after the gap must start after it in the last partial
        shown (``shown_before``) too (a cut where the partial put "niggarding" took it off the
        next window, which never heard it)."""
        s = self._s
        if not s.committed or any(w.attend_s is None for w in s.committed):
            return False
        after = s.committed[1:] + following[:1]  # the word after each committed one
        for stop in range(len(after), 0, -1):
            word = s.committed[stop - 1]
            next_s = after[stop - 1].start_s
            if stop == len(s.committed):  # the word after is still to commit
                next_s = min([next_s] + [w.start_s for w in shown_before if w.key == after[stop - 1].key])
            if (sentences_only and not ends_sentence(word)) or next_s - word.end_s < TRIM_GAP_S:
                continue
            # Near the committed end: a word's measured start may lie later than it begins.
            self._cut(stop, max(s.buffer_start_s, word.end_s + TRIM_GAP_S / 3))
            return True
        return False

    def _close(self, at_s: float, keep_segment: bool = False) -> None:
        s = self._s
        s.rejected = False
        s.history.extend(w.text for w in s.committed)
        s.committed = []
        s.previous_tail = []
        s.partial_text = ""
        s.buffer_start_s = max(s.buffer_start_s, at_s)
        s.prefix = ()
        if not keep_segment:
            s.segment += 1


def _guessed_at_end(words: list[Word], heard_s: float, below_p: float | None) -> int:
    """How many words at the end of ``words`` may be guesses past the speech: each attended past
    the audio its hypothesis held (``heard_s``) and was chosen with probability under
    ``below_p`` (``None``: none are). tiny.en ended "what is the source" with "of count?" in the
    second of breath after it (p 0.50 and 0.32, attention on the padding); the speaker's
    "account?" came 3 s later. A real last word can look the same ("Bye.", a ZIP code on a
    phone line), so such words wait for the long pause; they are not dropped."""
    if below_p is None:
        return 0
    n = 0
    for w in reversed(words):
        if w.attend_s is None or w.confidence is None or w.attend_s <= heard_s or w.confidence >= below_p:
            break
        n += 1
    return n


def _substitution(a: str, b: str) -> float:
    if a == b:
        return 0.0
    if a and b and (a.startswith(b) or b.startswith(a)):
        return 0.5  # one word heard as part of a longer one ("fat" / "fat-mutton")
    return 1.0


def _common_prefix(a: list[Word], b: list[Word]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x.key != y.key:
            break
        n += 1
    return n


def _ms(seconds: float) -> float:
    """Seconds to the millisecond: caption times are read and compared by people and programs,
    and a millisecond is far under any of them (0.9295238095238094 is noise, not precision)."""
    return round(seconds, 3)


def _word_times(words: list[Word], from_s: float) -> tuple[tuple[str, float, float], ...]:
    """Per-word ``(text, start_s, end_s)`` for a caption, only where every word's time was
    measured (``attend_s`` set: the alignment heads' DTW, see
    :func:`captioner.engine.wordtiming.words_with_times`). Times spread over a decoder segment
    by character count are the policy's bookkeeping, not measurements: none are given then.
    Times never go back: not before ``from_s`` (where the stream's last caption ended), nor
    before the word before."""
    if not words or any(w.attend_s is None for w in words):
        return ()
    out = []
    last_s = max(words[0].start_s, from_s)
    for w in words:
        text = w.text.strip()
        if not text:
            continue
        start_s = max(w.start_s, last_s)  # DTW rows are monotonic; keep it so across a split word
        end_s = max(w.end_s, start_s)
        out.append((text, _ms(start_s), _ms(end_s)))
        last_s = end_s
    return tuple(out)


class _Emitter:
    def __init__(self, policy: LocalAgreementPolicy, audio_s: float, wall_s: float, out: list) -> None:
        self.policy = policy
        self.audio_s = _ms(audio_s)
        self.wall_s = _ms(wall_s)
        self.out = out

    def _update(self, kind: str, words: list[Word], text: str) -> CaptionUpdate:
        s = self.policy._s
        if words:
            start_s, end_s = words[0].start_s, words[-1].end_s
        else:
            start_s = end_s = self.audio_s
        # A stream's captions never overlap nor go back: a later hypothesis may place a word a
        # little earlier than the one that was committed before it.
        times = _word_times(words, s.final_end_s)
        start_s = _ms(times[0][1] if times else max(start_s, s.final_end_s))
        end_s = _ms(max(end_s, start_s, times[-1][2] if times else start_s))
        if kind == "final":
            s.final_end_s = end_s
        return CaptionUpdate(
            stream=self.policy.stream,
            kind=kind,  # type: ignore[arg-type]
            text=text,
            start_s=start_s,
            end_s=end_s,
            emitted_audio_s=self.audio_s,
            emitted_wall_s=self.wall_s,
            segment=s.segment,
            language=s.language,
            words=times,
        )

    def final(self, words: list[Word]) -> None:
        words = [w for w in words if w.key or w.text.strip()]
        if not words:
            return
        self.policy.committed_words_total += len(words)
        words = join_dictated_digits(words)
        self.out.append(self._update("final", words, join_words(words)))
        self.policy._s.partial_text = ""  # a final takes the partial off the screen

    def partial(self, words: list[Word]) -> None:
        """Show ``words`` as the stream's provisional text; none: take it back (a ``clear``),
        unless nothing provisional is on show (a final just took it off)."""
        text = join_words(words)
        s = self.policy._s
        if text == s.partial_text:
            return
        s.partial_text = text
        self.out.append(self._update("partial" if text else "clear", words, text))
