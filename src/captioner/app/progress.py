"""Progress of long steps (model conversion, offline transcription) on stderr, for the CLI."""

from __future__ import annotations

import sys

from tqdm import tqdm


class TextProgress:
    """Progress on stderr: a tqdm bar redrawn in place on a terminal, a plain line per stage
    otherwise (logs and pipes stay readable: no carriage returns)."""

    def __init__(self, stream=None, width: int = 30):
        self.stream = stream or sys.stderr
        self.width = width
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_message = None
        self._bar = None

    def __call__(self, message: str, fraction: float) -> None:
        fraction = min(max(float(fraction), 0.0), 1.0)
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
                total=1.0, initial=fraction, desc=message[:60], file=self.stream, leave=True,
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
