"""The delivery thread shared by the finite sources (file, synthetic): native-rate mono audio
from a producer, cut into short chunks and pushed into the consumer's sink, either paced in
real time against a clock or as fast as the sink takes them.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np

from captioner.audio.source import RawChunk, Sink, SourceEnd, SourceStats
from captioner.errors import one_line
from captioner.events import NS_PER_S

REPLAY_CHUNK_S = 0.02
"""Length of one delivered chunk: a device's usual block, so a replay looks like a capture."""


class ReplaySource(ABC):
    """Base of sources that make their audio on demand, so they never drop any.

    Subclasses set ``rate_hz`` and implement :meth:`_open` (called by ``start`` on the owner's
    thread: a file that cannot be opened is a ``UserError`` there), :meth:`_produce` (the next
    native-rate mono samples, or ``None`` at the end; on the replay thread) and :meth:`_close`.

    ``start(sink)`` spawns the thread ``captioner-replay-<stream>``, which delivers
    :data:`REPLAY_CHUNK_S` chunks. ``realtime=True`` releases each once ``clock_ns()`` has
    reached its last sample's time (counted from ``start``), sleeping meanwhile with ``sleep``
    or, by default, on the stop event (so ``stop`` wakes it at once); its ``capture_ns`` is
    that due time. Give a fake clock and a ``sleep`` that advances it, and a realtime replay
    runs deterministically at full speed. ``realtime=False`` delivers as fast as the sink
    takes the chunks; a sink that blocks is the backpressure, and nothing is ever dropped.
    After the last chunk comes ``SourceEnd(stream)``; a failure while producing (a file that
    turns out damaged) ends with ``SourceEnd(stream, error=...)``. A sink that returns False
    (the consumer is shutting down) ends the delivery with nothing more.
    """

    live = False
    priority = "replay"
    """A replay waits when compute is short: microphones and meetings are served first, and on a
    GPU a replay is refused a little before a live stream would be (the engine's admission)."""
    rate_hz: int

    def __init__(
        self,
        stream: str,
        realtime: bool = False,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        sleep: Callable[[float], object] | None = None,
    ):
        self.stream = stream
        self.realtime = realtime
        self._clock_ns = clock_ns
        self._stop_event = threading.Event()
        self._sleep = sleep if sleep is not None else self._stop_event.wait
        self._lock = threading.Lock()  # serialises start/stop
        self._thread: threading.Thread | None = None
        self._exhausted = False
        self._delivered_samples = 0  # written by the replay thread only

    # -- for subclasses ---------------------------------------------------------------------
    def _open(self) -> None:  # noqa: B027 - optional hook: most sources open nothing
        pass

    @abstractmethod
    def _produce(self) -> np.ndarray | None:
        """The next native-rate mono float32 samples (any length), or ``None`` at the end."""

    def _close(self) -> None:  # noqa: B027 - optional hook: most sources close nothing
        pass

    # -- owner thread -----------------------------------------------------------------------
    def start(self, sink: Sink) -> None:
        """Opens the audio (raising ``UserError`` if it cannot) and starts the replay thread,
        which calls ``sink``. A source that ran to its end (or was stopped) may start again,
        from the beginning."""
        with self._lock:
            previous = self._thread
            if previous is not None and previous.is_alive():
                if not self._stop_event.is_set() or previous is threading.current_thread():
                    raise RuntimeError(f"replay {self.stream!r} is already started")
                # Stopped from inside its own sink, it may still be closing its file: wait.
                previous.join()
            self._open()
            self._stop_event.clear()
            self._exhausted = False
            self._delivered_samples = 0
            start_ns = int(self._clock_ns())
            self._thread = threading.Thread(
                target=self._run, args=(sink, start_ns), name=f"captioner-replay-{self.stream}", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Stops the replay thread and joins it, so no sink call happens after this returns.

        A sink blocked at that moment must be released first (made to return False): the
        consumer that owns it does that before stopping its sources.
        """
        with self._lock:
            self._stop_event.set()
            thread = self._thread
            if thread is None or thread is threading.current_thread():
                return  # called by the sink, on the replay thread: it ends once the sink returns
            thread.join()
            self._thread = None

    # -- any thread -------------------------------------------------------------------------
    @property
    def exhausted(self) -> bool:
        """True once the :class:`~captioner.audio.source.SourceEnd` was delivered."""
        return self._exhausted

    def stats(self) -> SourceStats:
        return SourceStats(delivered_samples=self._delivered_samples)

    # -- replay thread ----------------------------------------------------------------------
    def _run(self, sink: Sink, start_ns: int) -> None:
        chunk_samples = max(1, round(self.rate_hz * REPLAY_CHUNK_S))
        try:
            position = 0
            for samples, end in self._chunks(chunk_samples):
                if self._stop_event.is_set():
                    return
                if end is not None:
                    self._exhausted = True  # before the call: whoever receives the end sees it
                    sink(end)
                    return
                end_sample = position + samples.shape[0]
                if self.realtime:
                    capture_ns = self._wait_until(start_ns + -(-end_sample * NS_PER_S // self.rate_hz))
                    if capture_ns is None:
                        return
                else:
                    capture_ns = int(self._clock_ns())
                if not sink(RawChunk(self.stream, self.rate_hz, position, capture_ns, samples)):
                    return  # the consumer is shutting down
                self._delivered_samples += samples.shape[0]
                position = end_sample
        finally:
            self._close()

    def _chunks(self, chunk_samples: int):
        """``(samples, None)`` for every chunk of ``chunk_samples`` (the last may be shorter),
        then ``(None, SourceEnd)``. A producer that fails ends the audio there: what it made
        before is still delivered, then the end carries its error."""
        pending = np.zeros(0, dtype=np.float32)
        end: SourceEnd | None = None
        while True:
            while pending.shape[0] < chunk_samples and end is None:
                try:
                    piece = self._produce()
                except Exception as error:
                    end = SourceEnd(self.stream, error=one_line(error) or type(error).__name__)
                    break
                if piece is None:
                    end = SourceEnd(self.stream)
                else:
                    piece = np.asarray(piece, dtype=np.float32).reshape(-1)
                    pending = np.concatenate((pending, piece)) if pending.size else piece
            if pending.shape[0] == 0:
                yield None, end
                return
            # A copy: the chunk must not share memory with the producer's buffers.
            chunk, pending = pending[:chunk_samples].copy(), pending[chunk_samples:]
            yield chunk, None

    def _wait_until(self, due_ns: int) -> int | None:
        """Sleeps until ``clock_ns()`` reaches ``due_ns``; returns ``due_ns``, or ``None`` when
        the source was stopped meanwhile."""
        while not self._stop_event.is_set():
            now_ns = int(self._clock_ns())
            if now_ns >= due_ns:
                return due_ns
            self._sleep((due_ns - now_ns) / NS_PER_S)
        return None
