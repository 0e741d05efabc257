"""VAD on log-mel frames: real speech is found, silence and steady noise are not speech."""

from __future__ import annotations

import numpy as np
import pytest

from captioner.engine.vad import (
    FULL_SCALE_SINE_DB,
    VoiceActivity,
    band_energy_db,
    speech_band,
)
from captioner.gpu import features_ref as ref

SR = 16_000


def energies(audio):
    return band_energy_db(np, ref.log_mel_spectrogram(audio.astype(np.float32)), speech_band(80))


def test_full_scale_sine_reads_zero_db():
    t = np.arange(SR) / SR
    e = energies(np.sin(2 * np.pi * 1000 * t))
    assert abs(float(np.median(e))) < 0.1
    e20 = energies(0.1 * np.sin(2 * np.pi * 1000 * t))
    assert abs(float(np.median(e20)) + 20.0) < 0.1
    assert FULL_SCALE_SINE_DB > 0


def test_speech_band_excludes_hum_and_hiss():
    first, stop = speech_band(80)
    assert 0 < first < stop < 80


def test_speech_found_between_silences(speech_clips):
    import soundfile as sf

    clip = speech_clips["en_ls_1089-134691-0001"]
    speech, rate = sf.read(clip.wav, dtype="float32")
    assert rate == SR
    rng = np.random.default_rng(0)
    pad = (rng.standard_normal(2 * SR) * 10 ** (-65 / 20)).astype(np.float32)  # a quiet room
    audio = np.concatenate([pad, speech, pad])
    vad = VoiceActivity()
    flags = np.concatenate([vad.push(chunk) for chunk in np.array_split(energies(audio), 37)])
    frames = flags.shape[0]
    before = flags[: 2 * 100 - 10]
    inside = flags[2 * 100 + 50 : 2 * 100 + len(speech) // 160 - 50]
    after = flags[frames - 2 * 100 + 40 :]
    assert not before.any()
    assert inside.mean() > 0.8
    assert not after.any()
    assert vad.silence_frames() >= 150


def test_steady_noise_becomes_floor_not_speech():
    rng = np.random.default_rng(1)
    noise = (rng.standard_normal(8 * SR) * 0.05).astype(np.float32)  # loud fan, -26 dBFS
    vad = VoiceActivity()
    flags = vad.push(energies(noise))
    # At most a short onset while the floor adapts; then nothing.
    assert flags[300:].sum() == 0


def test_silence_is_never_speech():
    vad = VoiceActivity()
    assert not vad.push(energies(np.zeros(3 * SR, np.float32))).any()


@pytest.mark.gpu
def test_band_energy_same_on_cupy():
    from captioner.gpu.backend import get_backend

    backend = get_backend("cuda:0")
    t = np.arange(SR) / SR
    log_mel = ref.log_mel_spectrogram((0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32))
    on_gpu = backend.asnumpy(band_energy_db(backend.xp, backend.asarray(log_mel), speech_band(80)))
    np.testing.assert_allclose(on_gpu, band_energy_db(np, log_mel, speech_band(80)), atol=1e-3)
