"""The transcript thread: a caption reaches the outbox only once it is on disk, in order, and a
failing disk never stops the captions."""

from __future__ import annotations

import threading

from captioner.engine.pipeline import _TranscriptThread
from captioner.events import CaptionUpdate


def update(kind: str, text: str) -> CaptionUpdate:
    return CaptionUpdate("Me", kind, text, 0.0, 1.0, 1.0, 1.0)


class SlowDisk:
    """A transcript whose writes wait until the test lets them through."""

    def __init__(self, fail: bool = False) -> None:
        self.allowed = threading.Event()
        self.lines: list[str] = []
        self.fail = fail
        self.closed = False

    def write(self, u: CaptionUpdate) -> None:
        self.allowed.wait(5)
        if self.fail:
            raise OSError(28, "No space left on device")
        self.lines.append(u.text)

    def close(self) -> None:
        self.closed = True


def test_a_final_is_published_only_after_it_was_written():
    disk = SlowDisk()
    published: list[CaptionUpdate] = []
    thread = _TranscriptThread(disk, published.extend)
    thread.start()
    batch = [update("final", "Hello there."), update("partial", "how")]
    thread.batches.put(batch)
    thread.batches.put([update("partial", "how are")])
    assert not disk.allowed.wait(0.2) and published == []  # still writing: nothing shown yet
    disk.allowed.set()
    thread.close(5)
    assert disk.lines == ["Hello there."] and disk.closed
    assert [u.text for u in published] == ["Hello there.", "how", "how are"]  # order kept


def test_a_failing_disk_keeps_the_captions_coming():
    disk = SlowDisk(fail=True)
    disk.allowed.set()
    published: list[CaptionUpdate] = []
    thread = _TranscriptThread(disk, published.extend)
    thread.start()
    thread.batches.put([update("final", "One.")])
    thread.batches.put([update("final", "Two.")])
    thread.close(5)
    assert [u.text for u in published] == ["One.", "Two."]
    assert isinstance(thread.error, OSError)


def test_a_session_writes_its_transcript_on_its_own_thread_never_the_worker(tmp_path):
    """A whole session (file replay -> worker -> transcript thread -> outbox), a scripted model:
    the model steps run on ``captioner-worker``, every transcript line is written (and fsync'd)
    on ``captioner-transcript``, and the file holds each committed line in order."""
    import soundfile as sf
    from scripted import ScriptedRecognizer, keys, render_speech
    from test_engine_scripted import long_script

    from captioner.app.transcript import TranscriptWriter
    from captioner.audio.file_source import FileSource
    from captioner.engine.pipeline import Pipeline
    from captioner.events import SAMPLE_RATE_HZ
    from captioner.gpu.backend import cpu_backend

    class WatchedTranscript(TranscriptWriter):
        def write(self, u: CaptionUpdate) -> None:
            self.threads.add(threading.current_thread().name)
            super().write(u)

    class WatchedScript(ScriptedRecognizer):
        def decode(self, requests):
            self.threads.add(threading.current_thread().name)
            return super().decode(requests)

    duration_s = 20.0
    words = long_script(duration_s)
    path = tmp_path / "talk.wav"
    sf.write(path, render_speech(words, duration_s), SAMPLE_RATE_HZ)
    transcript = WatchedTranscript(directory=tmp_path)
    transcript.threads = set()
    recognizer = WatchedScript({"talk": words})
    recognizer.threads = set()
    pipeline = Pipeline([FileSource(path, stream="talk")], transcript=transcript,
                        recognizer_factory=lambda: (cpu_backend(), recognizer))
    pipeline.start()
    try:
        assert pipeline.wait_exhausted(60)
    finally:
        pipeline.stop()
    finals = [u for u in pipeline.drain_captions() if u.kind == "final" and u.text.strip()]
    assert [w for u in finals for w in keys(u.text)] == keys(words)
    assert recognizer.threads == {"captioner-worker"}
    assert transcript.threads == {"captioner-transcript"}
    lines = transcript.path.read_text(encoding="utf-8").splitlines()[1:]  # past the header
    assert [line.split(": ", 1)[1] for line in lines] == [" ".join(u.text.split()) for u in finals]
