"""Synthetic audio (tones, noise, silence, or any array) as a source, for tests and demos.

A signal can be given at any rate and channel count; it then goes through the same mixdown and
streaming resampler as a file or a device, so tests exercise the real conversion path.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from captioner.audio.replay import ReplaySource
from captioner.audio.resample import Resampler
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
    """Plays ``signal`` (``[n]`` or ``[n, channels]`` at ``rate_hz``) once, or ``loop``\\ s it.

    Pacing is :class:`~captioner.audio.replay.ReplaySource`'s: real time against an injectable
    clock, or on demand. ``chunk_samples`` is how much native audio is converted per step, so a
    test can vary how the signal is cut before resampling and framing.
    """

    def __init__(
        self,
        signal: np.ndarray,
        rate_hz: int = SAMPLE_RATE_HZ,
        stream: str = "Synthetic",
        realtime: bool = False,
        loop: bool = False,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        sleep: Callable[[float], object] = time.sleep,
        max_read_frames: int = 100,
        chunk_samples: int = 4096,
    ):
        super().__init__(stream, realtime=realtime, clock_ns=clock_ns, sleep=sleep, max_read_frames=max_read_frames)
        signal = np.asarray(signal, dtype=np.float32)
        if signal.ndim not in (1, 2) or signal.shape[0] == 0:
            raise ValueError("signal must be a non-empty [n] or [n, channels] array")
        self.signal = signal
        self.rate_hz = int(rate_hz)
        self.loop = loop
        self._chunk_samples = max(1, int(chunk_samples))
        self._position = 0
        self._resampler = Resampler(self.rate_hz)
        self._finished = False

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
        self._finished = False
        self._resampler.reset()

    def _produce(self, wanted_samples: int) -> np.ndarray | None:
        if self._finished:
            return None
        n = self.signal.shape[0]
        if self._position >= n:
            if self.loop:
                self._position = 0
            else:
                self._finished = True
                return self._resampler.flush()
        chunk = self.signal[self._position : self._position + self._chunk_samples]
        self._position += chunk.shape[0]
        return self._resampler.process(chunk)
