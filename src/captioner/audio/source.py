"""What every audio source offers the engine: whole 10 ms frames of 16 kHz mono float32.

A source is pulled, never pushed: the engine's audio thread calls :meth:`AudioSource.read`,
so a slow consumer shows up as a growing queue (and, for a live device, as counted drops)
instead of as work done on the capture thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from captioner.events import AudioBlock


@dataclass(frozen=True, slots=True)
class SourceStats:
    """A snapshot of a source's counters.

    ``delivered_frames`` counts 10 ms frames handed out by ``read``; ``dropped_blocks`` counts
    device blocks thrown away because the bounded queue was full (the consumer fell behind);
    ``overflows`` counts blocks the audio driver itself reported as overflowed (samples lost
    before they reached us); ``queue_depth`` is how many blocks wait to be read now.
    """

    delivered_frames: int = 0
    dropped_blocks: int = 0
    overflows: int = 0
    queue_depth: int = 0


@runtime_checkable
class AudioSource(Protocol):
    """A stream of audio, labelled ``stream`` (e.g. "Me", "Meeting", or a file's stem).

    ``start``/``stop`` are called by the thread that owns the pipeline; ``read`` and ``stats``
    may be called from the engine's audio thread while the source runs.
    """

    stream: str

    def start(self) -> None:
        """Begin capturing (or replaying). Raises ``UserError`` when that cannot happen."""

    def stop(self) -> None:
        """Stop and release the device or file; safe to call twice or before ``start``."""

    def read(self, timeout_s: float = 0.0) -> list[AudioBlock]:
        """Everything ready now, as blocks of whole 10 ms frames in sample order.

        Waits up to ``timeout_s`` for the first block when nothing is ready; returns ``[]``
        when nothing came in that time (or the source is exhausted).
        """

    @property
    def exhausted(self) -> bool:
        """True once a finite source has delivered everything (a live device: once it died)."""

    def stats(self) -> SourceStats:
        """Counters so far; cheap, callable from any thread."""
