"""NumPy specification of the features: Whisper's log-mel spectrogram and the speaker encoder's bands.

This module is the definition the GPU kernels (``captioner.gpu.features``) are tested against.
It follows OpenAI Whisper's ``log_mel_spectrogram`` (``whisper/audio.py``) step by step:

* 16 kHz audio, frames of ``N_FFT = 400`` samples (25 ms) every ``HOP = 160`` samples (10 ms);
* a periodic Hann window (``torch.hann_window(400)``: ``0.5 - 0.5 cos(2 pi n / 400)``);
* ``center=True`` with reflect padding: 200 samples mirrored in at each end (the edge sample
  itself is not repeated), so frame ``t`` is centred on sample ``160 t``;
* the power spectrum ``|rfft|^2`` (201 bins), with the last STFT frame dropped, so ``N``
  samples give ``N // 160`` frames;
* Slaney-style mel filters (the ``librosa.filters.mel`` default that Whisper's bundled
  ``mel_filters.npz`` was made with: Slaney's mel scale, area normalisation), 80 or 128 bands;
* ``log10(max(mel, 1e-10))``.

Whisper then clamps a whole window to ``max - 8`` and scales it by ``(x + 4) / 4``; here that
is :func:`whisper_normalize`, applied when a window is handed to a model, so the streaming
features stay raw and every window can be normalised on its own.

The speaker encoder (resemblyzer's voice encoder, :mod:`captioner.models.speaker`) takes 40
mel bands of the same frames: librosa's ``melspectrogram`` defaults that resemblyzer uses are
these very frames (``n_fft`` 400, hop 160, periodic Hann, centred, power 2) and Slaney filters of
40 bands from 0 Hz to Nyquist; it takes linear power, and the rings keep ``log10`` of it
(:func:`speaker_log_mel`), as they keep Whisper's.
"""

from __future__ import annotations

import functools

import numpy as np

from captioner.errors import UserError
from captioner.events import FRAME_SAMPLES, SAMPLE_RATE_HZ, WINDOW_FRAMES, WINDOW_S

N_FFT = 400
HOP = FRAME_SAMPLES  # 160: the features' hop is the pipeline's 10 ms frame
N_BINS = N_FFT // 2 + 1  # 201 rfft bins, 0 .. 8 kHz in 40 Hz steps
CHUNK_S = WINDOW_S
CHUNK_SAMPLES = CHUNK_S * SAMPLE_RATE_HZ  # 480_000: one Whisper window
CHUNK_FRAMES = WINDOW_FRAMES  # 3000
LOG_FLOOR = 1e-10  # Whisper's clamp before log10
SUPPORTED_N_MELS = (80, 128)  # 80 for Whisper up to large-v2, 128 for large-v3
SPEAKER_BANDS = 40  # the voice encoder's mel bands

# Slaney's mel scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above.
_F_SP_HZ = 200.0 / 3.0
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP_HZ  # 15 mels
_LOG_STEP = np.log(6.4) / 27.0


def hz_to_mel(freq_hz):
    """Slaney mel scale (librosa's default, ``htk=False``)."""
    freq_hz = np.asarray(freq_hz, dtype=np.float64)
    linear = freq_hz / _F_SP_HZ
    log_part = _MIN_LOG_MEL + np.log(np.maximum(freq_hz, _MIN_LOG_HZ) / _MIN_LOG_HZ) / _LOG_STEP
    return np.where(freq_hz >= _MIN_LOG_HZ, log_part, linear)


def mel_to_hz(mel):
    mel = np.asarray(mel, dtype=np.float64)
    linear = mel * _F_SP_HZ
    log_part = _MIN_LOG_HZ * np.exp(_LOG_STEP * (mel - _MIN_LOG_MEL))
    return np.where(mel >= _MIN_LOG_MEL, log_part, linear)


def _check_n_mels(n_mels: int) -> int:
    if n_mels not in SUPPORTED_N_MELS:
        raise UserError(f"n_mels must be one of {SUPPORTED_N_MELS}, got {n_mels}")
    return int(n_mels)


def mel_band_edges_hz(n_mels: int) -> np.ndarray:
    """The ``n_mels + 2`` edges of the mel filters, equally spaced in (Slaney) mel from 0 Hz to
    Nyquist: band ``m`` spans edges ``m .. m + 2`` and peaks at edge ``m + 1``."""
    return mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(SAMPLE_RATE_HZ / 2), n_mels + 2))


@functools.lru_cache(maxsize=4)
def _mel_filters64(n_mels: int) -> np.ndarray:
    # Filter m rises from edge m to edge m+1 and falls to edge m+2, scaled by
    # 2 / (width in Hz) so each has unit area.
    edges_hz = mel_band_edges_hz(n_mels)
    bins_hz = np.arange(N_BINS, dtype=np.float64) * (SAMPLE_RATE_HZ / N_FFT)
    lower, centre, upper = edges_hz[:-2, None], edges_hz[1:-1, None], edges_hz[2:, None]
    rising = (bins_hz[None, :] - lower) / (centre - lower)
    falling = (upper - bins_hz[None, :]) / (upper - centre)
    weights = np.maximum(0.0, np.minimum(rising, falling))
    weights *= (2.0 / (upper - lower))
    return weights


def mel_filters(n_mels: int = 80) -> np.ndarray:
    """Slaney mel filter bank, ``[n_mels, 201]`` float32 (what Whisper multiplies by)."""
    weights = _mel_filters64(_check_n_mels(n_mels)).astype(np.float32)
    weights.flags.writeable = False
    return weights


def speaker_filters() -> np.ndarray:
    """The speaker encoder's Slaney mel filter bank, ``[40, 201]`` float32 (librosa's
    ``filters.mel(sr=16000, n_fft=400, n_mels=40)``, which resemblyzer's front end uses)."""
    weights = _mel_filters64(SPEAKER_BANDS).astype(np.float32)
    weights.flags.writeable = False
    return weights


def hann_window() -> np.ndarray:
    """Periodic Hann window of ``N_FFT`` samples, float32 (``torch.hann_window(400)``)."""
    n = np.arange(N_FFT, dtype=np.float64)
    return (0.5 - 0.5 * np.cos(2.0 * np.pi * n / N_FFT)).astype(np.float32)


def _as_audio(audio) -> np.ndarray:
    samples = np.asarray(audio)
    if samples.ndim != 1:
        raise UserError(f"audio must be one channel (1-D), got shape {samples.shape}")
    if samples.dtype.kind not in "fiu":
        raise UserError(f"audio must be numeric samples, got dtype {samples.dtype}")
    samples = samples.astype(np.float32, copy=False)
    if not np.all(np.isfinite(samples)):
        raise UserError("audio contains NaN or infinite samples")
    return samples


def power_spectrum(audio_16k, padding_samples: int = 0) -> np.ndarray:
    """``|STFT|^2`` as Whisper computes it: ``[201, len // 160]`` float32 (last frame dropped)."""
    samples = _as_audio(audio_16k)
    if padding_samples < 0:
        raise UserError(f"padding_samples must be >= 0, got {padding_samples}")
    if padding_samples:
        samples = np.concatenate([samples, np.zeros(padding_samples, np.float32)])
    if samples.shape[0] <= N_FFT // 2:
        # torch.stft's reflect padding needs more samples than the pad width.
        raise UserError(f"audio too short for features: {samples.shape[0]} samples, need > {N_FFT // 2}")
    padded = np.pad(samples, N_FFT // 2, mode="reflect")
    n_frames = samples.shape[0] // HOP  # 1 + len // HOP frames, minus the dropped last one
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[: n_frames * HOP : HOP]
    spectrum = np.fft.rfft(frames * hann_window(), axis=-1)
    power = spectrum.real.astype(np.float32) ** 2 + spectrum.imag.astype(np.float32) ** 2
    return np.ascontiguousarray(power.T)


def log_mel_spectrogram(audio_16k, n_mels: int = 80, padding_samples: int = 0) -> np.ndarray:
    """Raw log-mel frames ``[n_mels, n_frames]`` float32: ``log10(max(mel, 1e-10))``.

    ``padding_samples`` zeros are appended first (Whisper's ``padding`` argument).
    """
    filters = mel_filters(n_mels)
    mel = filters @ power_spectrum(audio_16k, padding_samples)
    return np.log10(np.maximum(mel, np.float32(LOG_FLOOR))).astype(np.float32)


def whisper_normalize(log_mel) -> np.ndarray:
    """Whisper's window normalisation: clamp to ``max - 8``, then ``(x + 4) / 4``.

    Generic over NumPy/CuPy (uses the array's own methods), so a device window stays on the
    device. The maximum is taken over the whole window (or over each window of a batch
    ``[B, n_mels, frames]``, like Hugging Face's batched extractor).
    """
    if log_mel.ndim == 3:
        peak = log_mel.max(axis=(1, 2), keepdims=True)
    else:
        peak = log_mel.max()
    return (log_mel.clip(min=peak - 8.0) + 4.0) / 4.0


def pad_or_trim(audio_16k, length: int = CHUNK_SAMPLES) -> np.ndarray:
    """Zero-pad or cut audio to ``length`` samples (Whisper's ``pad_or_trim``)."""
    samples = _as_audio(audio_16k)
    if samples.shape[0] >= length:
        return samples[:length]
    return np.concatenate([samples, np.zeros(length - samples.shape[0], np.float32)])


def whisper_input_features(audio_16k, n_mels: int = 80) -> np.ndarray:
    """The ``[n_mels, 3000]`` float32 input of Whisper's encoder for (up to) 30 s of audio.

    As Whisper's ``log_mel_spectrogram(pad_or_trim(audio))`` and Hugging Face's
    ``WhisperFeatureExtractor`` (``padding="max_length"``) prepare a window: the audio is
    zero-padded (or cut) to 480 000 samples, the reflect-padded STFT gives 3001 frames of which
    the last is dropped, and the window is normalised with its own maximum.
    """
    return whisper_normalize(log_mel_spectrogram(pad_or_trim(audio_16k), n_mels)).astype(np.float32)


def speaker_log_mel(audio_16k) -> np.ndarray:
    """The speaker encoder's bands ``[40, n_frames]`` float32, ``log10(max(mel, 1e-10))`` of the
    same frames as :func:`log_mel_spectrogram` (``10 **`` of it is the linear power the encoder
    takes)."""
    mel = speaker_filters() @ power_spectrum(audio_16k)
    return np.log10(np.maximum(mel, np.float32(LOG_FLOOR))).astype(np.float32)
