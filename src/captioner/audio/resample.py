"""Streaming conversion of any native rate and channel count to 16 kHz mono float32.

Channels are mixed down first (their mean), so only one channel goes through the resampler.
The resampler is python-soxr's ``ResampleStream``: its state carries over between chunks, so
chunked output equals whole-signal output away from the very start and end.
"""

from __future__ import annotations

import numpy as np

from captioner.errors import UserError
from captioner.events import SAMPLE_RATE_HZ

MIN_RATE_HZ = 8_000
"""Below this, speech loses the band a recogniser needs: such input is refused."""

QUALITY = "HQ"


def check_rate(rate_hz: float, what: str) -> None:
    if not rate_hz or rate_hz < MIN_RATE_HZ:
        raise UserError(
            f"{what} has a sample rate of {rate_hz:g} Hz; at least {MIN_RATE_HZ} Hz is needed for speech"
        )


def mixdown(block: np.ndarray) -> np.ndarray:
    """``[n]`` or ``[n, channels]`` of any float/int dtype -> ``[n]`` float32 (mean of channels)."""
    block = np.asarray(block)
    if block.ndim == 2:
        block = block[:, 0] if block.shape[1] == 1 else block.mean(axis=1, dtype=np.float32)
    elif block.ndim != 1:
        raise ValueError(f"audio must be [n] or [n, channels], got shape {block.shape}")
    return np.asarray(block, dtype=np.float32)


class Resampler:
    """Native-rate chunks in, 16 kHz mono float32 out; one consumer thread at a time."""

    def __init__(self, in_rate_hz: float, out_rate_hz: int = SAMPLE_RATE_HZ, quality: str = QUALITY):
        check_rate(in_rate_hz, "the audio")
        self.in_rate_hz = float(in_rate_hz)
        self.out_rate_hz = int(out_rate_hz)
        self.quality = quality
        self._stream = None
        if self.in_rate_hz != self.out_rate_hz:
            import soxr  # noqa: PLC0415 - keeps `import captioner.audio` light

            self._stream = soxr.ResampleStream(
                self.in_rate_hz, self.out_rate_hz, 1, dtype="float32", quality=quality
            )

    @property
    def passthrough(self) -> bool:
        return self._stream is None

    def process(self, block: np.ndarray) -> np.ndarray:
        """Resamples one chunk (``[n]`` or ``[n, channels]``); :meth:`flush` drains the tail."""
        mono = mixdown(block)
        if self._stream is None:
            return mono
        return self._stream.resample_chunk(np.ascontiguousarray(mono))

    def flush(self) -> np.ndarray:
        """The samples still held inside the resampler (end of the input)."""
        if self._stream is None:
            return np.zeros(0, dtype=np.float32)
        return self._stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True)

    def reset(self) -> None:
        """Forgets the history (after a gap in the input) so old audio does not leak across it."""
        if self._stream is not None:
            self._stream.clear()


def resample_whole(audio: np.ndarray, in_rate_hz: float, out_rate_hz: int = SAMPLE_RATE_HZ) -> np.ndarray:
    """A whole signal at once (same filter as :class:`Resampler`), mixed down to mono."""
    mono = mixdown(audio)
    if float(in_rate_hz) == out_rate_hz:
        return mono
    import soxr  # noqa: PLC0415

    return soxr.resample(mono, in_rate_hz, out_rate_hz, quality=QUALITY).astype(np.float32, copy=False)
