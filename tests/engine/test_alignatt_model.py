"""AlignAtt with the real tiny.en model on the CPU (slow): word times and attention from the
alignment heads reach the hypothesis, JFK's first words are committed right, and minutes of
silence, room noise and music give no words under every policy, at the H200's step cost and at
the CPU's, while a one-word answer and a short sentence are still captioned."""

from __future__ import annotations

import numpy as np
import pytest

from captioner.engine.core import EngineConfig
from captioner.engine.live import LiveCaptioner
from captioner.engine.policy.config import PolicyConfig
from captioner.engine.policy.presets import preset
from captioner.engine.policy.words import normalize_word
from captioner.engine.recognizer import WindowRequest
from captioner.engine.scheduler import SchedulerConfig
from captioner.engine.simulate import replay
from captioner.engine.vad import VadConfig

pytestmark = pytest.mark.slow

JFK = "en_jfk_inaugural_excerpt"


@pytest.fixture(scope="module")
def cpu_model(tiny_en_cpu):
    return tiny_en_cpu  # conftest: loaded once a session


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


def test_jfk_first_words_are_committed_right_and_the_lines_are_the_same_twice(cpu_model, alignatt_replay):
    # conftest's two replays of JFK (this module's _replay, made once a session: the word-time
    # tests read the same ones)
    runs = [[(u.segment, u.text) for u in alignatt_replay(cpu_model, JFK, run) if u.kind == "final"]
            for run in (0, 1)]
    committed = _words(" ".join(text for _, text in runs[0]))
    assert committed[:4] == ["and", "so", "my", "fellow"], committed
    assert runs[0] == runs[1]  # a simulated clock with a fixed step cost: same commits, same lines


@pytest.mark.parametrize("kind", ["silence", "noise"])
def test_a_minute_of_silence_or_noise_gives_no_words(cpu_model, kind):
    from captioner.audio.synthetic import noise

    n_s = 60.0
    if kind == "silence":
        audio = np.zeros(int(n_s * 16_000), np.float32)
    else:
        audio = noise(n_s, amplitude=10 ** (-40 / 20), seed=7)
    result = _replay(cpu_model, audio.astype(np.float32))
    assert not [u for u in result.updates if u.text.strip()]


def _no_speech_audio(kind: str) -> np.ndarray:
    """The latency benchmark's minutes without speech (benchmarks/no_speech.py)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "no_speech.py"
    spec = importlib.util.spec_from_file_location("no_speech", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.no_speech_audio(kind)


# What a model step costs on the clock, with the update interval that goes with it: the H200's
# tiny.en step (40 ms, the alignatt-gpu preset's 0.5 s updates) and this CPU's (500 ms, 1 s).
# Where the windows fall depends on both: a rule that held at one cost failed at the other.
TIMINGS = [pytest.param(0.04, 0.5, id="40ms-step"), pytest.param(0.5, 1.0, id="500ms-step")]
POLICIES = ["localagreement", "alignatt", "alignatt-gpu"]


def _replay_timed(cpu_model, audio, policy: str, step_s: float, interval_s: float, vad: VadConfig | None = None,
                  tick_s: float = 0.01):
    backend, recognizer = cpu_model
    config = EngineConfig(policy=preset(policy), scheduler=SchedulerConfig(base_interval_s=interval_s),
                          vad=vad or VadConfig())
    return replay(lambda clock, timer: LiveCaptioner(recognizer=recognizer, backend=backend, config=config,
                                                     clock_ns=clock, timer_ns=timer),
                  {"s": audio}, compute=step_s, tick_s=tick_s)


@pytest.fixture(scope="module")
def music():
    return {kind: _no_speech_audio(kind) for kind in ("music", "music-drums")}


@pytest.mark.parametrize("step_s, interval_s", TIMINGS)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("kind", ["music", "music-drums"])
def test_a_minute_of_music_shows_no_word(cpu_model, music, kind, policy, step_s, interval_s):
    """The bench's chords (on which Whisper said " you": shown by every policy on the H200,
    committed by LocalAgreement) and its melody with drums: no word is shown or committed."""
    # 100 ms blocks, as a capture device delivers them: a minute costs a tenth of the engine
    # steps of 10 ms ticks.
    result = _replay_timed(cpu_model, music[kind], policy, step_s, interval_s, tick_s=0.1)
    shown = [(u.kind, u.text, u.emitted_audio_s) for u in result.updates if u.text.strip()]
    assert not shown, (result.steps, shown)


@pytest.fixture(scope="module")
def one_word_answers():
    """"Yes." and "You." spoken by espeak-ng, after half a second of a quiet room and before two."""
    import shutil
    import subprocess
    import tempfile

    from captioner.audio.file_source import read_audio_16k

    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    rng = np.random.default_rng(5)
    room = lambda s: (rng.standard_normal(int(s * 16_000)) * 10 ** (-70 / 20)).astype(np.float32)  # noqa: E731
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for word in ("Yes.", "You."):
            wav = f"{tmp}/{word}.wav"
            subprocess.run(["espeak-ng", "-v", "en", "-s", "150", "-w", wav, word], check=True, capture_output=True)
            out[word] = np.concatenate([room(0.5), read_audio_16k(wav), room(2.0)])
    return out


@pytest.mark.parametrize("step_s, interval_s", TIMINGS)
@pytest.mark.parametrize("policy", POLICIES)
def test_a_one_word_answer_is_still_captioned(cpu_model, one_word_answers, policy, step_s, interval_s):
    """What keeps music off the screen must not keep a one-word answer off it: "Yes." and
    "You." (the very word Whisper invents on music) are shown and committed, alone."""
    for word, audio in one_word_answers.items():
        result = _replay_timed(cpu_model, audio, policy, step_s, interval_s)
        committed = _words(" ".join(u.text for u in result.updates if u.kind == "final"))
        assert committed == [normalize_word(word)], (word, committed)


@pytest.mark.parametrize("step_s, interval_s", TIMINGS)
def test_a_short_sentence_is_captioned_as_with_the_energy_test_alone(cpu_model, speech_clips, step_s, interval_s):
    """A 2 s recording ("He could wait no longer."): the articulation tests of the VAD change
    neither what is committed nor when anything is shown."""
    clip = speech_clips["en_ls_1089-134691-0000"]
    energy_only = VadConfig(articulation_min_frames=0)
    runs = [_replay_timed(cpu_model, clip.wav, "alignatt-gpu", step_s, interval_s, vad)
            for vad in (VadConfig(), energy_only)]
    seen = [[(u.kind, u.text, u.emitted_wall_s) for u in run.updates] for run in runs]
    assert seen[0] == seen[1]
    assert _words(" ".join(u.text for u in runs[0].updates if u.kind == "final")) == ["he", "could", "wait", "no", "longer"]
