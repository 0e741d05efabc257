"""A file replayed as fast as it can go through the whole pipeline (replay thread -> inbox ->
worker -> outbox) with a model slower than the audio arrives: the replay waits for room, the
worker works the backlog off window by window, and every word is committed — nothing dropped."""

from __future__ import annotations

import time

import soundfile as sf
from scripted import ScriptedRecognizer, keys, render_speech
from test_engine_scripted import long_script

from captioner.audio.file_source import FileSource
from captioner.engine.pipeline import Pipeline
from captioner.events import SAMPLE_RATE_HZ
from captioner.gpu.backend import cpu_backend


class SlowScript(ScriptedRecognizer):
    """Each model step takes ``step_s`` of real time, like a busy machine."""

    def __init__(self, *args, step_s: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.step_s = step_s

    def decode(self, requests):
        time.sleep(self.step_s)
        return super().decode(requests)


def test_a_fast_replay_with_a_slow_model_loses_no_word(tmp_path):
    duration_s = 90.0
    words = long_script(duration_s)
    path = tmp_path / "talk.wav"
    sf.write(path, render_speech(words, duration_s), SAMPLE_RATE_HZ)
    recognizer = SlowScript({"talk": words}, step_s=0.02)
    # A small inbox, so the replay (far faster than real time) has to wait for the worker.
    pipeline = Pipeline([FileSource(path, stream="talk", realtime=False)], inbox_items=20,
                        recognizer_factory=lambda: (cpu_backend(), recognizer))
    pipeline.start()
    try:
        assert pipeline.wait_exhausted(60)
    finally:
        pipeline.stop()
    updates = pipeline.drain_captions()
    committed = [w for u in updates if u.kind == "final" for w in keys(u.text)]
    assert committed == keys(words)
    assert pipeline.failure is None
    assert len(recognizer.calls) >= duration_s / 4  # worked off in many windows, not two giant steps
