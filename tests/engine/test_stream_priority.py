"""A stream's priority travels from its source to the engine (issue 12): a file replay ranks
below a microphone or a meeting, through the worker thread and through a model host (the same
messages a model process gets), and a restart re-opens it with the same rank. A stream that
ended leaves nothing behind in the worker."""

from __future__ import annotations

import time

import pytest
import soundfile as sf
from scripted import ScriptedRecognizer, phrase, render_speech

from captioner.audio.file_source import FileSource
from captioner.engine.admission import Priority
from captioner.engine.pipeline import Pipeline
from captioner.gpu.backend import cpu_backend

SAMPLE_RATE_HZ = 16000


class Factory:
    """A picklable ``recognizer_factory`` for a scripted model."""

    def __call__(self):
        return cpu_backend(), ScriptedRecognizer({})


def _engine_streams(pipeline: Pipeline):
    captioner = pipeline.captioner
    host = getattr(captioner, "_host", None)
    live = host.core.live if host is not None else captioner
    return live.engine._streams


@pytest.mark.parametrize("isolation", ["none", "inline"])
def test_a_file_replay_ranks_below_a_live_source(tmp_path, isolation):
    path = tmp_path / "talk.wav"
    sf.write(path, render_speech(phrase("one two three", 0.3), 2.0), SAMPLE_RATE_HZ)
    replay = FileSource(path, stream="file", realtime=True)
    live = FileSource(path, stream="meeting", realtime=True)
    live.priority = "live"  # as a network client or a monitor source says
    pipeline = Pipeline([replay], recognizer_factory=Factory(), isolation=isolation)
    pipeline.start()
    try:
        pipeline.add_source(live)
        deadline = time.monotonic() + 10
        while len(_engine_streams(pipeline)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        streams = _engine_streams(pipeline)
        assert streams["file"].priority == Priority.REPLAY
        assert streams["meeting"].priority == Priority.LIVE
        if isolation == "inline":
            assert pipeline.captioner._streams["file"].priority == "replay"  # kept for a re-open
        # Both replays end; their streams leave and the worker keeps nothing of them (a server
        # opens and ends streams for days).
        assert pipeline.wait_exhausted(15)
        pipeline.add_source(FileSource(path, stream="third", realtime=False))
        assert pipeline.wait_exhausted(15)
        assert not pipeline._worker._clocks
    finally:
        pipeline.stop()
