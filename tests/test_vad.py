"""VAD on log-mel frames: real speech is found, silence, steady noise and music are not speech."""

from __future__ import annotations

import numpy as np
import pytest

from captioner.engine.vad import (
    FULL_SCALE_SINE_DB,
    VadConfig,
    VoiceActivity,
    band_energy_db,
    spectral_change_db,
    speech_band,
)
from captioner.gpu import features_ref as ref

SR = 16_000


def energies(audio):
    return band_energy_db(np, ref.log_mel_spectrogram(audio.astype(np.float32)), speech_band(80))


def changes(audio):
    """Spectral change per frame as the engine measures it (its first frame stands in for the
    frames before the stream)."""
    lag = VadConfig().change_lag_frames
    log_mel = ref.log_mel_spectrogram(audio.astype(np.float32))
    log_mel = np.concatenate([np.repeat(log_mel[:, :1], lag, axis=1), log_mel], axis=1)
    return spectral_change_db(np, log_mel, speech_band(80), lag, VadConfig().change_range_db)


def no_speech_audio(kind: str) -> np.ndarray:
    """The latency benchmark's minutes without speech (benchmarks/no_speech.py)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "no_speech.py"
    spec = importlib.util.spec_from_file_location("no_speech", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.no_speech_audio(kind)


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


@pytest.mark.parametrize("kind", ["music", "music-drums"])
def test_music_is_loud_enough_for_the_energy_test_but_not_speech(kind):
    """The energy test alone takes most of a minute of music for speech (the chords' and the
    melody's tones lie in the speech band); with the spectral change, the chords have no
    speech-like frame, the drums fewer than the 0.3 s a segment needs before its first update."""
    audio = no_speech_audio(kind)
    energy_only = VoiceActivity()
    assert energy_only.push(energies(audio)).mean() > 0.8
    vad = VoiceActivity()
    flags = vad.push(energies(audio), changes(audio))
    assert vad.voiced_frames < 30, vad.voiced_frames
    if kind == "music":
        assert not flags.any()


def test_the_articulation_tests_take_no_speech_from_real_recordings(speech_clips):
    """Every recording (English, German, Mandarin), after half a second of a quiet room: the same
    speech-like frames, frame for frame, with the spectral change as with energy alone."""
    rng = np.random.default_rng(3)
    for clip in speech_clips.values():
        from captioner.audio.file_source import read_audio_16k

        room = (rng.standard_normal(SR // 2) * 10 ** (-70 / 20)).astype(np.float32)
        audio = np.concatenate([room, read_audio_16k(clip.wav), room, room])
        energy_only, gated = VoiceActivity(), VoiceActivity()
        want = energy_only.push(energies(audio))
        got = gated.push(energies(audio), changes(audio))
        assert gated.voiced_frames == energy_only.voiced_frames and np.array_equal(got, want), clip.id
        assert gated.articulated_share > 0.9, clip.id


@pytest.mark.gpu
def test_band_energy_same_on_cupy():
    from captioner.gpu.backend import get_backend

    backend = get_backend("cuda:0")
    t = np.arange(SR) / SR
    log_mel = ref.log_mel_spectrogram((0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32))
    on_gpu = backend.asnumpy(band_energy_db(backend.xp, backend.asarray(log_mel), speech_band(80)))
    np.testing.assert_allclose(on_gpu, band_energy_db(np, log_mel, speech_band(80)), atol=1e-3)
    change = spectral_change_db(backend.xp, backend.asarray(log_mel), speech_band(80), 4, 40.0)
    np.testing.assert_allclose(backend.asnumpy(change), spectral_change_db(np, log_mel, speech_band(80), 4, 40.0),
                               atol=1e-3)


def _word_ends(audio: np.ndarray) -> list[int]:
    """Frames where a loud stretch of ``audio`` (the energy test's speech) ends."""
    vad = VoiceActivity()
    frames = []
    for i, e in enumerate(energies(audio)):
        before = vad.last_voiced_frame
        vad.push(np.array([e]))
        if before >= 0 and before == i - 1 and vad.last_voiced_frame != i:
            frames.append(i)
    return frames


def test_words_after_digital_silence_keep_their_first_frames(speech_clips):
    """A telephone line (or a muted-between-words microphone) sends digital silence between words:
    its spectrum never changes, and it must not count against the articulation of the word that
    follows. Every 10 ms frame of a read recording under -45 dBFS is zeroed, as such a line does."""
    from captioner.audio.file_source import read_audio_16k

    audio = read_audio_16k(speech_clips["en_ls_1089-134691-0001"].wav).copy()
    frames = audio[: audio.shape[0] // 160 * 160].reshape(-1, 160)
    quiet = np.sqrt(np.mean(frames ** 2, axis=1)) < 10 ** (-45 / 20)
    frames[quiet] = 0.0
    audio = np.concatenate([np.zeros(SR // 2, np.float32), frames.reshape(-1), np.zeros(SR // 2, np.float32)])
    assert quiet.sum() > 50  # the gate cut the recording into many bursts
    energy_only, gated = VoiceActivity(), VoiceActivity()
    want = energy_only.push(energies(audio))
    got = gated.push(energies(audio), changes(audio))
    assert gated.voiced_frames == energy_only.voiced_frames
    assert np.array_equal(got, want)


def test_a_held_vowel_inside_speech_is_speech_but_a_held_sound_alone_is_not(speech_clips):
    """A filled pause or a drawn-out vowel holds its spectral shape as a note does: straight after
    a word it is still speech (up to ``held_max_frames``); the same sound after a pause is not."""
    from captioner.audio.file_source import read_audio_16k

    speech = read_audio_16k(speech_clips["en_ls_1089-134691-0001"].wav)
    end = (next(f for f in _word_ends(speech) if f > 50) - 3) * 160  # inside the word's last loud frames
    # A vowel held still, at the level of the word before it: harmonics of 125 Hz under the
    # formants of "ah" (700 and 1200 Hz), 0.4 s.
    t = np.arange(int(0.4 * SR)) / SR
    held = sum(np.sin(2 * np.pi * 125 * k * t) / (1 + ((125 * k - 700) / 150) ** 2 + ((125 * k - 1200) / 300) ** 2)
               for k in range(1, 30))
    level = np.sqrt(np.mean(speech[end - 1600:end] ** 2))
    held = (held * level / np.sqrt(np.mean(held ** 2))).astype(np.float32)
    room = lambda s: (np.random.default_rng(5).standard_normal(int(s * SR)) * 10 ** (-70 / 20)).astype(np.float32)
    inside = np.concatenate([room(0.5), speech[:end], held, room(0.5)]).astype(np.float32)
    alone = np.concatenate([room(0.5), speech[:end], room(1.0), held, room(0.5)]).astype(np.float32)
    held_frames = held.shape[0] // 160
    # The held sound fails the articulation count on its own (the premise of the test).
    assert (changes(held) < VadConfig().change_db)[8:].mean() > 0.8
    for audio, want_held in ((inside, True), (alone, False)):
        energy_only, gated = VoiceActivity(), VoiceActivity()
        energy_only.push(energies(audio))
        gated.push(energies(audio), changes(audio))
        lost = energy_only.voiced_frames - gated.voiced_frames
        if want_held:
            assert lost == 0, lost
        else:
            assert lost >= held_frames // 2, lost
