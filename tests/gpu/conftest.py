"""Fixtures for the gpu/ tests: one test body runs under NumPy and (marked ``gpu``) CuPy."""

from __future__ import annotations

import wave

import numpy as np
import pytest

from captioner.gpu.backend import get_backend


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def xb(request):
    """The array back-end under test (the ``cuda`` variant is skipped without a usable GPU)."""
    return get_backend(request.param)


def read_wav_16k(path) -> np.ndarray:
    """16-bit PCM mono WAV -> float32 in [-1, 1) (stdlib only: the GPU machine lacks soundfile).
    FLAC, which only the subset shipped in tests/data/speech uses (for its long readings), goes
    through soundfile: the same 16-bit samples, scaled the same way."""
    if str(path).lower().endswith(".flac"):
        import soundfile as sf

        data, rate_hz = sf.read(str(path), dtype="int16")
        assert data.ndim == 1 and rate_hz == 16_000
        return data.astype(np.float32) / 32768.0
    with wave.open(str(path), "rb") as w:
        assert w.getsampwidth() == 2 and w.getnchannels() == 1 and w.getframerate() == 16_000
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return data.astype(np.float32) / 32768.0


@pytest.fixture(scope="session")
def speech_audio(speech_clips):
    """Every real recording of the set in use (tests/conftest.py ``speech_dir``) as 16 kHz float32,
    by clip id; asking for one the set lacks skips the test, as ``speech_clips`` does."""
    return speech_clips.map(lambda clip: read_wav_16k(clip.wav))
