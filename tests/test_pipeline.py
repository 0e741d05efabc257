"""The pipeline's threads and typed commands, with real-time file sources and tiny.en on the CPU."""

from __future__ import annotations

import threading
import time

import pytest

from captioner.engine.policy.words import normalize_word
from captioner.errors import UserError

pytestmark = pytest.mark.slow


def words(updates, stream):
    return {normalize_word(w) for u in updates if u.kind == "final" and u.stream == stream for w in u.text.split()}


def drain_until(pipeline, predicate, timeout_s, into):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        into += pipeline.drain_captions()
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_sources_come_and_go_between_steps(speech_clips, tmp_path):
    from captioner.app.transcript import TranscriptWriter
    from captioner.audio.file_source import FileSource
    from captioner.engine.pipeline import Pipeline

    first = speech_clips["en_ls_1089-134691-0001"]   # "for a full hour he had paced up and down ..."
    second = speech_clips["en_ls_1089-134686-0001"]  # "stuff it into you his belly counselled him"
    transcript = TranscriptWriter(directory=tmp_path)
    pipeline = Pipeline([FileSource(first.wav, stream="Me", realtime=True)], model="tiny.en", device="cpu",
                        transcript=transcript)
    threads_before = set(threading.enumerate())
    pipeline.start()
    names = {t.name for t in threading.enumerate()} - {t.name for t in threads_before}
    # No capture thread polls the sources: each replay delivers from its own thread to the worker.
    assert {"captioner-worker", "captioner-transcript", "captioner-replay-Me"} <= names
    assert "captioner-capture" not in names
    updates = []
    try:
        pipeline.add_source(FileSource(second.wav, stream="Meeting", realtime=True))
        assert drain_until(pipeline, lambda: "belly" in words(updates, "Meeting") and "hour" in words(updates, "Me"),
                           90, updates), [(u.stream, u.kind, u.text) for u in updates]
        # Removing a stream commits what it still shows; the other stream goes on.
        pipeline.remove_source("Me")
        # (A file's stream leaves by itself once its audio is committed: "Meeting" may be gone too.)
        assert drain_until(pipeline, lambda: (pipeline.latest_status() or None) is not None
                           and "Me" not in pipeline.latest_status().streams, 30, updates)
        with pytest.raises(UserError):
            pipeline.set_language("de")  # tiny.en is English-only: refused at once
        pipeline.set_language("en")
        # A model change between steps: the new model (loaded in the worker) goes on captioning.
        pipeline.set_model("tiny.en")
        before = len([u for u in updates if u.kind == "final"])
        pipeline.add_source(FileSource(first.wav, stream="Again", realtime=True))
        assert drain_until(pipeline, lambda: "hour" in words(updates, "Again"), 60, updates)
        assert len([u for u in updates if u.kind == "final"]) > before
    finally:
        pipeline.stop()
    updates += pipeline.drain_captions()
    status = pipeline.latest_status()
    assert status.state == "stopped" and status.provider == "CPUExecutionProvider" and status.model == "tiny.en"
    assert status.real_time_factor is not None and status.step_latency_ms > 0 and status.frame_latency_ms >= 0
    assert {"longer"} <= words(updates, "Me") or {"waiting"} <= words(updates, "Me")
    # Every thread the pipeline started is gone.
    assert not ({"captioner-worker", "captioner-transcript"} & {t.name for t in threading.enumerate()})
    assert not [t.name for t in threading.enumerate() if t.name.startswith("captioner-replay")]
    lines = transcript.path.read_text(encoding="utf-8").splitlines()[1:]
    assert len(lines) == sum(1 for u in updates if u.kind == "final")


def test_language_the_model_cannot_do_fails_at_start(speech_clips):
    from captioner.audio.file_source import FileSource
    from captioner.engine.pipeline import Pipeline

    clip = speech_clips["en_ls_1089-134691-0000"]
    pipeline = Pipeline([FileSource(clip.wav, realtime=True)], model="tiny.en", language="de", device="cpu")
    with pytest.raises(UserError, match="English-only"):
        pipeline.start()
    assert not pipeline.running


def test_a_source_failing_midway_is_reported_and_its_stream_committed(tmp_path):
    import numpy as np
    import soundfile as sf

    from captioner.audio.file_source import FileSource
    from captioner.engine.pipeline import Pipeline

    audio = np.zeros(16_000 * 4, np.float32)
    audio[16_000 * 3] = np.nan  # damaged 3 s in: found only while replaying
    path = tmp_path / "damaged.wav"
    sf.write(path, audio, 16_000, subtype="FLOAT")
    pipeline = Pipeline([FileSource(path, realtime=False, check_samples=False)], model="tiny.en", device="cpu")
    pipeline.start()
    try:
        assert pipeline.wait_exhausted(30)  # the stream ended where the damage is, and was committed
        assert pipeline.error is None  # the session itself is fine: other streams would go on
        assert "NaN" in pipeline.source_errors["damaged"]
        assert "lost" in pipeline.latest_status().message or pipeline.source_errors
    finally:
        pipeline.stop()
    assert "damaged" in pipeline.latest_status().message


def _status_with_free_vram(fraction):
    from captioner.events import PipelineStatus

    extra = (("vram_free_fraction", fraction),) if fraction is not None else ()
    return PipelineStatus(time_s=0.0, provider="CUDAExecutionProvider", model="tiny.en", device_name="cuda:0", extra=extra)


def test_new_streams_are_refused_under_the_free_vram_floor():
    from captioner.engine.pipeline import check_room_for_stream

    with pytest.raises(UserError, match="GPU memory is 10% free, under the 15%"):
        check_room_for_stream(_status_with_free_vram(0.10))
    check_room_for_stream(_status_with_free_vram(0.40))
    check_room_for_stream(_status_with_free_vram(None))  # the CPU: no GPU memory to guard
    check_room_for_stream(None)  # nothing measured yet


def test_cpu_backend_reports_no_vram_fraction():
    from captioner.gpu.backend import cpu_backend

    assert cpu_backend().vram_free_fraction() is None


@pytest.mark.gpu
def test_cuda_backend_measures_free_vram():
    from captioner.gpu.backend import get_backend

    fraction = get_backend("cuda:0").vram_free_fraction()
    assert fraction is not None and 0.0 < fraction <= 1.0
