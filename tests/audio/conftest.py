"""Helpers shared by the source tests: a sink that collects what a source delivers, and the one
conversion to 16 kHz frames (StreamIngest) applied to what was collected."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from captioner.audio.ingest import StreamIngest
from captioner.audio.source import RawChunk, SourceEnd
from captioner.events import NS_PER_S


class Collector:
    """A sink that appends every item to ``items``; called from the source's thread, read from
    the test's. ``take`` is what it answers (False: a refusing sink, a consumer shutting down);
    ``limit`` makes it refuse every chunk after that many were taken."""

    def __init__(self, take: bool = True, limit: int | None = None):
        self.take = take
        self.limit = limit
        self.items: list[RawChunk | SourceEnd] = []
        self.calls = 0
        self.n_chunks = 0
        self.threads: set[str] = set()
        self._changed = threading.Condition()

    def __call__(self, item) -> bool:
        with self._changed:
            self.calls += 1
            self.threads.add(threading.current_thread().name)
            is_chunk = isinstance(item, RawChunk)
            taken = self.take and (self.limit is None or not is_chunk or self.n_chunks < self.limit)
            if taken:
                self.items.append(item)
                self.n_chunks += is_chunk
            self._changed.notify_all()
            return taken

    @property
    def chunks(self) -> list[RawChunk]:
        return [item for item in self.items if isinstance(item, RawChunk)]

    @property
    def ends(self) -> list[SourceEnd]:
        return [item for item in self.items if isinstance(item, SourceEnd)]

    def wait(self, predicate, timeout_s: float, what: str) -> None:
        """Waits until ``predicate(self)`` holds; fails the test saying ``what`` did not come."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(f"{what} did not come within {timeout_s:g} s")
                self._changed.wait(left)

    def wait_end(self, timeout_s: float = 60.0) -> SourceEnd:
        self.wait(lambda c: c.ends, timeout_s, "the SourceEnd")
        return self.ends[0]


class FakeClock:
    """A clock that moves only when slept on, so a realtime replay runs at full speed and
    deterministically; records every sleep."""

    def __init__(self, start_ns: int = 5 * NS_PER_S):
        self.now_ns = start_ns
        self.sleeps_s: list[float] = []

    def __call__(self) -> int:
        return self.now_ns

    def sleep(self, seconds: float) -> None:
        self.sleeps_s.append(seconds)
        self.now_ns += max(1, round(seconds * NS_PER_S))


def run_timed(source, clock: FakeClock, timeout_s: float = 30.0) -> tuple[Collector, list[int]]:
    """Runs a replay made on ``clock`` to its end: what it delivered, and the clock's time at
    each delivery."""
    arrivals: list[int] = []
    sink = Collector()

    def timed_sink(item):
        arrivals.append(clock.now_ns)
        return sink(item)

    source.start(timed_sink)
    try:
        sink.wait_end(timeout_s)
    finally:
        source.stop()
    return sink, arrivals


def run_to_end(source, timeout_s: float = 60.0) -> Collector:
    """Starts ``source`` with a collecting sink, waits for its SourceEnd, stops it."""
    sink = Collector()
    source.start(sink)
    try:
        sink.wait_end(timeout_s)
    finally:
        source.stop()
    return sink


def frame(chunks: list[RawChunk], flush: bool = True) -> list:
    """The 16 kHz blocks the engine makes of ``chunks`` (flushed at the end, as after a
    SourceEnd), through the real StreamIngest."""
    if not chunks:
        return []
    ingest = StreamIngest(chunks[0].stream)
    blocks = [ingest.accept(c.rate_hz, c.samples, c.capture_ns, c.first_sample) for c in chunks]
    if flush:
        blocks.append(ingest.flush(chunks[-1].capture_ns))
    return [b for b in blocks if b is not None]


def joined(items) -> np.ndarray:
    """The samples of chunks or blocks, end to end."""
    return np.concatenate([item.samples for item in items])


@pytest.fixture
def sinks() -> SimpleNamespace:
    """``Collector``, ``FakeClock``, ``run_timed``, ``run_to_end``, ``frame`` and ``joined`` (see
    this module)."""
    return SimpleNamespace(Collector=Collector, FakeClock=FakeClock, run_timed=run_timed, run_to_end=run_to_end,
                           frame=frame, joined=joined)
