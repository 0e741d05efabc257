"""The NumPy specification against Whisper's formula (a float64 oracle) on real speech."""

from __future__ import annotations

import numpy as np
import pytest
from whisper_oracle import (
    kept,
    slaney_filters_f64,
    whisper_log_mel_f64,
    whisper_normalize_f64,
)

from captioner.errors import UserError
from captioner.gpu import features_ref as ref


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_are_slaney_triangles(n_mels):
    filters = ref.mel_filters(n_mels)
    assert filters.shape == (n_mels, 201) and filters.dtype == np.float32
    assert (filters >= 0).all()
    np.testing.assert_allclose(filters, slaney_filters_f64(n_mels), rtol=1e-6, atol=1e-9)
    peaks = filters.argmax(axis=1)
    assert (np.diff(peaks) >= 0).all()  # ordered by frequency
    assert peaks[0] <= 2 and np.flatnonzero(filters[-1])[-1] >= 199  # spanning 0 Hz .. Nyquist
    for row in filters:  # one contiguous triangle each
        support = np.flatnonzero(row)
        assert support.size >= 1 and (np.diff(support) == 1).all()
    # Slaney normalisation: unit area in Hz wherever a filter spans enough 40 Hz bins to tell.
    edges = ref.mel_to_hz(np.linspace(0, ref.hz_to_mel(8000.0), n_mels + 2))
    wide = (edges[2:] - edges[:-2]) >= 200.0
    np.testing.assert_allclose(filters[wide].sum(axis=1) * 40.0, 1.0, atol=0.05)


def test_mel_filter_linear_region_by_hand():
    # 80 mels: edges 45.2456 / 81 mel apart, 200/3 Hz per mel below 1 kHz -> 37.24 Hz apart.
    step_hz = ref.hz_to_mel(8000.0) / 81 * 200 / 3
    falling_at_40_hz = (2 * step_hz - 40.0) / step_hz
    expected = falling_at_40_hz * 2.0 / (2 * step_hz)
    assert ref.mel_filters(80)[0, 1] == pytest.approx(expected, rel=1e-6)
    assert ref.mel_to_hz(ref.hz_to_mel(np.array([0.0, 500.0, 1000.0, 4321.0]))) == pytest.approx([0, 500, 1000, 4321])


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_match_transformers_when_installed(n_mels):
    audio_utils = pytest.importorskip("transformers.audio_utils")
    theirs = audio_utils.mel_filter_bank(
        num_frequency_bins=201, num_mel_filters=n_mels, min_frequency=0.0, max_frequency=8000.0,
        sampling_rate=16000, norm="slaney", mel_scale="slaney",
    )
    np.testing.assert_allclose(ref.mel_filters(n_mels), theirs.T, rtol=1e-5, atol=1e-8)


def test_hann_window_is_periodic():
    w = ref.hann_window()
    assert w.shape == (400,) and w[0] == 0.0 and w[200] == pytest.approx(1.0)
    np.testing.assert_allclose(w[1:], w[1:][::-1], atol=1e-7)  # w[n] == w[400 - n]


@pytest.mark.parametrize("n_mels", [80, 128])
def test_log_mel_matches_whisper_formula_on_real_speech(speech_audio, n_mels):
    worst_kept = worst_normalized = 0.0
    for clip_id, audio in speech_audio.items():
        ours = ref.log_mel_spectrogram(audio, n_mels)
        oracle = whisper_log_mel_f64(audio, n_mels)
        assert ours.shape == oracle.shape == (n_mels, audio.shape[0] // 160), clip_id
        assert ours.dtype == np.float32
        worst_kept = max(worst_kept, float(np.abs(ours - oracle)[kept(oracle)].max()))
        worst_normalized = max(
            worst_normalized, float(np.abs(ref.whisper_normalize(ours) - whisper_normalize_f64(oracle)).max())
        )
    assert worst_kept < 1e-4
    assert worst_normalized < 1e-4


def test_padding_samples_appends_zeros(speech_audio):
    audio = speech_audio["en_ls_1089-134691-0000"]
    padded = ref.log_mel_spectrogram(audio, 80, padding_samples=16000)
    assert padded.shape[1] == (audio.shape[0] + 16000) // 160
    oracle = whisper_log_mel_f64(np.concatenate([audio, np.zeros(16000, np.float32)]), 80)
    assert np.abs(padded - oracle)[kept(oracle)].max() < 1e-4


@pytest.mark.parametrize("n_mels", [80, 128])
def test_whisper_input_features_is_a_padded_30_s_window(speech_audio, n_mels):
    for clip_id in ["en_ls_1089-134686-0000", "en_sonnet001_librivox"]:  # 10 s (padded), 53 s (cut)
        audio = speech_audio[clip_id]
        features = ref.whisper_input_features(audio, n_mels)
        assert features.shape == (n_mels, 3000) and features.dtype == np.float32
        window = np.zeros(480_000, np.float32)
        n = min(audio.shape[0], 480_000)
        window[:n] = audio[:n]
        oracle = whisper_normalize_f64(whisper_log_mel_f64(window, n_mels))
        assert np.abs(features - oracle).max() < 1e-4, clip_id
        assert features.max() == pytest.approx((oracle.max()), abs=1e-4)
        assert features.min() >= features.max() - 2.0 - 1e-6  # the max - 8 clamp, scaled by 1/4


def test_whisper_input_features_match_transformers_when_installed(speech_audio):
    transformers = pytest.importorskip("transformers")
    extractor = transformers.WhisperFeatureExtractor(feature_size=80)
    audio = speech_audio["en_ls_1089-134686-0000"]
    theirs = extractor(audio, sampling_rate=16000, return_tensors="np").input_features[0]
    assert np.abs(ref.whisper_input_features(audio, 80) - theirs).max() < 1e-4


def test_speaker_filters_are_slaney_bands_of_unit_area():
    # resemblyzer's front end: librosa's 40 Slaney bands from 0 Hz to 8 kHz over the 201 bins.
    filters = ref.speaker_filters().astype(np.float64)
    assert filters.shape == (40, ref.N_BINS)
    edges_hz = ref.mel_band_edges_hz(40)
    mel = ref.hz_to_mel(edges_hz)
    np.testing.assert_allclose(np.diff(mel), np.diff(mel)[0], rtol=1e-9)  # equally spaced in mel
    assert edges_hz[0] == 0.0 and abs(edges_hz[-1] - 8000.0) < 1e-6
    bins_hz = np.arange(ref.N_BINS) * 40.0
    peaks_hz = bins_hz[filters.argmax(axis=1)]
    assert np.all(np.abs(peaks_hz - edges_hz[1:-1]) <= 40.0)  # each peaks at its centre edge
    # Unit area (Slaney's norm): the triangle's area, 2 / width * width / 2, sampled every 40 Hz;
    # the narrow low bands (under two bins wide) are sampled too coarsely to hold it.
    widths_hz = edges_hz[2:] - edges_hz[:-2]
    wide = widths_hz > 200.0
    np.testing.assert_allclose((filters.sum(axis=1) * 40.0)[wide], 1.0, rtol=0.05)
    audio = np.random.default_rng(3).standard_normal(16000).astype(np.float32)
    np.testing.assert_allclose(ref.speaker_log_mel(audio), np.log10(np.maximum(
        ref.speaker_filters() @ ref.power_spectrum(audio), 1e-10)), atol=1e-6)


@pytest.mark.parametrize(
    "call",
    [
        lambda: ref.log_mel_spectrogram(np.array([0.0, np.nan] * 400, np.float32)),
        lambda: ref.log_mel_spectrogram(np.zeros((2, 800), np.float32)),
        lambda: ref.log_mel_spectrogram(np.zeros(100, np.float32)),
        lambda: ref.log_mel_spectrogram(np.zeros(800, np.float32), n_mels=64),
    ],
)
def test_bad_input_is_a_user_error(call):
    with pytest.raises(UserError):
        call()
