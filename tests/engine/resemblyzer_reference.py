"""resemblyzer's front end and utterance embedding, written out here from its parameters, with
no librosa: the reference the engine's speaker path is compared with.

What resemblyzer 0.1.4 does (``audio.py``, ``hparams.py``, ``voice_encoder.py``), read, not run:

* ``normalize_volume(wav, -30, increase_only=True)``: the RMS level is raised to -30 dBFS,
  never lowered (``trim_long_silences``, webrtcvad's cut of long silences, is left out: the
  recordings compared have none to speak of);
* ``librosa.feature.melspectrogram(y, sr=16000, n_fft=400, hop_length=160, n_mels=40)``: frames
  centred every 160 samples (reflect-padded by 200 at each end, librosa 0.9's default; all
  ``1 + n // 160`` frames kept), a periodic Hann window of 400, power ``|rfft|^2``, Slaney mel
  filters of 40 bands over 0-8 kHz with area normalisation; no log;
* ``embed_utterance(wav, rate=1.3, min_coverage=0.75)``: partials of 160 frames every
  ``round(16000 / 1.3 / 160) = 77`` frames over ``ceil((n + 1) / 160)`` frames; the last is kept
  only if the audio covers at least 75 % of it (unless it is the only one), the audio
  zero-padded to the last partial's end; the embedding is the mean of the partials' embeddings,
  scaled to unit length.
"""

from __future__ import annotations

import numpy as np

from captioner.models.speaker import reference as network

RATE_HZ = 16000
HOP = 160
N_FFT = 400
PARTIAL_FRAMES = 160
TARGET_DBFS = -30.0


def normalize_volume(wav: np.ndarray) -> np.ndarray:
    rms = np.sqrt(np.mean(wav.astype(np.float64) ** 2))
    change_db = TARGET_DBFS - 20.0 * np.log10(rms)
    return wav if change_db < 0 else wav * 10.0 ** (change_db / 20.0)


def _mel(hz):
    hz = np.asarray(hz, np.float64)
    return np.where(hz < 1000.0, hz * 3.0 / 200.0, 15.0 + 27.0 * np.log(np.maximum(hz, 1e-9) / 1000.0) / np.log(6.4))


def _hz(mel):
    mel = np.asarray(mel, np.float64)
    return np.where(mel < 15.0, mel * 200.0 / 3.0, 1000.0 * np.exp((mel - 15.0) * np.log(6.4) / 27.0))


def slaney_filters(n_mels: int = 40) -> np.ndarray:
    edges = _hz(np.linspace(_mel(0.0), _mel(RATE_HZ / 2), n_mels + 2))
    bins = np.linspace(0, RATE_HZ / 2, N_FFT // 2 + 1)
    out = np.zeros((n_mels, bins.size))
    for m in range(n_mels):
        lo, mid, hi = edges[m], edges[m + 1], edges[m + 2]
        up, down = (bins - lo) / (mid - lo), (hi - bins) / (hi - mid)
        out[m] = np.maximum(0.0, np.minimum(up, down)) * 2.0 / (hi - lo)
    return out


def mel_spectrogram(wav: np.ndarray) -> np.ndarray:
    """``[frames, 40]`` linear mel power, as resemblyzer's ``wav_to_mel_spectrogram``."""
    x = np.asarray(wav, np.float64)
    padded = np.concatenate([x[N_FFT // 2:0:-1], x, x[-2:-N_FFT // 2 - 2:-1]])
    n_frames = 1 + x.shape[0] // HOP
    window = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(N_FFT) / N_FFT)
    frames = np.stack([padded[HOP * t: HOP * t + N_FFT] for t in range(n_frames)])
    power = np.abs(np.fft.rfft(frames * window, axis=1)) ** 2
    return power @ slaney_filters().T


def partial_starts(n_samples: int, rate: float = 1.3, min_coverage: float = 0.75) -> list[int]:
    n_frames = int(np.ceil((n_samples + 1) / HOP))
    step = int(np.round(RATE_HZ / rate / HOP))
    starts = list(range(0, max(1, n_frames - PARTIAL_FRAMES + step + 1), step))
    coverage = (n_samples - starts[-1] * HOP) / (PARTIAL_FRAMES * HOP)
    if coverage < min_coverage and len(starts) > 1:
        starts.pop()
    return starts


def embed_utterance(weights, wav: np.ndarray) -> np.ndarray:
    """resemblyzer's ``VoiceEncoder.embed_utterance`` of ``wav`` (16 kHz), in float64."""
    wav = normalize_volume(np.asarray(wav, np.float64))
    starts = partial_starts(wav.shape[0])
    end = (starts[-1] + PARTIAL_FRAMES) * HOP
    if end >= wav.shape[0]:
        wav = np.pad(wav, (0, end - wav.shape[0]))
    mel = mel_spectrogram(wav)
    partials = np.stack([mel[s:s + PARTIAL_FRAMES] for s in starts])
    embeddings = network.embed_partials(weights, partials)
    mean = embeddings.mean(axis=0)
    return mean / np.linalg.norm(mean)
