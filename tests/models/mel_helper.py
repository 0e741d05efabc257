"""Whisper input features for the model tests, through the project's NumPy specification."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf

from captioner.gpu.features_ref import whisper_input_features


def load_audio_16k(path: Path) -> np.ndarray:
    audio, rate_hz = sf.read(str(path), dtype="float32", always_2d=True)
    if rate_hz != 16_000:
        import soxr

        audio = soxr.resample(audio, rate_hz, 16_000)
    return np.ascontiguousarray(audio.mean(axis=1), dtype=np.float32)


def whisper_features(audio_16k: np.ndarray, n_mels: int = 80) -> np.ndarray:
    """[n_mels, 3000] float32 for the first 30 s of ``audio_16k`` (zero padded)."""
    return np.asarray(whisper_input_features(audio_16k, n_mels), dtype=np.float32)


def clip_features(speech_clips, clip_ids, n_mels: int = 80) -> np.ndarray:
    """[len(clip_ids), n_mels, 3000] float32: each recording's first 30 s as Whisper's input."""
    return np.stack([whisper_features(load_audio_16k(speech_clips[c].wav), n_mels) for c in clip_ids])
