"""Cuts 16 kHz audio of any chunk size into whole 10 ms frames, keeping a running sample index."""

from __future__ import annotations

import numpy as np

from captioner.events import FRAME_SAMPLES, SAMPLE_RATE_HZ, AudioBlock

_NS_PER_SAMPLE = 1e9 / SAMPLE_RATE_HZ


class Framer:
    """Accumulates mono 16 kHz samples and hands them out as blocks of whole frames.

    Sample ``k`` pushed (counting from ``first_sample``) ends up at index ``first_sample + k``
    of the stream's clock; nothing is lost or repeated whatever the chunk sizes. The
    remainder shorter than a frame waits for the next push (or :meth:`flush`). Used by one
    thread at a time (the consumer of a source).
    """

    def __init__(self, stream: str, first_sample: int = 0, frame_samples: int = FRAME_SAMPLES):
        if frame_samples <= 0:
            raise ValueError("frame_samples must be positive")
        self.stream = stream
        self.frame_samples = frame_samples
        self._next_sample = int(first_sample)  # stream index of the first pending sample
        self._pending = np.zeros(0, dtype=np.float32)
        self._last_capture_ns = -(2**62)  # block capture times never go backwards

    @property
    def next_sample(self) -> int:
        """Stream index the next emitted frame starts at."""
        return self._next_sample

    @property
    def pending_samples(self) -> int:
        return int(self._pending.shape[0])

    def push(self, samples: np.ndarray, capture_ns: int, captured_to_sample: int | None = None) -> AudioBlock | None:
        """Adds ``samples``; returns the whole frames now complete as one block, or ``None``
        when there is not yet a frame.

        ``capture_ns`` is when stream sample ``captured_to_sample - 1`` was captured (by
        default: the last sample pushed). A resampler holds a few samples back, so a live
        source passes the index its device has really reached; the block's ``capture_ns`` is
        then estimated for its own last sample, and never goes backwards.
        """
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        if samples.size == 0:
            return None
        # A copy either way: blocks must not share memory with the caller's buffer.
        joined = np.concatenate((self._pending, samples)) if self._pending.size else samples.copy()
        n_whole = (joined.shape[0] // self.frame_samples) * self.frame_samples
        if captured_to_sample is None:
            captured_to_sample = self._next_sample + joined.shape[0]
        if n_whole == 0:
            self._pending = joined  # already a fresh array (concatenated or copied above)
            return None
        self._pending = joined[n_whole:].copy()
        block_end = self._next_sample + n_whole
        block_capture_ns = int(capture_ns - (captured_to_sample - block_end) * _NS_PER_SAMPLE)
        block_capture_ns = max(block_capture_ns, self._last_capture_ns)
        self._last_capture_ns = block_capture_ns
        block = AudioBlock(self.stream, self._next_sample, block_capture_ns, joined[:n_whole])
        self._next_sample = block_end
        return block

    def flush(self, capture_ns: int) -> AudioBlock | None:
        """Emits the leftover samples padded with zeros to one whole frame (end of a stream)."""
        if self._pending.size == 0:
            return None
        padded = np.zeros(self.frame_samples, dtype=np.float32)
        padded[: self._pending.shape[0]] = self._pending
        self._pending = np.zeros(0, dtype=np.float32)
        self._last_capture_ns = max(int(capture_ns), self._last_capture_ns)
        block = AudioBlock(self.stream, self._next_sample, self._last_capture_ns, padded)
        self._next_sample += self.frame_samples
        return block

    def jump_to(self, sample_index: int) -> None:
        """Discards the leftover and continues at the first frame boundary at or after
        ``sample_index`` (after lost audio), so a gap shows as a jump of whole frames."""
        self._pending = np.zeros(0, dtype=np.float32)
        ahead = int(sample_index) - self._next_sample
        if ahead > 0:
            self._next_sample += -(-ahead // self.frame_samples) * self.frame_samples
