"""The server refuses a new connection while its engine cannot take in the audio it already has
(issue 13: a refusal never degrades the streams already running).

Measured on an H200 (docs/serve.md): a thousand connections at ten messages a second filled the
worker's inbox of one process, audio was dropped for every stream, and the model's admission,
which sees steps and not the audio waiting for them, kept admitting. Here a real pipeline whose
model step is held (a scripted recognizer that waits for the test) fills a small inbox the same
way; the link then refuses new streams with a one-line reason, and takes them again once the
worker has caught up and the hold-off after the last drop has passed.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from scripted import ScriptedRecognizer, phrase, render_speech  # noqa: E402

from captioner.engine.core import EngineConfig  # noqa: E402
from captioner.engine.pipeline import Pipeline  # noqa: E402
from captioner.errors import StreamRefused  # noqa: E402
from captioner.gpu.backend import cpu_backend  # noqa: E402
from captioner.serve.engine_link import EngineLink  # noqa: E402

HOLDOFF_S = 1.0


class HeldRecognizer(ScriptedRecognizer):
    """Answers from its script, but each model step waits until the test releases it."""

    def __init__(self, script) -> None:
        super().__init__(script)
        self.entered = threading.Event()
        self.release = threading.Event()

    def decode(self, requests):
        self.entered.set()
        self.release.wait(30)
        return super().decode(requests)


WORDS = phrase("hello there this is a test", 0.3)


def _held_link(inbox_items: int):
    """A real link whose one engine's model steps wait for the test, and its first stream."""
    recognizer = HeldRecognizer({})
    holder: dict = {}

    def make_pipeline(device):
        def factory():
            return cpu_backend(), recognizer
        holder["pipeline"] = Pipeline([], config=EngineConfig(), recognizer_factory=factory, inbox_items=inbox_items)
        return holder["pipeline"]

    link = EngineLink(["cpu"], make_pipeline, drop_holdoff_s=HOLDOFF_S)
    link.start()
    first = link.open("first", None, 16000)
    recognizer.script[first.key] = WORDS
    link.poll()
    return link, recognizer, holder["pipeline"], first


def test_a_full_inbox_and_dropped_audio_refuse_new_streams_until_the_worker_keeps_up():
    link, recognizer, pipeline, first = _held_link(inbox_items=16)
    try:
        speech = np.clip(np.rint(render_speech(WORDS, 4.0) * 32767), -32768, 32767).astype("<i2")
        # Speech until the model's first step starts (and is held there).
        for start in range(0, speech.shape[0], 1600):
            first.push(speech[start:start + 1600].tobytes())
            if recognizer.entered.wait(0.02):
                break
        assert recognizer.entered.is_set(), "the model never stepped"
        # The worker is held in its step: a connection's audio fills the inbox, then is dropped.
        taken = [first.push(np.zeros(1600, "<i2").tobytes()) for _ in range(40)]
        assert not all(taken)
        assert pipeline.inbox_fill >= 0.5
        with pytest.raises(StreamRefused) as refused:
            link.open("second", None, 16000)
        assert "\n" not in str(refused.value) and "try again" in str(refused.value)
        # The step goes on, the worker drains its inbox; the hold-off after the drop still refuses.
        recognizer.release.set()
        deadline = time.monotonic() + 20
        while pipeline.inbox_fill > 0 and time.monotonic() < deadline:
            link.poll()
            time.sleep(0.02)
        if time.monotonic() - link.workers[0].last_drop_s < HOLDOFF_S - 0.2:
            with pytest.raises(StreamRefused, match="dropped audio"):
                link.open("third", None, 16000)
        time.sleep(HOLDOFF_S)
        fourth = link.open("fourth", None, 16000)
        assert fourth.state == "opening"
        link.close(first)
        link.close(fourth)
    finally:
        recognizer.release.set()
        link.stop()


def test_framed_audio_that_waits_a_second_in_the_inbox_refuses_new_streams():
    """With front-ends a connection's audio comes one item per frame, so an inbox far from full
    can hold seconds of it: the link refuses by how long the oldest audio has waited."""
    link, recognizer, pipeline, first = _held_link(inbox_items=3000)
    try:
        worker = link.workers[0]
        speech = render_speech(WORDS, 4.0)
        # Framed as a front-end frames it (whole 10 ms frames), 100 ms a frame, until the model's
        # first step starts and is held there.
        first_sample = 0
        while not recognizer.entered.is_set() and first_sample < speech.shape[0]:
            piece = speech[first_sample:first_sample + 1600]
            link.push_framed(worker, [(first, first_sample, time.monotonic_ns(), 0, 1600)], piece)
            first_sample += 1600
            recognizer.entered.wait(0.02)
        assert recognizer.entered.is_set(), "the model never stepped"
        # Two more frames while the worker is held: two items in an inbox of 3000.
        for _ in range(2):
            link.push_framed(worker, [(first, first_sample, time.monotonic_ns(), 0, 1600)],
                             np.zeros(1600, np.float32))
            first_sample += 1600
        assert pipeline.inbox_fill < 0.01
        assert first.source.stats().dropped_blocks == 0
        time.sleep(1.1)
        with pytest.raises(StreamRefused, match=r"takes its audio in \d\.\d s late") as refused:
            link.open("second", None, 16000)
        assert "\n" not in str(refused.value)
        recognizer.release.set()
        deadline = time.monotonic() + 20
        while pipeline.inbox_wait_s > 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        third = link.open("third", None, 16000)
        assert third.state == "opening"
        assert first.source.stats().delivered_samples == first_sample
        link.close(first)
        link.close(third)
    finally:
        recognizer.release.set()
        link.stop()


class SlowRecognizer(ScriptedRecognizer):
    """A model on the worker's own thread that takes 1.5 s a step (a CPU's pace)."""

    def decode(self, requests):
        time.sleep(1.5)
        return super().decode(requests)


def test_a_model_on_the_workers_thread_taking_seconds_a_step_is_its_pace_not_a_backlog():
    """Inline on a CPU the worker leaves its inbox for a whole model step, so audio there waits
    that long every step: that refuses no one (it did, from the first served connection, while
    the wait was measured alone)."""
    words = phrase("hello there this is a test of a slow model on the worker thread", 0.3)
    recognizer = SlowRecognizer({})
    pipeline = Pipeline([], config=EngineConfig(), recognizer_factory=lambda: (cpu_backend(), recognizer))
    link = EngineLink(["cpu"], lambda device: pipeline, drop_holdoff_s=HOLDOFF_S)
    link.start()
    try:
        first = link.open("first", None, 16000)
        recognizer.script[first.key] = words
        worker = link.workers[0]
        speech = render_speech(words, 7.0)
        started_s = time.monotonic()
        waits, pressures = [], []
        for first_sample in range(0, speech.shape[0], 1600):  # 100 ms a frame, in real time
            while time.monotonic() < started_s + first_sample / 16000:
                time.sleep(0.005)
            link.push_framed(worker, [(first, first_sample, time.monotonic_ns(), 0, 1600)],
                             speech[first_sample:first_sample + 1600])
            waits.append(pipeline.inbox_wait_s)
            if pipeline.worker_away_s >= 1.4:  # after the first slow step
                pressures.append(worker.input_pressure(HOLDOFF_S))
        assert max(waits) >= 1.2, "the model's steps never kept audio waiting: nothing was tested"
        assert pressures and set(pressures) == {""}
        link.close(first)
    finally:
        link.stop()
