"""Caption files: plain text, SubRip (SRT), WebVTT and JSON Lines.

Standard library only, so the CLI, the live engine and the GUI can all save captions with the
same code. A caption's text may be anything a model or a user produced: several lines, blank
lines, ``-->``, ``<``/``&``. Those would end or corrupt a cue in SRT/WebVTT, so the subtitle
writers make each cue's text safe (see ``cue_lines``) while plain text and JSON Lines keep it
as it is.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TextIO

__all__ = [
    "Caption",
    "CaptionStreamWriter",
    "FORMATS",
    "captions_from_updates",
    "check_writable",
    "cue_lines",
    "format_timestamp",
    "laid_out",
    "render",
    "write_captions",
    "write_jsonl",
    "write_srt",
    "write_txt",
    "write_file_atomically",
    "write_vtt",
]


@dataclass(frozen=True, slots=True)
class Caption:
    """A piece of text and the audio it covers, in seconds of its stream's clock."""

    start_s: float
    end_s: float
    text: str
    stream: str = ""
    language: str = ""
    words: tuple[tuple[str, float, float], ...] = ()
    """``(word, start_s, end_s)`` per word of ``text`` where they were measured (a live
    ``CaptionUpdate``'s ``words``); empty otherwise. SRT cues then take their times from the
    words, WebVTT cues carry a timestamp before each word, JSON Lines a ``words`` list."""
    speaker: str = ""
    """Who said it ("Speaker 2") where speakers are labelled: text lines and SRT cues begin with
    ``Speaker 2: ``, a WebVTT cue is a voice span ``<v Speaker 2>``, JSON Lines has ``speaker``."""

    def to_json_dict(self) -> dict[str, Any]:
        """The same keys as a live ``CaptionUpdate``; an offline caption is final and has no
        emission times, so those are ``None``."""
        extra = {"speaker": self.speaker} if self.speaker else {}
        return {
            "stream": self.stream,
            "kind": "final",
            "text": self.text,
            "start_s": round(float(self.start_s), 3),
            "end_s": round(float(self.end_s), 3),
            "emitted_audio_s": None,
            "emitted_wall_s": None,
            "language": self.language,
            "words": [[w, round(float(a), 3), round(float(b), 3)] for w, a, b in self.words],
            **extra,
        }


def captions_from_updates(updates: Iterable[Any]) -> list[Caption]:
    """The final captions among live updates (``CaptionUpdate`` or anything with the same
    attributes), in order; partial updates are provisional and are left out."""
    return [
        Caption(u.start_s, u.end_s, u.text, getattr(u, "stream", ""), getattr(u, "language", ""),
                tuple(getattr(u, "words", ()) or ()), getattr(u, "speaker", "") or "")
        for u in updates
        if getattr(u, "kind", "final") == "final"
    ]


def _spelled(caption: Caption) -> list[tuple[str, str, float, float]] | None:
    """``(separator, word, start_s, end_s)`` per word of ``caption``, the separators (" " or "",
    after a hyphen) such that joining them gives the caption's text with its runs of white
    space made one; ``None`` when it has no words or they do not spell its text."""
    from captioner.layout import spelled

    words = spelled(" ".join(caption.text.split()), caption.words)
    if words is None:
        return None
    return [("" if w.joined or not n else " ", w.text, w.start_s, w.end_s) for n, w in enumerate(words)]


def _to_ms(seconds: float) -> int:
    if seconds != seconds:  # NaN
        raise ValueError("timestamp is NaN")
    return max(0, int(round(float(seconds) * 1000.0)))


def format_timestamp(seconds: float, *, decimal_marker: str = ".", always_include_hours: bool = True) -> str:
    """``HH:MM:SS.mmm`` (hours grow past 99 rather than wrap; negative times clamp to 0).

    SRT wants ``decimal_marker=","``; WebVTT accepts ``MM:SS.mmm`` too when
    ``always_include_hours`` is false and the time is under an hour.
    """
    total_ms = _to_ms(seconds)
    hours, rest_ms = divmod(total_ms, 3_600_000)
    minutes, rest_ms = divmod(rest_ms, 60_000)
    secs, ms = divmod(rest_ms, 1000)
    clock = f"{minutes:02d}:{secs:02d}{decimal_marker}{ms:03d}"
    if always_include_hours or hours:
        clock = f"{hours:02d}:{clock}"
    return clock


# Any run of two or more hyphens followed by ">" reads as a cue timing arrow to SRT and WebVTT
# parsers; one hyphen keeps the meaning and cannot.
_ARROW = re.compile(r"-{2,}>")


def cue_lines(text: str) -> list[str]:
    """The lines of ``text`` as a subtitle cue can hold them: no blank lines (a blank line ends
    a cue), no ``-->``, no stray whitespace, line breaks of any convention kept as lines."""
    lines = []
    for line in text.splitlines():
        line = " ".join(_ARROW.sub("->", line).split())
        if line:
            lines.append(line)
    return lines


def _vtt_escape(line: str) -> str:
    # WebVTT cue text is markup: a bare "<" or "&" would start a tag or an entity.
    return line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cue_times_ms(caption: Caption) -> tuple[int, int]:
    words = getattr(caption, "words", ())
    if words:  # measured word times: the cue shows from its first word to the end of its last
        start_ms, end_ms = _to_ms(words[0][1]), _to_ms(max(w[2] for w in words))
    else:
        start_ms, end_ms = _to_ms(caption.start_s), _to_ms(caption.end_s)
    # Parsers drop a cue whose end is not after its start; give such a cue 1 ms.
    return start_ms, max(end_ms, start_ms + 1)


def _vtt_word_lines(caption: Caption, start_ms: int, end_ms: int) -> list[str] | None:
    """The cue's lines with a WebVTT timestamp tag (``<00:00:01.200>``) before each word after the
    first, where the word starts (karaoke-style: a player shows each word from its time on);
    ``None`` when the words do not spell the caption's text (then the text is written plain).
    A tag must lie strictly inside the cue and after the previous one; a word whose time does
    not is written without one (it shows with the word before). The caption's line breaks stay."""
    spelled = _spelled(caption)
    if spelled is None:
        return None
    line_ends, at = [], 0
    for line in cue_lines(caption.text):  # where each line ends, counted in words
        at += len(line.split())
        line_ends.append(at)
    lines: list[str] = []
    parts: list[str] = []
    last_ms = start_ms
    words_seen = 0
    for n, (sep, word, word_start_s, _) in enumerate(spelled):
        at_ms = _to_ms(word_start_s)
        tag = ""
        if n and last_ms < at_ms < end_ms:
            tag = f"<{format_timestamp(at_ms / 1000)}>"
            last_ms = at_ms
        parts.append((sep if parts else "") + tag + _vtt_escape(_ARROW.sub("->", word)))
        words_seen += bool(sep) or n == 0
        if words_seen in line_ends and (n + 1 == len(spelled) or spelled[n + 1][0]):
            lines.append("".join(parts))
            parts = []
    if parts:
        lines.append("".join(parts))
    return lines


def _label_streams(captions: list[Caption], label_streams: bool | None) -> bool:
    if label_streams is None:
        return len({c.stream for c in captions}) > 1
    return label_streams


def _who(caption: Caption, label: bool) -> str:
    """Whose the caption is, as its cue says: the stream (when streams are labelled), the
    speaker (when there is one: "Speaker 2"), or both ("Meeting (Speaker 2)"); "" for neither.
    :func:`captioner.layout.prefix_room` keeps room for exactly this."""
    stream = caption.stream if label else ""
    speaker = getattr(caption, "speaker", "")
    if stream and speaker:
        return f"{stream} ({speaker})"
    return stream or speaker


def _prefixed(caption: Caption, lines: list[str], label: bool) -> list[str]:
    who = _who(caption, label)
    if who and lines:
        lines = [f"{who}: {lines[0]}", *lines[1:]]
    return lines


def _txt_line(caption: Caption, label: bool) -> str:
    """The caption's lines as plain text (a laid-out cue's line breaks kept), "" when it has no
    words."""
    lines = _prefixed(caption, cue_lines(caption.text), label)
    return "".join(line + "\n" for line in lines)


def _srt_cue(caption: Caption, label: bool, number: int) -> str:
    """Cue ``number`` of a SubRip file, "" when the caption has no words."""
    lines = _prefixed(caption, cue_lines(caption.text), label)
    if not lines:
        return ""
    start_ms, end_ms = _cue_times_ms(caption)
    timing = (
        f"{format_timestamp(start_ms / 1000, decimal_marker=',')} --> "
        f"{format_timestamp(end_ms / 1000, decimal_marker=',')}"
    )
    return "\n".join([str(number), timing, *lines]) + "\n"


def _vtt_cue(caption: Caption, label: bool) -> str:
    """One WebVTT cue, "" when the caption has no words."""
    lines = [_vtt_escape(line) for line in cue_lines(caption.text)]
    if not lines:
        return ""
    start_ms, end_ms = _cue_times_ms(caption)
    timed = _vtt_word_lines(caption, start_ms, end_ms) if getattr(caption, "words", ()) else None
    if timed is not None:
        lines = timed
    who = _who(caption, label)
    if who:
        voice = " ".join(_vtt_escape(who).split())
        lines[0] = f"<v {voice}>{lines[0]}"
    timing = f"{format_timestamp(start_ms / 1000)} --> {format_timestamp(end_ms / 1000)}"
    return "\n".join([timing, *lines]) + "\n"


_VTT_HEADER = "WEBVTT\n"

# Cues of SRT and WebVTT are separated by one blank line (the header counts as a block).
_CUE_SEPARATOR = "\n"


def render_txt(captions: Iterable[Caption], *, label_streams: bool | None = None) -> str:
    """Each caption's lines, one after the other; ``stream: `` in front of a caption's first
    line when the captions come from more than one stream (or ``label_streams`` says so), and
    its speaker where it has one (``Speaker 2: ``)."""
    captions = list(captions)
    label = _label_streams(captions, label_streams)
    return "".join(_txt_line(caption, label) for caption in captions)


def render_srt(captions: Iterable[Caption], *, label_streams: bool | None = None) -> str:
    """SubRip: numbered cues from 1, ``HH:MM:SS,mmm`` times; empty captions are skipped."""
    captions = list(captions)
    label = _label_streams(captions, label_streams)
    blocks: list[str] = []
    for caption in captions:
        cue = _srt_cue(caption, label, len(blocks) + 1)
        if cue:
            blocks.append(cue)
    return _CUE_SEPARATOR.join(blocks)


def render_vtt(captions: Iterable[Caption], *, label_streams: bool | None = None) -> str:
    """WebVTT: header, cues with ``HH:MM:SS.mmm`` times, text escaped as cue markup; the
    stream goes into a voice span (``<v Me>``) when streams are labelled, and so does a
    caption's speaker (``<v Speaker 2>``)."""
    captions = list(captions)
    label = _label_streams(captions, label_streams)
    cues = [cue for cue in (_vtt_cue(caption, label) for caption in captions) if cue]
    return _CUE_SEPARATOR.join([_VTT_HEADER, *cues])


def render_jsonl(items: Iterable[Any], *, label_streams: bool | None = None) -> str:
    """One JSON object per line: a ``Caption``'s or a live ``CaptionUpdate``'s
    ``to_json_dict()`` (stream, kind, text, start_s, end_s, emitted_audio_s, emitted_wall_s,
    ...). Text is kept exactly, non-ASCII unescaped; every record names its stream, so
    ``label_streams`` changes nothing here."""
    return "".join(json.dumps(item.to_json_dict(), ensure_ascii=False) + "\n" for item in items)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _temp_beside(target: str) -> tuple[int, str]:
    """A new, empty file in ``target``'s folder (so a rename onto ``target`` is atomic), made
    with the usual permissions (0o666 less the umask), and its path."""
    folder, name = os.path.split(target)
    while True:
        temp = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), temp
        except FileExistsError:
            continue


def _special_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` exists and is not a regular file (``/dev/full``, ``/dev/stdout``, a
    FIFO): written in place, since a rename would put a plain file where the device was."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return False


def check_writable(path: str | os.PathLike) -> None:
    """Raise the ``OSError`` that :func:`write_file_atomically` would meet at ``path`` (no
    permission, a read-only or full disk, a folder that takes no new files such as ``/proc``),
    without touching ``path`` itself: one byte is written to a new file beside it, then removed.
    A special file (a device, a FIFO) is only checked for write permission."""
    if _special_file(path):
        if not os.access(path, os.W_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return
    fd, temp = _temp_beside(os.path.realpath(path))
    try:
        _write_all(fd, b"\n")  # a full disk takes an empty file but not a byte
    finally:
        os.close(fd)
        os.unlink(temp)


def write_file_atomically(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8, "\n" line ends) to ``path`` whole or not at all: into a new file
    beside it, fsync'ed, then renamed over ``path``. A failure (a full disk, Ctrl-C) removes the
    new file and leaves ``path`` as it was: never a 0-byte or half-written file. A symlink stays
    a link (its target is replaced); an existing file keeps its permission bits; a special file
    (``/dev/full``, a FIFO) is written in place."""
    data = text.encode("utf-8")
    if _special_file(path):
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        return
    target = os.path.realpath(path)
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = None
    fd, temp = _temp_beside(target)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        _write_all(fd, data)
        os.fsync(fd)  # the data on disk before the name points at it: a crash leaves old or new
        os.close(fd)
        fd = -1
        os.replace(temp, target)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        os.unlink(temp)
        raise
    _fsync_folder(os.path.dirname(target))


def _fsync_folder(folder: str) -> None:
    # Makes the rename itself durable; a file system that cannot fsync a folder still renamed.
    try:
        fd = os.open(folder or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_text(text: str, out: str | os.PathLike | TextIO) -> None:
    if isinstance(out, (str, os.PathLike)):
        write_file_atomically(out, text)
    else:
        out.write(text)


def _writer(render_fn: Callable[..., str]) -> Callable[..., None]:
    def write(captions: Iterable[Any], out: str | os.PathLike | TextIO, **options: Any) -> None:
        _write_text(render_fn(captions, **options), out)

    write.__name__ = render_fn.__name__.replace("render_", "write_")
    write.__doc__ = f"Write ``{render_fn.__name__}(captions)`` to a path or an open text file."
    return write


write_txt = _writer(render_txt)
write_srt = _writer(render_srt)
write_vtt = _writer(render_vtt)
write_jsonl = _writer(render_jsonl)

FORMATS: dict[str, Callable[..., None]] = {
    "txt": write_txt,
    "srt": write_srt,
    "vtt": write_vtt,
    "jsonl": write_jsonl,
}
"""Format name (also the usual file suffix) -> writer."""

_RENDERERS = {"txt": render_txt, "srt": render_srt, "vtt": render_vtt, "jsonl": render_jsonl}


def render(captions: Iterable[Any], fmt: str, **options: Any) -> str:
    """The file contents for ``fmt`` (one of ``FORMATS``)."""
    try:
        render_fn = _RENDERERS[fmt]
    except KeyError:
        raise ValueError(f"unknown caption format {fmt!r}; choose one of {', '.join(FORMATS)}") from None
    return render_fn(captions, **options)


def write_captions(captions: Iterable[Any], out: str | os.PathLike | TextIO, fmt: str, **options: Any) -> None:
    """Write captions in ``fmt`` to a path (whole or not at all: :func:`write_file_atomically`)
    or an open text file."""
    _write_text(render(captions, fmt, **options), out)


def laid_out(captions: Iterable[Any], pause_s: float, *, label_streams: bool = False) -> list[Caption]:
    """Committed captions (live updates or offline captions) as cues laid out for reading
    (:mod:`captioner.layout`: lines of at most 42 characters, 2 lines a cue, 0.83-7 s a cue,
    broken at sentences, pauses and punctuation first), as ``Caption``s whose text holds the
    cue's lines. ``label_streams``: each cue's first line begins with its stream's name, which
    takes room on it."""
    from captioner.layout import cues

    label = (lambda stream: f"{stream}: " if stream else "") if label_streams else None
    return [_caption_of(cue) for cue in cues(captions_from_updates(captions), pause_s, label=label)]


def _caption_of(cue) -> Caption:
    return Caption(cue.start_s, cue.end_s, cue.text, cue.stream, cue.language, cue.words, cue.speaker)


class CaptionStreamWriter:
    """Writes captions to an open text file while a live session makes them, flushed as they
    come: a reader (a terminal, a pipe, a file being followed) sees them as they are committed.

    Text, SRT and WebVTT get cues laid out for reading (:func:`laid_out`), each written once no
    later word can change it, so at most a cue behind what is committed; :meth:`finish` writes the
    last. What it writes in the end is exactly what :func:`render` makes of :func:`laid_out` of
    the same captions at once: the WebVTT header comes first, before any cue; SRT cues are
    numbered on. ``jsonl`` writes every item it is given (live partial updates too) as it is.
    ``label_streams`` must be decided up front (a stream may appear only later). Called from one
    thread.
    """

    def __init__(self, out: TextIO, fmt: str, *, label_streams: bool = False, pause_s: float = 0.5) -> None:
        from captioner.layout import LiveLayout

        if fmt not in _RENDERERS:
            raise ValueError(f"unknown caption format {fmt!r}; choose one of {', '.join(FORMATS)}")
        self.out = out
        self.fmt = fmt
        self.label_streams = label_streams
        self.cues = 0
        """Cues written so far (JSON Lines: items)."""
        label = (lambda stream: f"{stream}: " if stream else "") if label_streams else None
        self._layout = LiveLayout(pause_s, label=label)
        if fmt == "vtt":
            self._emit(_VTT_HEADER)

    def write(self, items: Iterable[Any]) -> None:
        """Append ``items`` (``Caption``s or live ``CaptionUpdate``s) and flush."""
        if self.fmt == "jsonl":
            items = list(items)
            self._emit(render_jsonl(items))
            self.cues += len(items)
            return
        self._write_cues(self._layout.add(captions_from_updates(items)))

    def finish(self) -> None:
        """Write the cues still open (the end of the session)."""
        if self.fmt != "jsonl":
            self._write_cues(self._layout.flush())

    def _write_cues(self, cues) -> None:
        pieces = []
        written = self.cues
        for caption in map(_caption_of, cues):
            if self.fmt == "txt":
                cue = _txt_line(caption, self.label_streams)
            else:
                cue = (_srt_cue(caption, self.label_streams, written + 1) if self.fmt == "srt"
                       else _vtt_cue(caption, self.label_streams))
                # SRT's first cue opens the file; every later cue, and every WebVTT cue (the
                # header is a block too), follows a blank line.
                if cue and (written > 0 or self.fmt == "vtt"):
                    cue = _CUE_SEPARATOR + cue
            if cue:
                pieces.append(cue)
                written += 1
        self._emit("".join(pieces))
        self.cues = written

    def _emit(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.out.flush()


# Callers that need a string first (e.g. a clipboard copy in the GUI) use the renderers.
__all__ += ["render_jsonl", "render_srt", "render_txt", "render_vtt"]
