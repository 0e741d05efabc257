"""Live captions in a terminal.

On a TTY the bottom of the screen is a live area, one line per stream with an open segment:
its committed words, then the partial words (dim), rewritten in place with ANSI codes as
updates come. When a segment closes (a pause) or its line would overflow, the line scrolls up
as plain committed text and the live area redraws below it. Anywhere else (a pipe, a file)
each committed update is printed as one plain line, ``[stream] text``; partials are not shown.
``label_streams=False`` leaves the ``[stream]`` label out (one file, one stream: it says nothing).
Notes for the person (a detected language, a lost input) go above the live area (:meth:`note`).

Output that cannot be written (``> /dev/full``, a full disk) is a one-line
:class:`~captioner.errors.UserError` (:func:`stdout_failure`); a reader that went away
(``| head -n 2``) raises ``BrokenPipeError``, which the CLI ends quietly. Either way the view
writes nothing more.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass

from captioner.errors import UserError
from captioner.events import CaptionUpdate

_DIM = "\x1b[2m"
_RESET = "\x1b[0m"
_CLEAR_LINE = "\r\x1b[K"
_CLEAR_DOWN = "\x1b[J"


def stdout_failure(error: OSError) -> UserError:
    """Standard output refused the captions (``> /dev/full``, a full disk), as one line. A
    closed pipe is not this: ``BrokenPipeError`` ends the command quietly (``captioner.app.cli``)."""
    return UserError(f"cannot write standard output: {error.strerror or error}")


@dataclass
class _Line:
    segment: int = 0
    committed: str = ""
    partial: str = ""


class TerminalView:
    """Renders caption updates. Called from one thread (the CLI's main loop)."""

    def __init__(self, out, tty: bool | None = None, label_streams: bool = True) -> None:
        self.out = out
        self.tty = out.isatty() if tty is None else tty
        self.label_streams = label_streams
        self._lines: dict[str, _Line] = {}
        self._drawn = 0  # lines of the live area on screen
        self._failed = False  # the output refused a write: nothing more is tried (close, a stop)

    def _write(self, text: str) -> None:
        if self._failed:
            return
        try:
            self.out.write(text)
            self.out.flush()
        except BrokenPipeError:
            self._failed = True
            raise
        except OSError as error:
            self._failed = True
            raise stdout_failure(error) from None

    def _width(self) -> int:
        return max(20, shutil.get_terminal_size((100, 24)).columns - 1)

    def _label(self, stream: str) -> str:
        return f"[{stream}] " if self.label_streams else ""

    def note(self, text: str, err=None) -> None:
        """Print ``text`` as one line on ``err`` (default: stderr). On a TTY the live area is
        taken off the screen first and drawn again below the note, so the two do not mix."""
        err = err if err is not None else sys.stderr
        if self.tty and self._drawn:
            self._write(self._erase_live_area())
            self._drawn = 0
        err.write(text + "\n")
        err.flush()
        if self.tty:
            self._redraw([])

    def _erase_live_area(self) -> str:
        """Codes that move to the first line of the live area and clear it and all below."""
        if not self._drawn:
            return ""
        up = f"\x1b[{self._drawn - 1}A" if self._drawn > 1 else ""
        return up + _CLEAR_LINE + _CLEAR_DOWN

    def show(self, updates: list[CaptionUpdate]) -> None:
        if not updates:
            return
        if not self.tty:
            self._write("".join(f"{self._label(u.stream)}{u.text.strip()}\n" for u in updates
                                if u.kind == "final" and u.text.strip()))
            return
        scrolled: list[str] = []
        width = self._width()
        for u in updates:
            line = self._lines.setdefault(u.stream, _Line(segment=u.segment))
            if u.segment != line.segment:
                if line.committed:
                    scrolled.append(self._label(u.stream) + line.committed)
                line.committed, line.partial, line.segment = "", "", u.segment
            if u.kind == "final":
                text = u.text.strip()
                line.partial = ""  # a final takes the partial off the screen
                line.committed = f"{line.committed} {text}".strip()
                while len(self._label(u.stream)) + len(line.committed) > width:
                    # A long monologue: the full part scrolls, the rest stays live.
                    room = width - len(self._label(u.stream))
                    cut = line.committed.rfind(" ", 0, room)
                    cut = cut if cut > 0 else room
                    scrolled.append(self._label(u.stream) + line.committed[:cut])
                    line.committed = line.committed[cut:].strip()
            else:
                line.partial = u.text.strip()
        self._redraw(scrolled)

    def _redraw(self, scrolled: list[str]) -> None:
        width = self._width()
        parts = [self._erase_live_area()]
        for text in scrolled:
            parts.append(text + "\n")
        live = []
        for stream, line in self._lines.items():
            if not (line.committed or line.partial):
                continue
            label = self._label(stream)
            room = width - len(label) - len(line.committed) - 1
            partial = line.partial
            if len(partial) > room:
                partial = "…" + partial[len(partial) - max(0, room - 1):] if room > 1 else ""
            text = label + line.committed
            if partial:
                text += (" " if line.committed else "") + _DIM + partial + _RESET
            live.append(text)
        parts.append("\n".join(live))
        self._drawn = len(live)
        self._write("".join(parts))

    def close(self) -> None:
        """Scroll whatever is still live as committed text (partials are dropped)."""
        if not self.tty:
            return
        scrolled = [self._label(s) + line.committed for s, line in self._lines.items() if line.committed]
        self._lines.clear()
        self._redraw(scrolled)
        self._drawn = 0
