"""The one place where captured audio becomes what the engine eats: 16 kHz mono float32 in
whole 10 ms frames, on a per-stream sample clock.

Every source (a device, a file, a synthetic signal) and every caller of the public API hands
its audio, at its own rate and channel count, to a :class:`StreamIngest`: it checks it, mixes
it down, resamples it (one streaming soxr resampler per run of one rate) and frames it.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from captioner.audio.framing import Framer
from captioner.audio.resample import MIN_RATE_HZ, Resampler, mixdown
from captioner.events import FRAME_SAMPLES, SAMPLE_RATE_HZ, AudioBlock

MAX_RATE_HZ = 384_000
"""The highest rate an audio interface offers; above it a caller has mixed up its arguments."""

_INT16_SCALE = 1.0 / 32768.0  # int16 full scale -> [-1, 1)
_ACCEPTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int16))


def check_ingest_rate(rate_hz: object) -> int:
    """``rate_hz`` as an int, or a one-line ``ValueError`` when it is not a whole number of Hz
    between :data:`MIN_RATE_HZ` and :data:`MAX_RATE_HZ`."""
    if type(rate_hz) is int and MIN_RATE_HZ <= rate_hz <= MAX_RATE_HZ:
        return rate_hz  # the common case, asked 10 times a second per stream: no further checks
    if isinstance(rate_hz, bool) or not isinstance(rate_hz, numbers.Real):
        raise ValueError(f"sample rate must be a whole number of Hz, got {rate_hz!r}")
    if not float(rate_hz).is_integer():
        raise ValueError(f"sample rate must be a whole number of Hz, got {float(rate_hz):g}")
    rate = int(rate_hz)
    if not MIN_RATE_HZ <= rate <= MAX_RATE_HZ:
        raise ValueError(f"sample rate {rate} Hz is outside {MIN_RATE_HZ}..{MAX_RATE_HZ} Hz")
    return rate


def pcm16_to_float32(pcm: bytes) -> np.ndarray:
    """Little-endian int16 PCM bytes as float32 in [-1, 1): one NumPy call, however many
    messages were joined into ``pcm``."""
    return np.multiply(np.frombuffer(pcm, dtype="<i2"), np.float32(_INT16_SCALE), dtype=np.float32)


def to_float_mono(samples: object) -> np.ndarray:
    """``[n]`` or ``[n, channels]`` float32/float64/int16 -> ``[n]`` float32 (int16 scaled by
    1/32768, channels averaged); a one-line ``ValueError`` for any other shape or dtype, and for
    NaN or infinite samples."""
    array = np.asarray(samples)
    if array.dtype == np.float32 and array.ndim == 1:
        # The common case (mono float32, 100 ms at a time from every stream): one dot product
        # tells finite audio apart; only when it is not finite (NaN/Inf, or finite samples so
        # large that their squares overflow) does the exact check run.
        if not math.isfinite(float(np.dot(array, array))) and not np.isfinite(array).all():
            raise ValueError("samples contain NaN or infinite values")
        return array
    if array.dtype not in _ACCEPTED_DTYPES:
        raise ValueError(f"samples must be float32, float64 or int16, got {array.dtype}")
    if array.ndim not in (1, 2):
        raise ValueError(f"samples must be [n] or [n, channels], got shape {array.shape}")
    if array.ndim == 2 and array.shape[1] == 0 and array.shape[0] > 0:
        raise ValueError(f"samples have no channels (shape {array.shape})")
    if array.dtype == np.int16:
        array = array.astype(np.float32) * np.float32(_INT16_SCALE)
    else:
        # Checked after the float32 cast: a float64 beyond float32's range becomes inf there.
        with np.errstate(over="ignore"):
            array = array.astype(np.float32, copy=False)
        if not np.isfinite(array).all():
            raise ValueError("samples contain NaN or infinite values")
    return mixdown(array)


class StreamIngest:
    """Turns one stream's audio, at any rate >= 8 kHz, into 16 kHz AudioBlocks of whole 10 ms
    frames on the stream's sample clock.

    The clock: output sample ``k`` sits at 16 kHz index ``k`` from the first chunk on, whatever
    the chunk sizes. A chunk whose native ``first_sample`` jumps forward (audio lost on the
    way) moves the clock over the gap to where that chunk really belongs, so a caption's times
    stay true; the engine fills the gap with silence. A change of rate starts a new run of the
    clock right where the previous audio ended.

    Used by one thread at a time (the engine's worker, or the public API's caller).
    """

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self._framer = Framer(stream)
        self._resampler: Resampler | None = None
        self._rate_hz: int | None = None
        # The current run of one rate: its start on the native clock and on the 16 kHz clock,
        # so any native index maps to its 16 kHz index without drift.
        self._run_native_start = 0
        self._run_out_start = 0
        self._native_end = 0  # native index just past the last accepted sample
        self._has_run = False  # whether any audio came yet (the first chunk starts the clock at 0)

    @property
    def next_sample(self) -> int:
        """16 kHz stream index of the next block's first sample."""
        return self._framer.next_sample

    @property
    def rate_hz(self) -> int | None:
        """Native rate of the audio accepted last (``None`` before any)."""
        return self._rate_hz

    def accept(self, rate_hz: int, samples, capture_ns: int, first_sample: int | None = None) -> AudioBlock | None:
        """Takes one chunk; returns the whole frames now complete as one block, or ``None``.

        ``capture_ns`` is when the chunk's last sample was captured. ``first_sample`` is the
        chunk's index on the native clock (as in :class:`~captioner.audio.source.RawChunk`);
        ``None`` means it continues the previous chunk. Raises a one-line ``ValueError`` for a
        bad rate, shape, dtype, NaN/Inf, or a ``first_sample`` that goes backwards.
        """
        rate = check_ingest_rate(rate_hz)
        if first_sample is not None and first_sample < 0:
            raise ValueError(f"first_sample must be >= 0, got {first_sample}")
        mono = to_float_mono(samples)
        if mono.shape[0] == 0:
            return None
        lead = np.zeros(0, dtype=np.float32)  # 16 kHz audio that goes before this chunk's
        if rate != self._rate_hz:
            lead = self._start_run(rate, first_sample)
        elif first_sample is not None and first_sample != self._native_end:
            if first_sample < self._native_end:
                raise ValueError(
                    f"first_sample {first_sample} goes back before the end of the previous chunk "
                    f"({self._native_end})"
                )
            lead = self._jump_over_gap(first_sample)
        self._native_end += mono.shape[0]
        # At 16 kHz the resampler passes mono float32 through as it is: skip its checks.
        out = mono if self._resampler.passthrough else self._resampler.process(mono)
        if lead.size:
            out = np.concatenate((lead, out))
        return self._framer.push(out, int(capture_ns), self._out_index(self._native_end))

    def flush(self, capture_ns: int) -> AudioBlock | None:
        """End of the stream: the resampler's tail and the last partial frame, padded with
        zeros to a whole frame, as one block (``None`` when nothing is left).

        Audio accepted afterwards continues the clock after that padded frame.
        """
        if self._resampler is None:
            return None
        tail = self._resampler.flush()
        pending = self._framer.pending_samples + tail.shape[0]
        pad = (-pending) % FRAME_SAMPLES
        if pad:
            tail = np.concatenate((tail, np.zeros(pad, dtype=np.float32)))
        block = self._framer.push(tail, int(capture_ns)) if tail.size else None
        self._resampler = None  # a fresh run (and resampler) for anything accepted later
        self._rate_hz = None
        return block

    # -- internals --------------------------------------------------------------------------
    def _out_index(self, native_index: int) -> int:
        """16 kHz index of native index ``native_index`` in the current run."""
        native_offset = native_index - self._run_native_start
        return self._run_out_start + native_offset * SAMPLE_RATE_HZ // self._rate_hz

    def _start_run(self, rate: int, first_sample: int | None) -> np.ndarray:
        """A new rate (or the first chunk, or the first after ``flush``): drains the old
        resampler, whose tail goes before the new audio, and starts the new run right after it.
        A new rate has a new native clock: ``first_sample`` (if any) only anchors it."""
        tail = self._resampler.flush() if self._resampler is not None else np.zeros(0, dtype=np.float32)
        first_run = not self._has_run
        self._has_run = True
        self._resampler = Resampler(rate)
        self._rate_hz = rate
        self._run_out_start = self._framer.next_sample + self._framer.pending_samples + tail.shape[0]
        self._run_native_start = self._native_end = 0 if first_run else (first_sample or 0)
        if first_run and first_sample:
            # The very first chunk already comes after lost audio: place it where it belongs.
            return self._jump_over_gap(first_sample)
        return tail

    def _jump_over_gap(self, first_sample: int) -> np.ndarray:
        """Audio was lost before native index ``first_sample``: restarts the resampler (no
        history leaks across the gap) and moves the clock to where that audio belongs.

        The framer can only jump to a frame boundary, so it jumps to the boundary at or before
        the true place and the returned zeros fill up to it: the new audio's first sample lands
        on the 16 kHz index of its true time (rounded down: less than one 16 kHz sample early).
        The partial frame before the gap (and what the resampler still held) is dropped with
        the lost audio.
        """
        target = self._out_index(first_sample)
        self._resampler.reset()
        self._framer.jump_to(target - target % FRAME_SAMPLES)
        self._run_native_start = self._native_end = first_sample
        self._run_out_start = target
        return np.zeros(max(0, target - self._framer.next_sample), dtype=np.float32)
