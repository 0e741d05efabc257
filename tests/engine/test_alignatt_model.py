"""AlignAtt with the real tiny.en model on the CPU (slow): word times and attention from the
alignment heads reach the hypothesis, JFK's first words are committed right, and minutes of
silence, room noise and music give no words."""

from __future__ import annotations

import numpy as np
import pytest

from captioner.engine.core import EngineConfig
from captioner.engine.live import LiveCaptioner, load_recognizer
from captioner.engine.policy import PolicyConfig, normalize_word
from captioner.engine.recognizer import WindowRequest
from captioner.engine.simulate import replay

pytestmark = pytest.mark.slow

JFK = "en_jfk_inaugural_excerpt"


@pytest.fixture(scope="module")
def cpu_model():
    return load_recognizer("tiny.en", "cpu")


def _words(text: str) -> list[str]:
    return [k for k in (normalize_word(t) for t in text.split()) if k]


def test_hypothesis_words_carry_attention_and_times(cpu_model, speech_clips):
    from captioner.audio.file_source import read_audio_16k
    from captioner.gpu.features_ref import log_mel_spectrogram

    _, recognizer = cpu_model
    audio = read_audio_16k(speech_clips[JFK].wav)[: 16_000 * 6]
    log_mel = np.asarray(log_mel_spectrogram(audio, n_mels=recognizer.n_mels))
    request = WindowRequest("s", log_mel, 10.0, "", None, alignment=True)
    plain = recognizer.decode([WindowRequest("s", log_mel, 10.0, "", None)])[0]
    timed = recognizer.decode([request])[0]
    assert [w.text for w in timed.words] == [w.text for w in plain.words] and len(timed.words) >= 8
    assert all(w.attend_s is not None for w in timed.words) and all(w.attend_s is None for w in plain.words)
    starts = [w.start_s for w in timed.words]
    assert all(b >= a for a, b in zip(starts, starts[1:]))
    assert all(10.0 <= w.start_s <= w.end_s <= timed.end_s + 1e-6 for w in timed.words)


def _replay(cpu_model, audio, kind="alignatt"):
    backend, recognizer = cpu_model
    config = EngineConfig(policy=PolicyConfig(kind=kind))
    return replay(lambda clock, timer: LiveCaptioner(recognizer=recognizer, backend=backend, config=config,
                                                     clock_ns=clock, timer_ns=timer),
                  {"s": audio}, compute=0.3)


def test_jfk_first_words_are_committed_right_and_the_lines_are_the_same_twice(cpu_model, speech_clips):
    runs = []
    for _ in range(2):
        result = _replay(cpu_model, speech_clips[JFK].wav)
        runs.append([(u.segment, u.text) for u in result.updates if u.kind == "final"])
    committed = _words(" ".join(text for _, text in runs[0]))
    assert committed[:4] == ["and", "so", "my", "fellow"], committed
    assert runs[0] == runs[1]  # a simulated clock with a fixed step cost: same commits, same lines


@pytest.mark.parametrize("kind", ["silence", "noise", "music"])
def test_a_minute_of_silence_noise_or_music_gives_no_words(cpu_model, kind):
    from captioner.audio.synthetic import noise, tone

    n_s = 60.0
    if kind == "silence":
        audio = np.zeros(int(n_s * 16_000), np.float32)
    elif kind == "noise":
        audio = noise(n_s, amplitude=10 ** (-40 / 20), seed=7)
    else:  # a C-major / A-minor / F / G progression, one chord per second
        chords = [(261.63, 329.63, 392.0), (220.0, 261.63, 329.63), (174.61, 220.0, 261.63), (196.0, 246.94, 293.66)]
        audio = np.concatenate([sum(tone(f, 1.0, amplitude=0.08) for f in chords[i % 4]) for i in range(int(n_s))])
    result = _replay(cpu_model, audio.astype(np.float32))
    assert not [u for u in result.updates if u.text.strip()]
