"""Synthetic audio (tones, noise, silence, or any array) as a source, for tests and demos.

A signal can be given at any rate and channel count; it is delivered at that rate, mixed down
to mono, so the consumer's conversion to 16 kHz frames is the same as for a file or a device.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from captioner.audio.replay import REPLAY_CHUNK_S, ReplaySource
from captioner.audio.resample import check_rate, mixdown
from captioner.events import SAMPLE_RATE_HZ


def tone(freq_hz: float, duration_s: float, rate_hz: int = SAMPLE_RATE_HZ, amplitude: float = 0.5,
         phase_rad: float = 0.0) -> np.ndarray:
    """A sine wave, float32."""
    t = np.arange(int(round(duration_s * rate_hz)), dtype=np.float64) / rate_hz
    return (amplitude * np.sin(2 * np.pi * freq_hz * t + phase_rad)).astype(np.float32)


def noise(duration_s: float, rate_hz: int = SAMPLE_RATE_HZ, amplitude: float = 0.1, seed: int = 0) -> np.ndarray:
    """Gaussian white noise with standard deviation ``amplitude``, float32, reproducible by seed."""
    rng = np.random.default_rng(seed)
    return (amplitude * rng.standard_normal(int(round(duration_s * rate_hz)))).astype(np.float32)


def silence(duration_s: float, rate_hz: int = SAMPLE_RATE_HZ) -> np.ndarray:
    return np.zeros(int(round(duration_s * rate_hz)), dtype=np.float32)


class SyntheticSource(ReplaySource):
    """Plays ``signal`` (``[n]`` or ``[n, channels]`` at ``rate_hz``) once, or ``loop``\\ s it,
    at ``rate_hz``, mixed down to mono.

    Pacing is :class:`~captioner.audio.replay.ReplaySource`'s: real time against an injectable
    clock, or as fast as the sink takes it.
    """

    def __init__(
        self,
        signal: np.ndarray,
        rate_hz: int = SAMPLE_RATE_HZ,
        stream: str = "Synthetic",
        realtime: bool = False,
        loop: bool = False,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        sleep: Callable[[float], object] | None = None,
    ):
        super().__init__(stream, realtime=realtime, clock_ns=clock_ns, sleep=sleep)
        signal = np.asarray(signal, dtype=np.float32)
        if signal.ndim not in (1, 2) or signal.shape[0] == 0:
            raise ValueError("signal must be a non-empty [n] or [n, channels] array")
        check_rate(rate_hz, "the synthetic signal")
        self.signal = mixdown(signal)
        self.rate_hz = int(rate_hz)
        self.loop = loop
        # About one delivered chunk per step; the replay thread re-cuts it anyway.
        self._step_samples = max(1, round(self.rate_hz * REPLAY_CHUNK_S))
        self._position = 0

    @classmethod
    def tone(cls, freq_hz: float = 440.0, duration_s: float = 1.0, rate_hz: int = SAMPLE_RATE_HZ,
             amplitude: float = 0.5, **kwargs) -> SyntheticSource:
        return cls(tone(freq_hz, duration_s, rate_hz, amplitude), rate_hz=rate_hz, **kwargs)

    @classmethod
    def noise(cls, duration_s: float = 1.0, rate_hz: int = SAMPLE_RATE_HZ, amplitude: float = 0.1,
              seed: int = 0, **kwargs) -> SyntheticSource:
        return cls(noise(duration_s, rate_hz, amplitude, seed), rate_hz=rate_hz, **kwargs)

    @classmethod
    def silence(cls, duration_s: float = 1.0, rate_hz: int = SAMPLE_RATE_HZ, **kwargs) -> SyntheticSource:
        return cls(silence(duration_s, rate_hz), rate_hz=rate_hz, **kwargs)

    def _open(self) -> None:
        self._position = 0

    def _produce(self) -> np.ndarray | None:
        """Replay thread."""
        n = self.signal.shape[0]
        if self._position >= n:
            if not self.loop:
                return None
            self._position = 0
        piece = self.signal[self._position : self._position + self._step_samples]
        self._position += piece.shape[0]
        return piece
