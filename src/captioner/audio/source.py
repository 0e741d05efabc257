"""What every audio source offers the engine: its audio as captured, pushed into a sink.

A source pushes, from its device's callback or its own thread, :class:`RawChunk`\\ s at its
native rate and, once it will deliver nothing more, one :class:`SourceEnd`. It never resamples
or frames: that happens in one place, :class:`~captioner.audio.ingest.StreamIngest`, on the
consumer's thread. So no thread polls: the consumer blocks on what the sinks fill.

A live device can go away mid-stream (unplugged, its sound server killed) and come back. A
source that can tell, and be opened again, is a :class:`RecoverableSource`: its owner asks
``health()`` a few times a second and, after a loss, ``reopen()`` until the device is back.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True, slots=True)
class RawChunk:
    """Audio as a source captured it: native rate, not yet resampled or framed.

    ``first_sample`` is the index of ``samples[0]`` on the source's own native-rate sample
    clock (0 at ``start``); a jump forward from where the previous chunk ended means audio was
    lost before it reached the consumer. ``capture_ns`` is when the last sample was captured
    (``time.monotonic_ns()``, or the source's injected clock). ``samples`` is float32, ``[n]``
    or ``[n, channels]``, and the source's own copy (never a driver's buffer).
    """

    stream: str
    rate_hz: int
    first_sample: int
    capture_ns: int
    samples: np.ndarray

    @property
    def n_samples(self) -> int:
        return int(self.samples.shape[0])

    @property
    def end_sample(self) -> int:
        """Native index just past the last sample: the next chunk's ``first_sample`` when
        nothing was lost in between."""
        return self.first_sample + self.n_samples


@dataclass(frozen=True, slots=True)
class SourceEnd:
    """The source will deliver nothing more.

    ``error`` is ``""`` for a finite source that reached its end, else one line saying why
    (the device was lost, the file failed to decode).
    """

    stream: str
    error: str = ""


Sink = Callable[[RawChunk | SourceEnd], bool]
"""Takes a source's items; returns False when the item was NOT taken.

A live source's sink must never block (a refused chunk is dropped and counted); a finite
source's sink may block (backpressure), and its False means "the consumer is shutting down".
"""


@dataclass(frozen=True, slots=True)
class SourceStats:
    """A snapshot of a source's counters.

    ``delivered_samples`` counts native-rate samples the sink took; ``dropped_blocks`` counts
    chunks the sink refused (the consumer fell behind); ``overflows`` counts blocks the audio
    driver itself reported as overflowed (samples lost before they reached us);
    ``queue_depth`` is always 0 now that sources keep no queue (kept for the status line).
    """

    delivered_samples: int = 0
    dropped_blocks: int = 0
    overflows: int = 0
    queue_depth: int = 0


@runtime_checkable
class AudioSource(Protocol):
    """A stream of audio, labelled ``stream`` (e.g. "Me", "Meeting", or a file's stem).

    ``start``/``stop`` are called by the thread that owns the pipeline; the sink is called
    from the device callback or the source's own thread; ``stats`` and ``exhausted`` from any
    thread.
    """

    stream: str
    rate_hz: int
    """Native rate of the chunks it delivers."""
    live: bool
    """True for devices (the sink must never block); False for finite replays (the sink may
    block, and nothing is ever dropped)."""

    def start(self, sink: Sink) -> None:
        """Begins delivering into ``sink``; raises ``UserError`` when that cannot happen."""

    def stop(self) -> None:
        """Stops delivering: no sink call happens after it returns. Joins the source's own
        thread, so a sink blocked at that moment must be released (return False) first.
        Safe to call twice or before ``start``."""

    @property
    def exhausted(self) -> bool:
        """True once the :class:`SourceEnd` was delivered."""

    def stats(self) -> SourceStats:
        """Counters so far; cheap, callable from any thread."""


@runtime_checkable
class RecoverableSource(AudioSource, Protocol):
    """A live source whose device may stop and come back (a microphone, a sound server's
    monitor). Both methods are called by the owner's watch thread, never from the sink."""

    def health(self) -> str | None:
        """Why the started source has stopped delivering (one line: the device went away,
        no audio for a second), or ``None`` while it delivers, before ``start`` and after
        ``stop``. Cheap enough to ask a few times a second."""

    def reopen(self) -> RecoverableSource | None:
        """A new, unstarted source with the same label on the same device once the device is
        there again, else ``None``. May take a moment (it asks the system), never long."""


def live_sink_into(inbox: queue.Queue) -> Sink:
    """A sink for live sources (the PortAudio callback, a connection's audio): never waits; False
    when the inbox is full. It holds the inbox only, so one can serve every live source of an
    owner (a server's thousand streams) without a closure each or a cycle through the owner."""
    def live_sink(item: RawChunk | SourceEnd) -> bool:
        try:
            inbox.put_nowait(item)
            return True
        except queue.Full:
            return False
    return live_sink


def replay_sink_into(inbox: queue.Queue, stopping: threading.Event,
                     wait_s: float = 0.1) -> Sink:
    """A sink for a replay thread: waits for room (looking at ``stopping`` every ``wait_s``),
    never drops; False once ``stopping`` is set."""
    def replay_sink(item: RawChunk | SourceEnd) -> bool:
        while not stopping.is_set():
            try:
                inbox.put(item, timeout=wait_s)
                return True
            except queue.Full:
                continue
        return False
    return replay_sink
