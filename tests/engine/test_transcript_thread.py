"""The transcript thread (one for pipelines, clients and servers): a caption reaches the outbox
only once it is on disk, in order; a failing disk never stops the captions; a paused one is
tried again; a server's connections each get their own transcript."""

from __future__ import annotations

import threading

from captioner.engine import transcript_thread
from captioner.engine.transcript_thread import TranscriptThread
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
    thread = TranscriptThread("t", lambda key, title: disk, then=published.extend)
    thread.start()
    batch = [update("final", "Hello there."), update("partial", "how")]
    thread.put(batch)
    thread.put([update("partial", "how are")])
    assert not disk.allowed.wait(0.2) and published == []  # still writing: nothing shown yet
    assert not thread.idle()
    disk.allowed.set()
    thread.close(5)
    assert disk.lines == ["Hello there."] and disk.closed
    assert [u.text for u in published] == ["Hello there.", "how", "how are"]  # order kept


def test_a_failing_disk_keeps_the_captions_coming():
    disk = SlowDisk(fail=True)
    disk.allowed.set()
    published: list[CaptionUpdate] = []
    thread = TranscriptThread("t", lambda key, title: disk, then=published.extend)
    thread.start()
    thread.put([update("final", "One.")])
    thread.put([update("final", "Two.")])
    thread.close(5)
    assert [u.text for u in published] == ["One.", "Two."]
    assert isinstance(thread.error, OSError)


class FullDisk:
    """A transcript whose disk is full until ``freed``: lines are held, ``retry`` writes them."""

    def __init__(self) -> None:
        self.held: list[str] = []
        self.lines: list[str] = []
        self.freed = False
        self.retried = threading.Event()

    @property
    def paused(self) -> str | None:
        return None if not self.held else "no space left on device"

    def write(self, u: CaptionUpdate) -> None:
        self.held.append(u.text)
        self.retry()

    def retry(self) -> None:
        if self.freed:
            self.lines += self.held
            self.held = []
            self.retried.set()

    def close(self) -> None:
        self.retry()


def test_held_lines_are_tried_again_while_no_batch_comes(monkeypatch):
    monkeypatch.setattr(transcript_thread, "RETRY_S", 0.05)
    disk = FullDisk()
    thread = TranscriptThread("t", lambda key, title: disk)
    thread.start()
    thread.put([update("final", "Kept.")])
    while not thread.idle():
        threading.Event().wait(0.01)
    assert disk.held == ["Kept."] and disk.lines == []
    disk.freed = True  # room again: no new line comes, the timer writes the held one
    assert disk.retried.wait(5)
    thread.close(5)
    assert disk.lines == ["Kept."]


def test_each_key_gets_its_own_transcript_made_at_its_first_line_and_closed_at_its_end():
    made: dict[str, SlowDisk] = {}

    def writer_for(key, title):
        made[title] = SlowDisk(fail=key == "broken")
        made[title].allowed.set()
        return made[title]

    thread = TranscriptThread("t", writer_for)
    thread.start()
    thread.put([update("partial", "hm")], key=1, title="one")  # no committed line: no file
    thread.put([update("final", "A.")], key=2, title="two")
    thread.put([update("final", "X.")], key="broken", title="bad")
    thread.put([update("final", "Y.")], key="broken", title="bad")  # not tried again
    thread.put([update("final", "B.")], key=2, title="two")
    thread.end(2)
    while not thread.idle():
        threading.Event().wait(0.01)
    assert sorted(made) == ["bad", "two"]
    assert made["two"].lines == ["A.", "B."] and made["two"].closed
    assert not made["bad"].closed and isinstance(thread.error, OSError)
    thread.close(5)
    assert made["bad"].closed and not thread.is_alive()


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


def test_a_batch_put_as_the_thread_is_told_to_close_is_still_written_and_handed_on():
    disk = SlowDisk()
    disk.allowed.set()
    published: list[CaptionUpdate] = []
    thread = TranscriptThread("t", lambda key, title: disk, then=published.extend)
    thread.put([update("final", "Before.")])
    thread.close(5)  # not started yet: the close waits in line
    thread.put([update("final", "Racing.")])  # a link thread that had not seen the stop
    thread.start()
    thread.join(5)
    assert disk.lines == ["Before.", "Racing."] and disk.closed
    assert [u.text for u in published] == ["Before.", "Racing."]
