"""Live captions in a terminal, laid out as captions (:mod:`captioner.layout`: cues of at most
two lines of at most 42 characters, broken at a sentence's end, a pause or punctuation first).

On a TTY the bottom of the screen is a live area: for each stream with a cue being spoken, its
lines (committed words, then the partial words dim), rewritten in place with ANSI codes as
updates come. A cue no later word can change scrolls up as plain committed text, the live area
redrawn below it. Anywhere else (a pipe, a file) each such cue is printed as its lines, the
first one labelled ``[stream]``; partials are not shown. A cue also ends once its stream has been
silent long enough that it must (:meth:`~captioner.layout.LiveLayout.close_idle`): the last
sentence before a silence is not held back until someone speaks again. ``label_streams=False`` leaves the
``[stream]`` label out (one file, one stream: it says nothing). Notes for the person (a
detected language, a lost input) go above the live area (:meth:`note`).

Output that cannot be written (``> /dev/full``, a full disk) is a one-line
:class:`~captioner.errors.UserError` (:func:`stdout_failure`); a reader that went away
(``| head -n 2``) raises ``BrokenPipeError``, which the CLI ends quietly. Either way the view
writes nothing more.
"""

from __future__ import annotations

import sys
import time

from captioner import layout
from captioner.errors import UserError
from captioner.events import CaptionUpdate

_DIM = "\x1b[2m"
_RESET = "\x1b[0m"
_CLEAR_LINE = "\r\x1b[K"
_CLEAR_DOWN = "\x1b[J"
UPDATE_LAG_S = 1.5
"""How much of a stream's captured audio may be unheard by the engine without an update saying
so (an update interval, the speech a first update waits for, the step): no word can begin
earlier than this before the audio captured now, when no text is shown as partial."""


def stdout_failure(error: OSError) -> UserError:
    """Standard output refused the captions (``> /dev/full``, a full disk), as one line. A
    closed pipe is not this: ``BrokenPipeError`` ends the command quietly (``captioner.app.cli``)."""
    return UserError(f"cannot write standard output: {error.strerror or error}")


class TerminalView:
    """Renders caption updates. Called from one thread (the CLI's main loop)."""

    def __init__(self, out, tty: bool | None = None, label_streams: bool = True, pause_s: float = 0.5,
                 clock=time.monotonic) -> None:
        """``clock``: seconds, for how far a stream's capture has gone since its last update."""
        self.out = out
        self._clock = clock
        self._heard: dict[str, tuple[float, float]] = {}  # stream -> (audio captured, clock then)
        self.tty = out.isatty() if tty is None else tty
        self.label_streams = label_streams
        self._layout = layout.LiveLayout(pause_s, label=self._label, speaker_line=True)
        self._headed: tuple[str, str] | None = None  # (stream, speaker) the lines last scrolled are under
        self._partials: dict[str, str] = {}
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

    def _label(self, stream: str) -> str:
        return f"[{stream}] " if self.label_streams else ""

    def _speaker_line(self, stream: str, speaker: str) -> str:
        """The line above a speaker's cues: "[Meeting (Speaker 2)]", or "Speaker 2:" where
        streams are not labelled."""
        return f"[{stream} ({speaker})]" if self.label_streams else f"{speaker}:"

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
        """Show ``updates`` (none: only close the cues a silence ended; call it while idle too)."""
        scrolled: list[str] = []
        now = self._clock()
        for u in updates:
            self._heard[u.stream] = (u.emitted_audio_s, now)
            if u.kind == "final":
                self._partials.pop(u.stream, None)  # a final takes the partial off the screen
                scrolled += self._cue_lines(self._layout.add([u]))
            elif u.kind == "partial" and u.text.strip():
                self._partials[u.stream] = u.text.strip()
            else:
                self._partials.pop(u.stream, None)
        scrolled += self._cue_lines(self._idle_cues(now))
        if not scrolled and not updates:
            return
        if not self.tty:
            self._write("".join(line + "\n" for line in scrolled))
            return
        self._redraw(scrolled)

    def _idle_cues(self, now: float) -> list:
        """The cues that the silence of their stream since its last update has ended."""
        out = []
        for stream, (audio_s, at) in self._heard.items():
            if stream not in self._partials and self._layout.open_words(stream):
                out += self._layout.close_idle(stream, audio_s + (now - at) - UPDATE_LAG_S)
        return out

    def _cue_lines(self, cues) -> list[str]:
        """Closed cues as the lines that scroll: the first labelled (where labels are on)."""
        out = []
        for cue in cues:
            if cue.speaker:
                # A speaker's name heads their turn once, on a line of its own.
                if self._headed != (cue.stream, cue.speaker):
                    out.append(self._speaker_line(cue.stream, cue.speaker))
                    self._headed = (cue.stream, cue.speaker)
                out += list(cue.lines)
                continue
            self._headed = None
            out += [(self._label(cue.stream) if n == 0 else "") + line for n, line in enumerate(cue.lines)]
        return out

    def _redraw(self, scrolled: list[str]) -> None:
        parts = [self._erase_live_area()]
        for text in scrolled:
            parts.append(text + "\n")
        live = []
        known = self._layout.streams()
        streams = [s for s in known if self._layout.open_words(s) or s in self._partials]
        streams += [s for s in self._partials if s not in known]
        for stream in streams:
            lines = self._layout.open_lines(stream, self._partials.get(stream, ""))
            speaker = self._layout.open_speaker(stream)
            if speaker and lines and (live or self._headed != (stream, speaker)):
                live.append(self._speaker_line(stream, speaker))
            for n, line in enumerate(lines):
                text = self._label(stream) if n == 0 and not speaker else ""
                dim = False
                for k, word in enumerate(line):
                    sep = "" if not k or word.joined else " "
                    if word.provisional and not dim:
                        text += sep + _DIM
                        sep, dim = "", True
                    text += sep + word.text
                live.append(text + (_RESET if dim else ""))
        parts.append("\n".join(live))
        self._drawn = len(live)
        self._write("".join(parts))

    def close(self) -> None:
        """Scroll (or print) the cues still open as committed text (partials are dropped)."""
        self._partials.clear()
        scrolled = self._cue_lines(self._layout.flush())
        if not self.tty:
            self._write("".join(line + "\n" for line in scrolled))
            return
        self._redraw(scrolled)
        self._drawn = 0
