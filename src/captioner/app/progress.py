"""Progress of long steps (model conversion, offline transcription) on stderr, for the CLI."""

from __future__ import annotations

import os
import sys

from tqdm import tqdm


def _is_terminal(stream) -> bool:
    """A terminal a bar can be drawn on: one that says it has no columns (a pseudo-terminal
    nobody sized, as under `script`) would get only the bar's line ends, so it gets plain lines."""
    if not getattr(stream, "isatty", lambda: False)():
        return False
    try:
        return os.get_terminal_size(stream.fileno()).columns > 0
    except (AttributeError, OSError, ValueError):
        return True  # a terminal whose size cannot be asked: tqdm copes


class TextProgress:
    """Progress on stderr: a tqdm bar redrawn in place on a terminal, a plain line per stage
    otherwise (logs and pipes stay readable: no carriage returns).

    Only work in progress is shown: a report that is complete before anything was under way
    (a model whose graphs are cached, a file transcribed in one step) says nothing. ``leave``:
    whether the bar stays on the terminal once closed (off for a bar that text follows)."""

    def __init__(self, stream=None, width: int = 30, leave: bool = True):
        self.stream = stream or sys.stderr
        self.width = width
        self.leave = leave
        self.tty = _is_terminal(self.stream)
        self._last_message = None
        self._bar = None
        self._busy = False  # a stage is under way: its end is shown too

    def __call__(self, message: str, fraction: float) -> None:
        fraction = min(max(float(fraction), 0.0), 1.0)
        if fraction >= 1.0 and not self._busy:
            return  # done before it began: nothing was being built or read
        self._busy = fraction < 1.0
        new_stage = message != self._last_message
        self._last_message = message
        if not self.tty:
            if new_stage:
                self.stream.write(f"{fraction * 100:3.0f}% {message}\n")
                self.stream.flush()
            return
        if self._bar is None:
            # Made at the first report rather than in __init__: tqdm draws as soon as it exists,
            # and a stage that never reports should leave no empty bar behind.
            self._bar = tqdm(
                total=1.0, initial=fraction, desc=message[:60], file=self.stream, leave=self.leave,
                bar_format=f"[{{bar:{self.width}}}] {{percentage:3.0f}}% {{desc}}", ascii="-#",
                # Redraw at most every 0.1 s, however many small steps arrive in between.
                mininterval=0.1, miniters=0, dynamic_ncols=True,
            )
            return
        if new_stage or fraction >= 1.0:
            # A new stage's name and the end are always shown, never skipped by the rate limit.
            self._bar.set_description_str(message[:60], refresh=False)
            self._bar.n = fraction
            self._bar.refresh()
        else:
            self._bar.update(fraction - self._bar.n)

    def close(self) -> None:
        bar, self._bar = self._bar, None
        if bar is not None:
            bar.close()  # draws the last state and ends the line
