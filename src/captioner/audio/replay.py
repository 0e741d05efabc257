"""Pacing shared by the finite sources (file, synthetic): 16 kHz audio from a producer,
released as whole 10 ms frames either in real time against a clock or on demand.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np

from captioner.audio.source import SourceStats
from captioner.events import FRAME_SAMPLES, NS_PER_S, SAMPLE_RATE_HZ, AudioBlock



class ReplaySource(ABC):
    """Base of sources that make their audio on demand, so they never drop any.

    Subclasses implement :meth:`_open` (called by ``start``), :meth:`_produce` (the next
    16 kHz mono samples, or ``None`` at the end) and :meth:`_close`. ``realtime=True``
    releases a frame once ``clock_ns()`` has passed its end (counted from ``start``),
    sleeping with ``sleep`` while nothing is due; ``realtime=False`` hands out up to
    ``max_read_frames`` frames per ``read``. The last partial frame is padded with zeros.
    """

    def __init__(
        self,
        stream: str,
        realtime: bool = False,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        sleep: Callable[[float], object] = time.sleep,
        max_read_frames: int = 100,
    ):
        self.stream = stream
        self.realtime = realtime
        self._clock_ns = clock_ns
        self._sleep = sleep
        self._max_read_samples = max(1, int(max_read_frames)) * FRAME_SAMPLES
        self._lock = threading.Lock()
        self._running = False
        self._buffer = np.zeros(0, dtype=np.float32)  # produced samples not yet released
        self._released = 0  # stream index of _buffer[0]
        self._produced_all = False
        self._start_ns = 0
        self._delivered_frames = 0

    # -- for subclasses ---------------------------------------------------------------------
    def _open(self) -> None:
        pass

    @abstractmethod
    def _produce(self, wanted_samples: int) -> np.ndarray | None:
        """The next samples (about ``wanted_samples``), or ``None`` once the audio has ended."""

    def _close(self) -> None:
        pass

    # -- AudioSource ------------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            if self._running:
                return
            self._open()
            self._running = True
            self._buffer = np.zeros(0, dtype=np.float32)
            self._released = 0
            self._produced_all = False
            self._delivered_frames = 0
            self._start_ns = int(self._clock_ns())

    def stop(self) -> None:
        with self._lock:
            if self._running:
                self._close()
            self._running = False

    @property
    def exhausted(self) -> bool:
        return self._produced_all and self._buffer.size == 0

    def stats(self) -> SourceStats:
        return SourceStats(
            delivered_frames=self._delivered_frames, queue_depth=self._buffer.shape[0] // FRAME_SAMPLES
        )

    def read(self, timeout_s: float = 0.0) -> list[AudioBlock]:
        """Called by the consumer (the engine's audio thread)."""
        with self._lock:
            if not self._running or self.exhausted:
                return []
            if not self.realtime:
                self._fill(self._max_read_samples)
                return self._release(min(self._max_read_samples, self._buffer.shape[0]), int(self._clock_ns()))
            now_ns = int(self._clock_ns())
            next_due_ns = self._start_ns + -(-(self._released + FRAME_SAMPLES) * NS_PER_S // SAMPLE_RATE_HZ)
            if now_ns < next_due_ns:
                wait_s = min(float(timeout_s), (next_due_ns - now_ns) / NS_PER_S)
                if wait_s <= 0:
                    return []
                self._sleep(wait_s)
                now_ns = int(self._clock_ns())
            due = (now_ns - self._start_ns) * SAMPLE_RATE_HZ // NS_PER_S - self._released
            due -= due % FRAME_SAMPLES
            if due <= 0:
                return []
            self._fill(due)
            n_samples = min(due, self._buffer.shape[0])
            # A frame is released once its last sample's time has come: capture time = that time.
            end_sample = self._released + n_samples
            return self._release(n_samples, self._start_ns + end_sample * NS_PER_S // SAMPLE_RATE_HZ)

    # -- internals --------------------------------------------------------------------------
    def _fill(self, wanted_samples: int) -> None:
        pieces = [self._buffer]
        have = self._buffer.shape[0]
        while have < wanted_samples and not self._produced_all:
            piece = self._produce(wanted_samples - have)
            if piece is None:
                self._produced_all = True
                pad = (-have) % FRAME_SAMPLES
                if pad:
                    pieces.append(np.zeros(pad, dtype=np.float32))
                    have += pad
            else:
                piece = np.asarray(piece, dtype=np.float32).reshape(-1)
                pieces.append(piece)
                have += piece.shape[0]
        if len(pieces) > 1:
            self._buffer = np.concatenate(pieces)

    def _release(self, n_samples: int, capture_ns: int) -> list[AudioBlock]:
        n_samples -= n_samples % FRAME_SAMPLES
        if n_samples <= 0:
            return []
        block = AudioBlock(self.stream, self._released, capture_ns, self._buffer[:n_samples].copy())
        self._buffer = self._buffer[n_samples:]
        self._released += n_samples
        self._delivered_frames += n_samples // FRAME_SAMPLES
        return [block]
