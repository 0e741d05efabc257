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
