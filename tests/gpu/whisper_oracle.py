"""Float64 oracle of Whisper's feature formula, written independently of captioner.gpu.features_ref."""

from __future__ import annotations

import numpy as np


def whisper_log_mel_f64(audio: np.ndarray, n_mels: int) -> np.ndarray:
    """Whisper's log-mel formula written out independently in float64, as the oracle.

    ``torch.stft(center=True, pad_mode="reflect", window=hann_window(400))``, drop the last
    frame, ``|.|^2``, Slaney mel filters (librosa's formula, computed here from the mel-scale
    definition), ``log10(clamp(., 1e-10))``.
    """
    x = np.asarray(audio, dtype=np.float64)
    padded = np.concatenate([x[200:0:-1], x, x[-2:-202:-1]])  # reflect: edge sample not repeated
    n_frames = x.shape[0] // 160
    frames = np.stack([padded[160 * t : 160 * t + 400] for t in range(n_frames)])
    n = np.arange(400)
    window = np.sin(np.pi * n / 400) ** 2  # periodic Hann == 0.5 - 0.5 cos(2 pi n / 400)
    power = np.abs(np.fft.fft(frames * window, axis=-1)[:, :201]) ** 2
    return np.log10(np.maximum(slaney_filters_f64(n_mels) @ power.T, 1e-10))


def slaney_filters_f64(n_mels: int) -> np.ndarray:
    def to_mel(f):
        return f / (200 / 3) if f < 1000 else 15 + np.log(f / 1000) * 27 / np.log(6.4)

    def to_hz(m):
        return m * (200 / 3) if m < 15 else 1000 * np.exp((m - 15) * np.log(6.4) / 27)

    edges = [to_hz(m) for m in np.linspace(0, to_mel(8000.0), n_mels + 2)]
    filters = np.zeros((n_mels, 201))
    for m in range(n_mels):
        lo, mid, hi = edges[m : m + 3]
        for k in range(201):
            f = 40.0 * k
            tri = min((f - lo) / (mid - lo), (hi - f) / (hi - mid))
            filters[m, k] = max(tri, 0.0) * 2.0 / (hi - lo)
    return filters


def whisper_normalize_f64(log_mel: np.ndarray) -> np.ndarray:
    return (np.maximum(log_mel, log_mel.max() - 8.0) + 4.0) / 4.0


def kept(reference: np.ndarray) -> np.ndarray:
    """Cells Whisper keeps: within 8 (log10 units) of the utterance's peak. Below that the
    window clamp replaces them, and float32 FFT rounding (Whisper's own too) dominates."""
    return reference >= reference.max() - 8.0
