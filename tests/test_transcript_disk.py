"""The transcript on a disk that is full, or fills, or has room again (issue 47, item 2): a full
disk at the start is one line before any model; one that fills mid-session is said at once, its
lines held whole and written when there is room; lines that never reach the disk are said at the
end, with exit 2, never "transcript saved" and 0. On a real 64 KiB tmpfs where one can be
mounted (tests/small_disk.py), else with ``os.write`` failing as a full disk does."""

from __future__ import annotations

import errno
import os
import signal
import time

import pytest

from captioner.app.cli import main
from captioner.app.transcript import TranscriptWriter
from captioner.data import sample_speech_path
from captioner.errors import UserError
from captioner.events import CaptionUpdate
from small_disk import SmallDisk

JFK = str(sample_speech_path())  # opens as a --file input; never played here


@pytest.fixture
def disk(tmp_path, monkeypatch):
    small = SmallDisk(tmp_path / "disk", monkeypatch)
    yield small
    small.close()


def final(text: str, n: int = 0) -> CaptionUpdate:
    return CaptionUpdate("Me", "final", text, float(n), n + 1.0, n + 1.0, n + 1.0)


def long_line(n: int) -> str:
    # A sentence of 1.5 KiB: the last page of a file on a full tmpfs has room for two at most.
    return f"Line {n} " + "word " * 299 + "end."


def caption_lines(path) -> list[str]:
    return [line.split(": ", 1)[1] for line in path.read_text(encoding="utf-8").splitlines()[1:]]


def test_a_disk_full_at_the_start_is_one_line_and_leaves_no_file(disk):
    disk.fill()
    with pytest.raises(UserError, match=r"^cannot write the transcript .*/new\.txt: disk full$"):
        TranscriptWriter(disk.folder / "new.txt")
    assert not (disk.folder / "new.txt").exists()  # no empty file that looks like a silent session
    with pytest.raises(UserError, match=r"^cannot write the transcript .*: disk full$"):
        TranscriptWriter(directory=disk.folder / "transcripts")
    assert list((disk.folder / "transcripts").iterdir()) == []


def test_an_existing_transcript_on_a_full_disk_is_refused_and_kept(disk):
    old = disk.folder / "old.txt"
    old.write_text("# an earlier session, one page long" + "." * 4060 + "\n", encoding="utf-8")
    before = old.read_bytes()
    assert len(before) == 4096  # no room left in its page: the next byte needs a new one
    disk.fill()
    with pytest.raises(UserError, match="disk full"):
        TranscriptWriter(old)
    assert old.read_bytes() == before


def test_listen_on_a_full_disk_is_one_line_before_any_model(disk, capsys, monkeypatch):
    import captioner.engine.pipeline as pipeline

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the transcript was checked")

    monkeypatch.setattr(pipeline, "Pipeline", no_model)
    disk.fill()
    transcript = disk.folder / "t.txt"
    code = main(["listen", "--file", JFK, "--device", "cpu", "--transcript", str(transcript)])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err == f"captioner: error: cannot write the transcript {transcript}: disk full\n"
    assert not transcript.exists()


def test_lines_held_by_a_disk_that_filled_are_written_when_it_has_room(disk, monkeypatch):
    """The engine's transcript thread on the real writer: the lines the full disk refuses still
    reach the screen, the file keeps only whole lines, the status says so, and once there is room
    the held lines are written by the thread's own retry, with no new caption to carry them."""
    from captioner.engine import transcript_thread

    monkeypatch.setattr(transcript_thread, "RETRY_S", 0.05)
    writer = TranscriptWriter(disk.folder / "t.txt")
    shown: list[CaptionUpdate] = []
    thread = transcript_thread.TranscriptThread("captioner-transcript", lambda key, title: writer, then=shown.extend)
    thread.start()

    def commit(text: str, n: int) -> None:
        thread.put([final(text, n)])
        deadline = time.monotonic() + 5
        while len(shown) < n + 1:
            assert time.monotonic() < deadline, "a caption did not reach the screen"
            time.sleep(0.005)

    try:
        commit("Before the disk filled.", 0)
        disk.fill()
        n = 1
        while writer.paused is None:  # lines fit in the file's last page until it is used
            assert n < 10, "the full disk took every line"
            commit(long_line(n), n)
            n += 1
        commit(long_line(n), n)
        assert writer.paused == "disk full" and writer.held_lines == 2
        assert "captions are not being saved (disk full)" in writer.problem
        assert len(caption_lines(writer.path)) == n - 1 and len(shown) == n + 1  # all shown, two held
        assert writer.path.read_text(encoding="utf-8").endswith("\n")  # a torn line was cut back
        disk.free()
        deadline = time.monotonic() + 5
        while writer.paused is not None:
            assert time.monotonic() < deadline, "the held lines were not written once there was room"
            time.sleep(0.01)
    finally:
        thread.close(5)
    assert writer.loss() is None and writer.problem is None
    assert caption_lines(writer.path) == [" ".join(u.text.split()) for u in shown]


class ScriptedPipeline:
    """What `listen` uses of a Pipeline, without a model: each poll of ``drain_captions`` runs
    the next step of a script — a caption, written to the transcript before it is shown, as the
    engine's transcript thread does, or an action (fill the disk, free it, Ctrl-C)."""

    provider = "fake"
    captioner = None
    error = None

    def __init__(self, sources, transcript, steps, **_):
        self.transcript, self.steps, self.n = transcript, list(steps), 0
        self.running = True
        self.lost_inputs, self.source_errors, self.input_losses = {}, {}, {}

    def start(self):
        pass

    def drain_captions(self):
        if not self.steps:
            return []
        step = self.steps.pop(0)
        if callable(step):
            step()
            return []
        self.n += 1
        update = CaptionUpdate("jfk", "final", step, float(self.n), self.n + 1.0, self.n + 1.0, self.n + 1.0)
        self.transcript.write(update)
        return [update]

    def notices(self):
        return []

    def wait_exhausted(self, timeout_s=0):
        return False

    def latest_status(self):
        return None

    def stop(self, timeout_s=60.0):
        self.transcript.close()


def test_listen_says_when_captions_stop_being_saved_and_what_was_lost(disk, capsys, monkeypatch):
    """The issue's session: the disk fills while captions are shown, space comes back, fills
    again and stays full; the person stops with Ctrl-C. Each change is one line on stderr, the
    lines held while there was no room are in the file, and the end says how many were lost."""
    import captioner.engine.pipeline as pipeline

    def ctrl_c():
        raise KeyboardInterrupt

    said = ["First line."] + [long_line(n) for n in range(1, 5)] + ["Room again."] + [long_line(n) for n in range(5, 9)]
    steps = ["First line.", disk.fill, *said[1:5], disk.free, "Room again.", disk.fill, *said[6:], ctrl_c]
    monkeypatch.setattr(pipeline, "Pipeline", lambda sources, **kw: ScriptedPipeline(sources, kw["transcript"], steps))
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # listen's SIGTERM handler: not in pytest
    transcript = disk.folder / "t.txt"
    code = main(["listen", "--file", JFK, "--device", "cpu", "--transcript", str(transcript)])
    out, err = capsys.readouterr()

    assert code == 2
    kept = caption_lines(transcript)
    lost = len(said) - len(kept)
    assert kept == [" ".join(line.split()) for line in said[:len(kept)]]  # whole lines, in order
    assert "Room again." in kept and 0 < lost <= 4  # the first full spell was written when room came
    lines = err.splitlines()
    warning = (f"captioner: captions are no longer being saved to {transcript} (disk full); they are kept in "
               "memory and written when there is room")
    assert lines[:2] == ["captioner: loading tiny.en …", f"captioner: listening to jfk_inaugural_1961 (tiny.en "
                         f"on fake); Ctrl-C stops; transcript: {transcript}"]
    assert lines[2:] == [
        warning,
        f"captioner: captions are being saved to {transcript} again (the lines kept meanwhile are written)",
        warning,
        f"captioner: error: cannot write the transcript {transcript}: disk full; the last {lost} committed lines "
        f"shown were not saved (it keeps the {len(kept)} before them)",
    ], err
    assert "transcript saved" not in err
    shown = " ".join(out.replace("[jfk] ", "").split())
    assert all(f"Line {n} word" in shown for n in range(1, 9))  # every line was shown


@pytest.mark.parametrize("lines, said", [
    (1, "the committed line shown was not saved"),
    (3, "none of the 3 committed lines shown was saved"),
])
def test_the_end_says_the_lines_never_saved_when_none_were(tmp_path, monkeypatch, lines, said):
    writer = TranscriptWriter(tmp_path / "t.txt")

    def full(text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(writer, "_append", full)  # full from the first caption on
    for n in range(lines):
        writer.write(final(f"Line {n}.", n))
    writer.close()
    assert writer.loss() == f"cannot write the transcript {writer.path}: disk full; {said}"
