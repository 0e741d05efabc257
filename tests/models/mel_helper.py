"""Whisper input features for the model tests.

Uses the project's NumPy specification (``captioner.gpu.features_ref``) when it exists; until then a
direct transcription of Whisper's recipe (Slaney mel filters, periodic Hann, n_fft 400, hop 160,
log10 clamp to max-8, (x+4)/4), so the model tests do not wait on the features work.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf

N_SAMPLES_30S = 480_000


def load_audio_16k(path: Path) -> np.ndarray:
    audio, rate_hz = sf.read(str(path), dtype="float32", always_2d=True)
    if rate_hz != 16_000:
        import soxr

        audio = soxr.resample(audio, rate_hz, 16_000)
    return np.ascontiguousarray(audio.mean(axis=1), dtype=np.float32)


def _mel_filters(n_mels: int) -> np.ndarray:
    n_fft, sr = 400, 16_000
    fft_hz = np.linspace(0, sr / 2, n_fft // 2 + 1)

    def hz_to_mel(f):
        f = np.asarray(f, dtype=np.float64)
        lin = f / (200.0 / 3)
        log_start = 1000.0 / (200.0 / 3)
        return np.where(f >= 1000.0, log_start + np.log(np.maximum(f, 1e-10) / 1000.0) / (np.log(6.4) / 27.0), lin)

    def mel_to_hz(m):
        m = np.asarray(m, dtype=np.float64)
        log_start = 1000.0 / (200.0 / 3)
        return np.where(m >= log_start, 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - log_start)), m * (200.0 / 3))

    mel_pts = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(sr / 2), n_mels + 2))
    fdiff = np.diff(mel_pts)
    ramps = mel_pts[:, None] - fft_hz[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_pts[2 : n_mels + 2] - mel_pts[:n_mels]))[:, None]
    return weights.astype(np.float32)


def whisper_features(audio_16k: np.ndarray, n_mels: int = 80) -> np.ndarray:
    """[n_mels, 3000] float32 for the first 30 s of ``audio_16k`` (zero padded)."""
    try:
        from captioner.gpu import features_ref

        return np.asarray(features_ref.whisper_input_features(audio_16k, n_mels), dtype=np.float32)
    except ImportError:
        pass
    audio = np.zeros(N_SAMPLES_30S, np.float32)
    audio[: min(len(audio_16k), N_SAMPLES_30S)] = audio_16k[:N_SAMPLES_30S]
    padded = np.pad(audio, (200, 200), mode="reflect")
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)).astype(np.float32)
    n_frames = 1 + (len(padded) - 400) // 160
    idx = np.arange(400)[None, :] + 160 * np.arange(n_frames)[:, None]
    spec = np.fft.rfft(padded[idx] * window, axis=1)
    power = (np.abs(spec) ** 2)[:-1].T  # drop the last frame, as Whisper does -> 3000
    mel = _mel_filters(n_mels) @ power
    log_spec = np.log10(np.maximum(mel, 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).astype(np.float32)
