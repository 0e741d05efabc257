"""Words and hypotheses: what a recognizer hands the streaming policy, and the pure helpers on them.

A :class:`Hypothesis` is one window's decoded text as timed words (:class:`Word`): the
recognizer's output (:mod:`captioner.engine.recognizer`). The helpers compare words as a reader
would, split decoder segments into words, join a dictated number and judge the words at a cut.
Pure Python: no model, no clock, no state.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass
from typing import NamedTuple

from captioner.layout import ends_sentence as _ends_sentence


class Word(NamedTuple):
    """One word of a hypothesis; times are seconds of the stream's clock. A named tuple, not a
    frozen dataclass: every update makes one per word of every hypothesis, and a frozen
    dataclass's ``__init__`` costs several times as much."""

    text: str
    start_s: float
    end_s: float
    segment: int = 0
    """Index of the decoder segment (timestamp pair) the word came from, within its hypothesis."""
    attend_s: float | None = None
    """Latest stream time the alignment heads attended to while the word's tokens were chosen
    (``None``: the recognizer gave no attention). Past the end of the audio heard means the
    model was guessing beyond it."""
    confidence: float | None = None
    """The probability the decoder gave the word's least likely token (``None``: not known)."""

    @property
    def key(self) -> str:
        return normalize_word(self.text)


@dataclass(frozen=True, slots=True)
class Hypothesis:
    """What the model heard in the buffer ``[start_s, end_s)`` on one update.

    ``segment_ends_s`` holds, per decoder segment, its end time (seconds of the stream's clock);
    a segment that the decoder closed with a timestamp is a safe place to trim the buffer.
    ``rejected`` is the guards' verdict (no speech, repetition loop, compression ratio):
    such a hypothesis is never shown.
    """

    words: tuple[Word, ...]
    start_s: float
    end_s: float
    segment_ends_s: tuple[float, ...] = ()
    rejected: bool = False
    reason: str = ""
    language: str = ""
    tokens: tuple[int, ...] = ()
    """The window's decoded tokens (timestamps relative to ``start_s``), where the recognizer has
    them: what a forced prefix is cut from (:meth:`LocalAgreementPolicy.forced_prefix`)."""
    token_ends: tuple[int, ...] = ()
    """Per word of ``words`` (where ``tokens`` are given): how many of ``tokens`` run up to the
    end of that word, or -1 where the word ends inside a token."""

    @property
    def text(self) -> str:
        return join_words(self.words)


_PUNCT_RE = re.compile(r"[^\w']+", re.UNICODE)


@functools.lru_cache(maxsize=1 << 16)
def normalize_word(text: str) -> str:
    """Compare words the way a reader would: case, punctuation and accents-as-composed ignored.

    Cached: every update compares a stream's words again, hundreds of streams' on a GPU, and a
    stream's words repeat from update to update."""
    text = unicodedata.normalize("NFKC", text).lower().replace("\u2019", "'")
    return _PUNCT_RE.sub("", text).strip("'")


def join_words(words) -> str:
    return "".join(w.text for w in words).strip()


def ends_sentence(word: Word) -> bool:
    """Whether ``word`` ends a sentence (``.?!``, closing quotes after them allowed)."""
    return _ends_sentence(word.text)


_DIGIT_RE = re.compile(r"\d")
_NUMBER_WORDS = frozenset(
    "zero oh one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty "
    "ninety hundred thousand million double triple".split())


def is_number(word: Word) -> bool:
    """Whether ``word`` is (part of) a spoken number: digits, or a number's name."""
    return bool(_DIGIT_RE.search(word.text)) or normalize_word(word.text) in _NUMBER_WORDS


def whole_words(words: list[Word], n: int) -> int:
    """The most words of ``words[:n]`` that end at the end of a word as the reader sees it, so a
    commit of them never splits one: the piece after them starts a new word (a leading space),
    and a number is not followed by more of it (Whisper writes a spoken "seven zero zero two
    three" as "7-00", "700 two three" or "70023" depending on what it has heard around it, so a
    zip code or an account number dictated digit by digit is committed whole). At the end of
    ``words`` (nothing heard after it yet) a piece that ends with a hyphen or is a number may
    still be continued, and waits."""
    while n > 0:
        last = words[n - 1]
        if n < len(words):
            after = words[n]
            if after.text[:1].isspace() and not (is_number(last) and is_number(after)):
                return n
        elif not last.text.strip().endswith("-") and not is_number(last):
            return n
        n -= 1
    return 0


DICTATED_MIN_DIGITS = 4
"""A run of this many single digits is a dictated number (a PIN, a zip code, a phone or account
number); counting "1, 2, 3" is left as it is."""
_DIGIT_PIECE = re.compile(r"\s*(\d)([,-]?)")
_LAST_DIGIT_PIECE = re.compile(r"\s*(\d)([.,?!;:]?)")


def join_dictated_digits(words: list[Word]) -> list[Word]:
    """``words`` with each run of at least :data:`DICTATED_MIN_DIGITS` single digits, apart by
    spaces, commas or hyphens ("7, 0, 0, 2, 3."), written as one number ("70023."): the way
    Whisper writes a dictated number when its window holds the whole of it and what follows,
    as offline. A live window that ends between the digits hears each as a number of its own."""
    out: list[Word] = []
    i = 0
    while i < len(words):
        j = i
        while j < len(words) and _DIGIT_PIECE.fullmatch(words[j].text):
            j += 1
        last = j if j < len(words) and _LAST_DIGIT_PIECE.fullmatch(words[j].text) else j - 1
        if last - i + 1 < DICTATED_MIN_DIGITS:
            out.append(words[i])
            i += 1
            continue
        run = words[i:last + 1]
        digits = "".join(_DIGIT_PIECE.fullmatch(w.text).group(1) for w in run[:-1])
        tail = _LAST_DIGIT_PIECE.fullmatch(run[-1].text)
        lead = run[0].text[:len(run[0].text) - len(run[0].text.lstrip())]
        attends = [w.attend_s for w in run if w.attend_s is not None]
        sure = [w.confidence for w in run if w.confidence is not None]
        out.append(Word(lead + digits + tail.group(1) + tail.group(2), run[0].start_s, run[-1].end_s, run[0].segment,
                        max(attends) if len(attends) == len(run) else None, min(sure) if sure else None))
        i = last + 1
    return out


WORD_PIECES = re.compile(r"\s*[^\s-]+-*|\s*-+")
"""How a segment's text splits into words (hyphenated compounds into their parts)."""


def words_from_segments(segments, window_start_s: float = 0.0) -> tuple[list[Word], list[float]]:
    """Split decoder segments ``(start_s, end_s, text)`` (times relative to the window) into
    words with times on the stream's clock.

    Whisper gives times per segment only; word times are spread over the segment in proportion
    to their length in characters, which is close enough for trimming and de-duplication (the
    policy never trims inside a segment). Word texts keep their leading space, as the tokenizer
    produces them, so that joining them restores the text exactly.
    """
    words: list[Word] = []
    ends: list[float] = []
    for index, (start_s, end_s, text) in enumerate(segments):
        start_s = window_start_s + float(start_s)
        end_s = max(start_s, window_start_s + float(end_s))
        # Hyphenated compounds count as several words: Whisper writes "fat-mutton" one time
        # and "fat mutton" the next.
        pieces = WORD_PIECES.findall(text)
        if not pieces:
            ends.append(end_s)
            continue
        if not pieces[0].startswith(" "):
            pieces[0] = " " + pieces[0]
        weights = [max(1, len(p.strip())) for p in pieces]
        total = float(sum(weights))
        cursor = start_s
        for piece, weight in zip(pieces, weights):
            span = (end_s - start_s) * weight / total
            words.append(Word(piece, cursor, cursor + span, index))
            cursor += span
        ends.append(end_s)
    return words, ends


CUT_WORD_S = 0.12
"""At a cut inside speech: a last word with less audio of its own than this before the cut, that
runs up to it (ends within ``CUT_NEAR_S``), is a word's first sound heard as whatever fits it."""
CUT_NEAR_S = 0.1


def heard_before_cut(words: list[Word], end_s: float) -> int:
    """How many of ``words`` (a closing hypothesis; the stream's audio was cut off inside speech
    at ``end_s``) the audio holds. Not held: the last words that the alignment gave no audio of
    their own, Whisper's guesses at what follows the cut ("It was not so much" decoded as "... so
    much to me.", a cut inside "the" as "the fact that"), and a last word with only the sliver
    of audio before the cut ("gr" heard as "group"). Judged only where the words' times were
    measured (the alignment heads' DTW): times spread over a segment say nothing of it."""
    n = len(words)
    while n > 0:
        w = words[n - 1]
        if w.attend_s is None:
            break
        own_s = min(w.end_s, end_s) - w.start_s  # 0: the DTW path gave it no frame (20 ms) of its own
        if own_s >= 0.01 and (own_s >= CUT_WORD_S or w.end_s < end_s - CUT_NEAR_S):
            break
        n -= 1
    return n
