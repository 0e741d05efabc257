"""The ``alignatt-gpu`` preset with the real tiny.en model on the CPU (slow), on a simulated
clock charged 40 ms per model step (an H200's step) and updated every 0.5 s, as measured in
docs/latency.md: JFK's first words are committed right, the same audio gives the same committed
lines twice, and words are committed sooner than under AlignAtt's CPU setting."""

from __future__ import annotations

import statistics

import pytest

from captioner.engine.core import EngineConfig
from captioner.engine.live import LiveCaptioner
from captioner.engine.policy.presets import preset
from captioner.engine.policy.words import normalize_word
from captioner.engine.scheduler import SchedulerConfig
from captioner.engine.simulate import replay

pytestmark = pytest.mark.slow

JFK = "en_jfk_inaugural_excerpt"
STEP_S = 0.04


@pytest.fixture(scope="module")
def cpu_model(tiny_en_cpu):
    return tiny_en_cpu  # conftest: loaded once a session


def _replay(cpu_model, wav, name: str):
    backend, recognizer = cpu_model
    config = EngineConfig(policy=preset(name), scheduler=SchedulerConfig(base_interval_s=0.5))
    result = replay(lambda clock, timer: LiveCaptioner(recognizer=recognizer, backend=backend, config=config,
                                                       clock_ns=clock, timer_ns=timer),
                    {"s": wav}, compute=STEP_S)
    return [u for u in result.updates if u.kind == "final"]


def _commit_lags_s(finals) -> list[float]:
    """Per committed word: when it was committed minus where its measured (DTW) time ends."""
    return [u.emitted_wall_s - end_s for u in finals for _, _, end_s in u.words]


def test_jfk_under_the_gpu_preset(cpu_model, speech_clips):
    wav = speech_clips[JFK].wav
    runs = [_replay(cpu_model, wav, "alignatt-gpu") for _ in range(2)]
    lines = [[(u.segment, u.text) for u in finals] for finals in runs]
    assert lines[0] == lines[1]  # a fixed step cost: same commits, same lines
    words = [normalize_word(w) for _, text in lines[0] for w in text.split()]
    assert words[:5] == ["and", "so", "my", "fellow", "americans"], words
    assert words[-3:] == ["for", "your", "country"], words
    default = _replay(cpu_model, wav, "alignatt")
    assert statistics.median(_commit_lags_s(runs[0])) < statistics.median(_commit_lags_s(default))
