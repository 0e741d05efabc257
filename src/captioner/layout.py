"""How captions are laid out for reading: lines, cues and where they break.

One set of rules for every place a caption is read (the app's caption view and overlay,
``listen``, transcript files, SRT and WebVTT, offline and live), after the subtitle style guides
(Netflix Timed Text Style Guide, English: at most 42 characters a line, at most 2 lines, a cue
shown from 5/6 s to 7 s, lines broken after punctuation and before conjunctions and
prepositions; BBC subtitle guidelines: break at the most natural point, keep the lines of a
cue about equal):

- a cue holds at most :data:`MAX_LINES` lines of at most :data:`MAX_LINE_CHARS` characters and
  the speech of at most :data:`MAX_CUE_S`; it is shown for at least :data:`MIN_CUE_S`
  (its end moves into the silence after it, and a cue that follows too soon starts a little
  later: a stream's cues never overlap);
- a cue ends when another speaker (stream, or another labelled speaker of the same stream)
  speaks after it, at a pause after a sentence's end,
  at a long silence, or when it is full; a full cue ends at its most natural break: a sentence's end, then
  a pause, other punctuation, before a conjunction or preposition, last inside a phrase;
- its lines break the same way, and stay about equal in length;
- a word is never split, a hyphenated compound never broken at its hyphen.

:func:`cues` lays out finished captions (files); :class:`LiveLayout` does the same as captions
are committed, giving each cue as soon as no later word can change it (live files, views).
Both give the same cues for the same words.

Standard library only: the engine, the formats and the UI all use it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

MAX_LINE_CHARS = 42
MAX_LINES = 2
MIN_CUE_S = 5 / 6
MAX_CUE_S = 7.0
READING_CHARS_PER_S = 17.0
"""A cue whose speech is over before it can be read stays on into the silence after it: the
guides' reading speed for adult English (Netflix: up to 20 characters a second; BBC: 160-180
words a minute)."""
LONG_SILENCE_S = 1.5
"""A silence this long between two words ends a cue whatever the text: a cue does not stay on
screen over it showing words not yet spoken."""

_SENTENCE_END_RE = re.compile(r"[.?!\u3002\uff01\uff1f][\"'\u201d\u2019)\]]*$")
_CLAUSE_END_RE = re.compile(r"[,;:\u2014\u2013\u3001\uff0c][\"'\u201d\u2019)\]]*$")
_BREAK_BEFORE = frozenset(
    "and but or nor so yet because although though while whereas if unless until when whenever where "
    "whether which who whom whose that than as since after before once to of in on at by for from with "
    "without about into onto over under between through during against among like".split())
"""Words a line or cue may begin with at a natural break (conjunctions, relative pronouns,
prepositions): the guides' "before conjunctions and prepositions"."""

# Costs of a break after a word (lower is more natural).
_COST_SENTENCE = 0.0
_COST_PAUSE = 1.0
_COST_CLAUSE = 2.0
_COST_BEFORE_LINK = 3.0
_COST_INSIDE = 6.0


def ends_sentence(text: str) -> bool:
    """Whether ``text`` (a word, a caption) ends a sentence: ``.?!`` (or their CJK forms), closing
    quotes and brackets after them allowed."""
    return bool(_SENTENCE_END_RE.search(text.strip()))


@dataclass(frozen=True, slots=True)
class Word:
    """A word of a caption: its text, its time, and whether it is glued to the word before it
    (the second part of a compound split at a hyphen: no space between them)."""

    text: str
    start_s: float
    end_s: float
    joined: bool = False
    timed: bool = True
    """Measured (the caption's word times), or spread over the caption by length."""
    provisional: bool = False
    """A partial word a live view shows after the committed ones (it may still change)."""


@dataclass(frozen=True, slots=True)
class Cue:
    """A caption as shown: its lines, when it is shown, whose it is."""

    start_s: float
    end_s: float
    lines: tuple[str, ...]
    stream: str = ""
    language: str = ""
    words: tuple[tuple[str, float, float], ...] = ()
    """``(word, start_s, end_s)`` per word where every word's time was measured; else empty."""
    speaker: str = ""
    """Who said it, where the stream's speakers are labelled ("Speaker 2"); else empty."""

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def prefix_room(label_text: str, speaker: str) -> int:
    """Characters a cue's first line gives up to say whose it is: the stream's label as
    ``label_text`` ("Meeting: ", or "") and the speaker, written "Speaker 2: " alone and
    "Meeting (Speaker 2): " with a stream label (:mod:`captioner.formats`)."""
    if not speaker:
        return len(label_text)
    return len(label_text) + len(speaker) + (3 if label_text else 2)


def words_of(caption: Any, after: Word | None = None) -> list[Word]:
    """The words of a caption (anything with ``text``, ``start_s``, ``end_s`` and optionally
    ``words``), with its measured word times where they spell its text, else its time spread
    over its words by their length. ``after``: the stream's word before it, whose trailing
    hyphen glues the first word on (a compound split between two commits)."""
    text = " ".join(str(caption.text).split())
    if not text:
        return []
    out = spelled(text, getattr(caption, "words", ()) or ())
    if out is None:
        pieces = text.split(" ")
        start_s, end_s = float(caption.start_s), max(float(caption.start_s), float(caption.end_s))
        total = float(sum(max(1, len(p)) for p in pieces))
        out, cursor = [], start_s
        for piece in pieces:
            span = (end_s - start_s) * max(1, len(piece)) / total
            out.append(Word(piece, cursor, cursor + span, timed=False))
            cursor += span
    if after is not None and after.text.endswith("-") and out:
        out[0] = Word(out[0].text, out[0].start_s, out[0].end_s, True, out[0].timed)
    return out


def spelled(text: str, words) -> list[Word] | None:
    """Measured words that spell ``text`` (single spaces), each marked joined where no space
    comes before it; ``None`` when there are none or they do not spell it."""
    if not words:
        return None
    out: list[Word] = []
    at = 0
    for word, start_s, end_s in words:
        word = "".join(str(word).split())
        space = text.startswith(" ", at)
        at += space
        if not word or not text.startswith(word, at):
            return None
        at += len(word)
        out.append(Word(word, float(start_s), float(end_s), joined=bool(out) and not space))
    return out if at == len(text) else None


def join(words: Iterable[Word]) -> str:
    out = []
    for w in words:
        if out and not w.joined:
            out.append(" ")
        out.append(w.text)
    return "".join(out)


def _width(words: list[Word], first: int, stop: int) -> int:
    return sum(len(w.text) for w in words[first:stop]) + sum(1 for w in words[first + 1:stop] if not w.joined)


def _break_cost(before: Word, after: Word, pause_s: float) -> float:
    """How natural a break between ``before`` and ``after`` is (lower is better)."""
    if ends_sentence(before.text):
        return _COST_SENTENCE
    if after.start_s - before.end_s >= pause_s:
        return _COST_PAUSE
    if _CLAUSE_END_RE.search(before.text):
        return _COST_CLAUSE
    if after.text.lower().strip("\"'(\u201c") in _BREAK_BEFORE:
        return _COST_BEFORE_LINK
    return _COST_INSIDE


def break_lines(words: list[Word], width: int = MAX_LINE_CHARS, pause_s: float = 0.5,
                max_lines: int = MAX_LINES) -> list[list[Word]] | None:
    """``words`` in at most ``max_lines`` lines of at most ``width`` characters, broken at the most
    natural point with the lines about equal (a slightly longer second line preferred, as the
    guides' "bottom-heavy" shape); ``None`` when they do not fit. One line when they fit on one."""
    total = _width(words, 0, len(words))
    if total <= width or len(words) <= 1:
        return [list(words)] if total <= width or len(words) == 1 else None
    if max_lines < 2:
        return None
    best, best_cost = None, float("inf")
    for k in range(1, len(words)):
        if words[k].joined:
            continue  # never inside a compound
        a, b = _width(words, 0, k), _width(words, k, len(words))
        if a > width:
            break
        if b > width:
            continue
        imbalance = abs(a - b) / width
        cost = _break_cost(words[k - 1], words[k], pause_s) + 4.0 * imbalance + (0.3 if a > b else 0.0)
        if cost < best_cost:
            best, best_cost = k, cost
    if best is None:
        return None
    return [list(words[:best]), list(words[best:])]


@dataclass
class _Rules:
    pause_s: float
    width: int
    long_silence_s: float

    def fits(self, words: list[Word], first: int, stop: int) -> bool:
        if stop - first <= 1:
            return True
        if words[stop - 1].end_s - words[first].start_s > MAX_CUE_S:
            return False
        return break_lines(words[first:stop], self.width, self.pause_s) is not None

    def must_break(self, before: Word, after: Word) -> bool:
        """A break the cue must end at: a long silence, or a pause after a sentence's end."""
        if after.joined:
            return False
        gap_s = after.start_s - before.end_s
        return gap_s >= self.long_silence_s or (gap_s >= self.pause_s and ends_sentence(before.text))


def _first_cue(words: list[Word], rules: _Rules) -> int | None:
    """How many of ``words`` the first cue takes, or ``None`` while that depends on words still
    to come (the words so far fit in one cue with no break it must end at)."""
    stop = 1
    while stop < len(words):
        if rules.must_break(words[stop - 1], words[stop]):
            return stop
        if not rules.fits(words, 0, stop + 1):
            break
        stop += 1
    else:
        return None
    if rules.must_break(words[stop - 1], words[stop]):
        return stop
    # Full: end at its most natural break, a fuller cue preferred among equals.
    capacity = rules.width * MAX_LINES
    best, best_cost = stop, float("inf")
    for k in range(1, stop + 1):
        if k < len(words) and words[k].joined:
            continue
        fill = _width(words, 0, k) / capacity
        cost = _break_cost(words[k - 1], words[k], rules.pause_s) + 3.0 * (1.0 - fill)
        if cost <= best_cost:
            best, best_cost = k, cost
    return best


@dataclass
class _StreamState:
    words: list[Word] = field(default_factory=list)
    """Words not in a cue yet."""
    last_end_s: float = 0.0
    """Where the stream's last cue ends: the next one starts no earlier."""
    language: str = ""
    speaker: str = ""
    """The speaker of the words not in a cue yet."""


class LiveLayout:
    """Cues made as captions come: :meth:`add` takes committed captions (in order per stream)
    and returns the cues no later word can change; :meth:`flush` the rest. Every stream is laid
    out on its own. ``label``: the text each of a stream's cues begins with (``"Me: "``), which
    takes room on its first line. Captions with a ``speaker`` keep room for it too, and a change
    of speaker within a stream ends the cue. Called from one thread."""

    def __init__(self, pause_s: float = 0.5, width: int = MAX_LINE_CHARS,
                 label: Callable[[str], str] | None = None, long_silence_s: float = LONG_SILENCE_S,
                 speaker_line: bool = False) -> None:
        """``speaker_line``: a cue with a speaker is headed by a line of its own (a terminal,
        where "[lecture.wav (Speaker 2)] " would leave a few characters for the words), not by
        a prefix on its first line."""
        self.pause_s = pause_s
        self.width = width
        self.label = label or (lambda stream: "")
        self.speaker_line = speaker_line
        self.long_silence_s = long_silence_s
        self._streams: dict[str, _StreamState] = {}

    def _rules(self, stream: str) -> _Rules:
        state = self._streams.get(stream)
        speaker = state.speaker if state is not None else ""
        room = 0 if speaker and self.speaker_line else prefix_room(self.label(stream), speaker)
        return _Rules(self.pause_s, self.width - room, self.long_silence_s)

    def add(self, captions: Iterable[Any]) -> list[Cue]:
        out: list[Cue] = []
        for caption in captions:
            if getattr(caption, "kind", "final") != "final":
                continue
            stream = getattr(caption, "stream", "")
            new = words_of(caption)
            if not new:
                continue
            # Another speaker's words after a stream's last ones end its cue: a change of turn.
            for other, state in self._streams.items():
                if other != stream and state.words and state.words[-1].end_s <= new[0].start_s:
                    out += self._take(other, state, final=True)
            state = self._streams.setdefault(stream, _StreamState())
            speaker = getattr(caption, "speaker", "") or ""
            if speaker != state.speaker:
                out += self._take(stream, state, final=True)  # another speaker: a new cue
                state.speaker = speaker
            state.words += words_of(caption, state.words[-1] if state.words else None)
            state.language = getattr(caption, "language", "") or state.language
            out += self._take(stream, state, final=False)
        return out

    def flush(self) -> list[Cue]:
        """The cues of every word still open, in stream order."""
        out: list[Cue] = []
        for stream, state in self._streams.items():
            out += self._take(stream, state, final=True)
        return out

    def close_idle(self, stream: str, no_word_before_s: float) -> list[Cue]:
        """The cue of ``stream``'s open words, when no word of it can start before
        ``no_word_before_s`` (the speaker has been silent since) and a cue must end there (a long
        silence, or a pause after a sentence's end): a reader sees it without waiting for the next
        words. The same cue as those words would close (a later word that starts sooner than
        promised begins a cue of its own)."""
        state = self._streams.get(stream)
        if state is None or not state.words:
            return []
        last = state.words[-1]
        following = Word("", max(no_word_before_s, last.end_s), max(no_word_before_s, last.end_s))
        if not self._rules(stream).must_break(last, following):
            return []
        return self._take(stream, state, final=True)

    def streams(self) -> list[str]:
        """Every stream laid out so far, in the order it first came."""
        return list(self._streams)

    def open_words(self, stream: str) -> list[Word]:
        """The words of ``stream`` that no cue holds yet (the cue being spoken)."""
        state = self._streams.get(stream)
        return list(state.words) if state is not None else []

    def open_speaker(self, stream: str) -> str:
        """The speaker of the cue being spoken on ``stream`` ("" where there is none)."""
        state = self._streams.get(stream)
        return state.speaker if state is not None else ""

    def open_lines(self, stream: str, partial: str = "") -> list[list[Word]]:
        """The lines a live view shows for ``stream`` now: the cue being spoken, its committed
        words and then the ``partial`` text (its words ``provisional``), laid out as a cue of at
        most :data:`MAX_LINES` lines (where they already fill more, the last cue of them)."""
        words = self.open_words(stream)
        end_s = words[-1].end_s if words else 0.0
        words += [Word(w, end_s, end_s, timed=False, provisional=True) for w in partial.split()]
        return _tail_lines(words, self._rules(stream))

    def _take(self, stream: str, state: _StreamState, final: bool) -> list[Cue]:
        rules = self._rules(stream)
        out = []
        while state.words:
            n = _first_cue(state.words, rules)
            if n is None:
                if not final:
                    break
                n = len(state.words)
            out.append(self._cue(stream, state, state.words[:n], state.words[n] if n < len(state.words) else None))
            del state.words[:n]
        return out

    def _cue(self, stream: str, state: _StreamState, words: list[Word], following: Word | None) -> Cue:
        """A cue of ``words``: from its first word (or the stream's last cue's end, if later) to
        its last word's end, and on into the silence after it for :data:`MIN_CUE_S` at least and
        as long as reading it takes (:data:`READING_CHARS_PER_S`), no further than the next
        word's start where that can be kept."""
        rules = self._rules(stream)
        lines = break_lines(words, rules.width, rules.pause_s) or [words]
        texts = tuple(join(line) for line in lines)
        start_s = max(words[0].start_s, state.last_end_s)
        end_s = max(words[-1].end_s, start_s + MIN_CUE_S)
        reading_s = start_s + min(MAX_CUE_S, sum(map(len, texts)) / READING_CHARS_PER_S)
        if reading_s > end_s:
            end_s = reading_s if following is None else max(end_s, min(reading_s, following.start_s))
        # A lone word can span more (times spread over a long segment, not measured): shown 7 s.
        end_s = min(end_s, start_s + MAX_CUE_S)
        state.last_end_s = end_s
        timed = all(w.timed for w in words)
        return Cue(round(start_s, 3), round(end_s, 3), texts, stream, state.language,
                   tuple((w.text, round(w.start_s, 3), round(w.end_s, 3)) for w in words) if timed else (),
                   state.speaker)


def _tail_lines(words: list[Word], rules: _Rules) -> list[list[Word]]:
    """The last cue's lines of ``words`` (for a live view's open text)."""
    first = 0
    while first < len(words):
        n = _first_cue(words[first:], rules)
        if n is None:
            break
        first += n
    rest = words[first:]
    if not rest:
        return []
    return break_lines(rest, rules.width, rules.pause_s) or [rest]


def cues(captions: Iterable[Any], pause_s: float = 0.5, width: int = MAX_LINE_CHARS,
         label: Callable[[str], str] | None = None) -> list[Cue]:
    """Finished captions (committed ``CaptionUpdate``s, offline captions, anything with ``text``,
    ``start_s``, ``end_s`` and optionally ``stream``, ``language``, ``words``) as cues: the same
    cues, in the same order, as :class:`LiveLayout` gives them (a cue when no later word can
    change it; by time within a stream)."""
    layout = LiveLayout(pause_s, width, label)
    return layout.add(captions) + layout.flush()


def check(cue_list: Iterable[Cue], width: int = MAX_LINE_CHARS, label: Callable[[str], str] | None = None) -> list[str]:
    """What a list of cues breaks of the rules, one line each (none: laid out as captions):
    line length and count, cue duration, overlaps and times going back within a stream."""
    label = label or (lambda stream: "")
    problems = []
    last: dict[str, Cue] = {}
    for cue in cue_list:
        where = f"{cue.stream or 'cue'} {cue.start_s:.3f}-{cue.end_s:.3f}"
        room = width - prefix_room(label(cue.stream), cue.speaker)
        if not cue.lines or len(cue.lines) > MAX_LINES:
            problems.append(f"{where}: {len(cue.lines)} lines")
        for line in cue.lines:
            if len(line) > room and " " in line:
                problems.append(f"{where}: a line of {len(line)} characters: {line!r}")
        duration_s = cue.end_s - cue.start_s
        if duration_s < MIN_CUE_S - 1e-3 or duration_s > MAX_CUE_S + 1e-3:
            problems.append(f"{where}: shown {duration_s:.3f} s")
        previous = last.get(cue.stream)
        if previous is not None and cue.start_s < previous.end_s - 1e-6:
            problems.append(f"{where}: overlaps the cue before it ({previous.start_s:.3f}-{previous.end_s:.3f})")
        last[cue.stream] = cue
    return problems
