"""A recording as offline transcription walks it: windows from a decoding position that only
moves forward, and where the next speech starts — in bounded memory, whatever the length.

The audio arrives as 16 kHz blocks (a decoded, resampled file, or slices of an array) and is
kept only from the decoding position on, up to one window ahead (plus what the search for the
next speech had to read). The VAD runs 10 s of audio at a time as the audio comes in, and
keeps its per-frame decision for the whole recording (one byte per 10 ms: 720 KB for 2 hours).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

import numpy as np

from captioner.events import FRAME_SAMPLES

VAD_CHUNK_FRAMES = 1000
"""The VAD's log-mel frames are computed 10 s at a time: the spectrogram of a whole 2-hour file
would take gigabytes, for one bool per frame. Audio is held from the decoding position to the
end of the last chunk the VAD saw: at most a window (30 s) and a chunk."""


class AudioWindows:
    """``blocks``: 16 kHz mono float32 arrays in order. Called by one thread."""

    def __init__(self, blocks: Iterable[np.ndarray], n_mels: int, vad: bool = True) -> None:
        from captioner.engine.vad import VoiceActivity, speech_band

        self._blocks: Iterator[np.ndarray] = iter(blocks)
        self._n_mels = n_mels
        self._band = speech_band(n_mels)
        self._vad = VoiceActivity() if vad else None
        self._pieces: deque[tuple[int, np.ndarray]] = deque()  # (first stream sample, samples), in order
        self._read_samples = 0
        self._ended = False
        self._speech = np.zeros(0, dtype=bool)  # VAD flag per frame, for frames [0, _vad_frames)
        self._vad_frames = 0
        self._pending_vad = np.zeros(0, dtype=np.float32)  # samples read but not yet given to the VAD

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def frames_read(self) -> int:
        """Whole 10 ms frames read so far (all of them once :attr:`ended`)."""
        return self._read_samples // FRAME_SAMPLES

    def _read_more(self) -> bool:
        """One more block into the buffer (and the VAD); False at the end."""
        if self._ended:
            return False
        block = next(self._blocks, None)
        if block is None:
            self._ended = True
            self._run_vad(final=True)
            return False
        block = np.array(block, dtype=np.float32).reshape(-1)  # our own copy
        if block.size:
            self._pieces.append((self._read_samples, block))
        self._read_samples += block.shape[0]
        if self._vad is not None:
            self._pending_vad = np.concatenate([self._pending_vad, block])
            self._run_vad(final=False)
        return True

    def _run_vad(self, final: bool) -> None:
        from captioner.engine.vad import band_energy_db
        from captioner.gpu.features_ref import log_mel_spectrogram

        if self._vad is None:
            return
        chunk_samples = VAD_CHUNK_FRAMES * FRAME_SAMPLES
        while self._pending_vad.shape[0] >= chunk_samples or (final and self._pending_vad.shape[0] >= FRAME_SAMPLES):
            n_frames = min(VAD_CHUNK_FRAMES, self._pending_vad.shape[0] // FRAME_SAMPLES)
            piece = self._pending_vad[:n_frames * FRAME_SAMPLES]
            self._pending_vad = self._pending_vad[n_frames * FRAME_SAMPLES:]
            # Only a chunk's outermost frames see its edge instead of the neighbouring audio,
            # which no speech decision notices; the VAD itself carries across chunks.
            flags = self._vad.push(band_energy_db(np, log_mel_spectrogram(piece, self._n_mels), self._band))
            flags = np.pad(flags, (0, max(0, n_frames - flags.shape[0])))[:n_frames]
            self._speech = np.concatenate([self._speech, flags])
            self._vad_frames += n_frames

    def frames_from(self, first_frame: int, want_frames: int) -> int:
        """How many frames from ``first_frame`` exist, reading until ``want_frames`` are there
        or the audio ends (so the answer is ``want_frames`` unless the recording ends sooner)."""
        while self.frames_read - first_frame < want_frames and self._read_more():
            pass
        return max(0, min(want_frames, self.frames_read - first_frame))

    def next_speech(self, first_frame: int, keep_frames: int = 100) -> int | None:
        """The first frame at or after ``first_frame`` where the VAD heard speech (reading on
        as far as needed), ``None`` when none follows; ``first_frame`` itself without a VAD.
        Silence read on the way is forgotten but for ``keep_frames`` before the speech."""
        if self._vad is None:
            return first_frame
        while True:
            ahead = np.flatnonzero(self._speech[first_frame:self._vad_frames])
            if ahead.size:
                return first_frame + int(ahead[0])
            self._release(max(first_frame, self._vad_frames - keep_frames) * FRAME_SAMPLES)
            if not self._read_more():
                ahead = np.flatnonzero(self._speech[first_frame:self._vad_frames])
                return first_frame + int(ahead[0]) if ahead.size else None

    def _release(self, before_sample: int) -> None:
        """Forget the pieces that end at or before ``before_sample``."""
        while self._pieces and self._pieces[0][0] + self._pieces[0][1].shape[0] <= before_sample:
            self._pieces.popleft()

    def samples(self, first_frame: int, n_frames: int) -> np.ndarray:
        """The samples of frames ``[first_frame, first_frame + n_frames)`` (fewer at the end);
        everything before ``first_frame`` is forgotten: positions only move forward."""
        self.frames_from(first_frame, n_frames)
        first, end = first_frame * FRAME_SAMPLES, (first_frame + n_frames) * FRAME_SAMPLES
        self._release(first)
        if self._pieces and self._pieces[0][0] > first:
            raise ValueError(f"frame {first_frame} was already released")
        out = [piece[max(0, first - at):end - at] for at, piece in self._pieces if at < end]
        return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)

    def speech_flags(self, first_frame: int = 0, n_frames: int | None = None) -> np.ndarray | None:
        """The VAD's decisions for the frames read so far (from ``first_frame``, ``n_frames`` of
        them); ``None`` without a VAD."""
        if self._vad is None:
            return None
        stop = None if n_frames is None else first_frame + n_frames
        return self._speech[first_frame:stop].copy()
