"""Transcript file: committed lines durable as they come, even when the process is killed."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from captioner.app.transcript import (
    TranscriptWriter,
    default_transcript_dir,
    format_line,
)
from captioner.errors import UserError
from captioner.events import CaptionUpdate


def upd(text, kind="final", start=1.0, end=2.5, stream="Me"):
    return CaptionUpdate(stream, kind, text, start, end, end, end)


def test_only_committed_lines_are_written(tmp_path):
    with TranscriptWriter(directory=tmp_path) as w:
        w.write(upd("hello there"))
        w.write(upd("still changing", kind="partial"))
        w.write(upd("   "))
        w.write(upd("general Kenobi", stream="Meeting", start=3723.5, end=3724.0))
    lines = w.path.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# captioner transcript")
    assert lines[1:] == ["[00:00:01.000 --> 00:00:02.500] Me: hello there",
                         "[01:02:03.500 --> 01:02:04.000] Meeting: general Kenobi"]
    assert w.lines_written == 2


def test_files_do_not_collide(tmp_path):
    a = TranscriptWriter(directory=tmp_path)
    b = TranscriptWriter(directory=tmp_path)
    assert a.path != b.path
    a.close(), b.close()


def test_default_dir_is_user_data_dir(monkeypatch):
    monkeypatch.delenv("CAPTIONER_TRANSCRIPT_DIR", raising=False)
    import platformdirs

    assert str(default_transcript_dir()).startswith(platformdirs.user_data_dir("captioner", appauthor=False))


def test_lines_survive_sigkill(tmp_path):
    # A child writes lines and reports each; we kill it mid-stream with SIGKILL (no cleanup).
    script = textwrap.dedent(f"""
        import sys, time
        from captioner.app.transcript import TranscriptWriter
        from captioner.events import CaptionUpdate
        w = TranscriptWriter(directory={str(tmp_path)!r})
        print(w.path, flush=True)
        for i in range(1000):
            w.write(CaptionUpdate("Me", "final", f"line {{i}}", i, i + 1, i + 1, i + 1))
            print(i, flush=True)
            time.sleep(0.01)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    path = child.stdout.readline().strip()
    acknowledged = -1
    while acknowledged < 20:
        acknowledged = int(child.stdout.readline())
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    lines = open(path, encoding="utf-8").read().splitlines()[1:]
    # Every line acknowledged before the kill is in the file, whole.
    assert len(lines) >= acknowledged + 1
    for i, line in enumerate(lines):
        assert line == format_line(CaptionUpdate("Me", "final", f"line {i}", i, i + 1, 0, 0)).rstrip("\n")


class _FullDisk:
    """``os.write`` on one file descriptor that takes a few bytes of a line, then fails with
    ENOSPC, until ``space`` is set again (where mounting a small tmpfs is not allowed)."""

    def __init__(self, monkeypatch, fd: int) -> None:
        import os

        self.space = True
        self._real_write = os.write
        self._fd = fd
        monkeypatch.setattr(os, "write", self._write)

    def _write(self, fd, data):
        import errno

        if fd != self._fd or self.space:
            return self._real_write(fd, data)
        if len(data) > 5:
            return self._real_write(fd, bytes(data[:5]))  # a torn start of the line...
        raise OSError(errno.ENOSPC, "No space left on device")  # ...then the disk is full


def test_a_full_disk_holds_lines_whole_and_resumes(tmp_path, monkeypatch):
    from captioner.app.transcript import TranscriptWriter

    w = TranscriptWriter(directory=tmp_path)
    disk = _FullDisk(monkeypatch, w._fd)
    w.write(upd("Before the disk filled.", start=0.0, end=1.0))
    disk.space = False
    w.write(upd("He holds the floor.", start=1.0, end=2.0, stream="Meeting"))
    w.write(upd("And another line.", start=2.0, end=3.0))
    assert w.paused == "disk full" and w.held_lines == 2 and w.lines_written == 1
    text = w.path.read_text(encoding="utf-8")
    assert text.endswith("Before the disk filled.\n")  # the torn bytes were cut back
    disk.space = True
    w.retry()
    assert w.paused is None and w.held_lines == 0 and w.lines_written == 3
    w.close()
    lines = w.path.read_text(encoding="utf-8").splitlines()[1:]
    assert [line.split(": ", 1)[1] for line in lines] == ["Before the disk filled.", "He holds the floor.",
                                                           "And another line."]


def test_a_path_that_cannot_hold_a_transcript_is_one_line_before_any_session(tmp_path, monkeypatch):
    refused = {
        "is a folder; give a file name": dict(path=tmp_path),
        "/proc is not a disk": dict(path=Path("/proc/self/comm")),  # as root, a write would rename us
        "(set by CAPTIONER_TRANSCRIPT_DIR): /proc is not a disk": dict(env="/proc/captioner"),
        "a file has that name": dict(directory=tmp_path / "a-file"),
    }
    if os.path.exists("/dev/full"):
        refused["is not a regular file"] = dict(path=Path("/dev/full"))
    (tmp_path / "a-file").write_text("", encoding="utf-8")
    for message, how in refused.items():
        with monkeypatch.context() as patch:
            if "env" in how:
                patch.setenv("CAPTIONER_TRANSCRIPT_DIR", how.pop("env"))
            with pytest.raises(UserError) as error:
                TranscriptWriter(**how)
        assert message in str(error.value) and "\n" not in str(error.value)
    assert not os.path.exists("/proc/captioner")

    def full_disk(path, flags, *args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(os, "open", full_disk)
    with pytest.raises(UserError, match=r"^cannot write the transcript .*: disk full$"):
        TranscriptWriter(directory=tmp_path / "new")


def spoken(text, speaker, start, stream="Meeting"):
    return CaptionUpdate(stream, "final", text, start, start + 1.0, start + 1.0, start + 1.0, speaker=speaker)


def test_a_speakers_lines_name_them_and_a_rename_reaches_the_lines_written_before_it(tmp_path):
    path = tmp_path / "t.txt"
    w = TranscriptWriter(path)
    w.write(spoken("Shall we start?", "Speaker 1", 0.0))
    w.write(spoken("Yes.", "Speaker 2", 2.0))
    w.write(upd("my own words", start=3.0, end=4.0))
    assert path.read_text(encoding="utf-8").splitlines()[1:] == [
        "[00:00:00.000 --> 00:00:01.000] Meeting (Speaker 1): Shall we start?",
        "[00:00:02.000 --> 00:00:03.000] Meeting (Speaker 2): Yes.",
        "[00:00:03.000 --> 00:00:04.000] Me: my own words",
    ]
    w.rename_speaker("Meeting", "Speaker 1", "  Ada   Lovelace ")
    w.write(spoken("Then the budget.", "Speaker 1", 5.0))
    # On disk at once, before the close: the rename itself, and the name on the lines after it.
    assert path.read_text(encoding="utf-8").splitlines()[4:] == [
        "# Meeting (Speaker 1) is Ada Lovelace",
        "[00:00:05.000 --> 00:00:06.000] Meeting (Ada Lovelace): Then the budget.",
    ]
    w.rename_speaker("Meeting", "Speaker 1", "Ada")  # renamed twice: the last name holds
    w.rename_speaker("Meeting", "Speaker 2", "")  # an empty name changes nothing
    w.close()
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[1] == "[00:00:00.000 --> 00:00:01.000] Meeting (Ada): Shall we start?"
    assert lines[2] == "[00:00:02.000 --> 00:00:03.000] Meeting (Speaker 2): Yes."
    assert lines[5] == "[00:00:05.000 --> 00:00:06.000] Meeting (Ada): Then the budget."
    assert lines[4:] == ["# Meeting (Speaker 1) is Ada Lovelace", lines[5], "# Meeting (Speaker 1) is Ada"]
    assert not list(tmp_path.glob("*.names"))


def test_a_rename_in_a_transcript_appended_to_rewrites_only_its_own_lines(tmp_path):
    path = tmp_path / "t.txt"
    with TranscriptWriter(path) as first:
        first.write(spoken("an earlier session", "Speaker 1", 0.0))
    with TranscriptWriter(path) as w:
        w.write(spoken("this session", "Speaker 1", 0.0))
        w.rename_speaker("Meeting", "Speaker 1", "Grace")
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[1] == "[00:00:00.000 --> 00:00:01.000] Meeting (Speaker 1): an earlier session"
    assert lines[3] == "[00:00:00.000 --> 00:00:01.000] Meeting (Grace): this session"
