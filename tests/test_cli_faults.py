"""Bad output paths and interrupted runs, through the real CLI: each ends in one line on stderr
and a documented exit status (2: an error; 130: Ctrl-C, what was committed kept; 141: the reader
of stdout went away, nothing said), or keeps working; never a traceback, never a 0-byte or
half-written output file (docs/reliability.md, "Bad output paths and interrupted runs")."""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import srt

from captioner.app.cli import PIPE_CLOSED_EXIT, main
from captioner.data import sample_speech_path
from captioner.engine import offline, pipeline

pytestmark = pytest.mark.slow

CLIP = "en_ls_7902-96591-0000"  # 2 s, one committed line
THREE_LINES = "en_ls_1089-134691-0001"  # 5.4 s; a live replay commits it as three lines
JFK = str(sample_speech_path())  # 11 s; the first line is committed about 2 s in
HAS_DEV_FULL = Path("/dev/full").exists()
_PROGRESS = re.compile(r"^\s*\d+% ")  # the model's load progress, one line per stage off a terminal


def said(err: str) -> list[str]:
    """stderr without the progress lines: what the command told the person."""
    return [line for line in err.splitlines() if not _PROGRESS.match(line)]


def assert_one_line(err: str, message: str) -> None:
    assert "Traceback" not in err and "Exception ignored" not in err, err
    lines = said(err)
    assert len(lines) == 1 and lines[0].startswith("captioner: error: ") and message in lines[0], err


def run_captioner(*argv: str, shell_redirect: str = "", env: dict | None = None, **run) -> subprocess.CompletedProcess:
    """``python -m captioner ARGV`` in a subprocess; ``shell_redirect`` (``>&-``, ``> /dev/full``)
    is applied by a shell, as a person would type it."""
    command = [sys.executable, "-m", "captioner", *argv]
    if shell_redirect:
        command = ["sh", "-c", 'exec "$@" ' + shell_redirect, "sh", *command]
    run.setdefault("stdout", subprocess.PIPE)
    return subprocess.run(command, env=dict(env or os.environ, CAPTIONER_DEVICE="cpu"), stderr=subprocess.PIPE,
                          stdin=subprocess.DEVNULL, text=True, timeout=180, **run)


@pytest.fixture()
def cli(monkeypatch, capsys):
    monkeypatch.setenv("CAPTIONER_DEVICE", "cpu")

    def run(*argv):
        code = main(["transcribe", *map(str, argv)])
        out, err = capsys.readouterr()
        return code, out, err

    return run


class FullDisk:
    """``os.write`` to one file (by name) that fills the disk: after ``room_writes`` whole
    writes, the next takes 5 bytes (a torn start) and every later one fails with ENOSPC, as a
    real full disk does. Once :attr:`full`, every file beside it fails the same way. Other
    files, and the pipeline's threads, are left alone."""

    def __init__(self, monkeypatch, path: Path, room_writes: int = 0) -> None:
        self.path = os.path.realpath(path)
        self.room_writes = room_writes
        self.full = False
        self._torn = False
        self._real_write = os.write
        monkeypatch.setattr(os, "write", self._write)

    def _on_this_disk(self, fd: int) -> bool:
        try:
            name = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return False
        return name == self.path or (self.full and os.path.dirname(name) == os.path.dirname(self.path))

    def _write(self, fd, data):
        if not self._on_this_disk(fd):
            return self._real_write(fd, data)
        if self.room_writes > 0 and not self.full:
            self.room_writes -= 1
            return self._real_write(fd, data)
        if len(data) > 5 and not self._torn:
            self._torn = True
            return self._real_write(fd, bytes(data[:5]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


# -- transcribe -o: checked before any work, written whole or not at all --------------------------

@pytest.mark.skipif(not HAS_DEV_FULL, reason="no /dev/full here")
@pytest.mark.parametrize("live", [(), ("--realtime",), ("--realtime", "-f", "vtt")], ids=["offline", "live", "live-vtt"])
def test_an_output_on_a_full_disk_is_one_line(speech_clips, live):
    done = run_captioner("transcribe", str(speech_clips[CLIP].wav), *live, "-o", "/dev/full")
    assert done.returncode == 2 and done.stdout == ""
    assert_one_line(done.stderr, "cannot write /dev/full: No space left on device")
    assert Path("/dev/full").is_char_device()  # written in place: never replaced by a plain file


def test_a_disk_full_at_the_end_of_an_offline_run_leaves_no_file(cli, speech_clips, tmp_path, monkeypatch):
    out = tmp_path / "talk.srt"
    disk = FullDisk(monkeypatch, out)
    transcribe_file = offline.transcribe_file

    def fill_the_disk_meanwhile(*args, **kwargs):  # room for the check before the work, none after
        result = transcribe_file(*args, **kwargs)
        disk.full = True
        return result

    monkeypatch.setattr(offline, "transcribe_file", fill_the_disk_meanwhile)
    code, out_text, err = cli(speech_clips[CLIP].wav, "-o", out)
    assert code == 2 and out_text == ""
    assert_one_line(err, f"cannot write {out}: No space left on device")
    assert list(tmp_path.iterdir()) == []  # neither a 0-byte talk.srt nor the temporary file

    out.write_text("the old subtitles\n", encoding="utf-8")
    disk.full = False
    code, _, err = cli(speech_clips[CLIP].wav, "-o", out)
    assert code == 2 and "No space left on device" in err
    assert out.read_text(encoding="utf-8") == "the old subtitles\n"  # left as it was
    assert [p.name for p in tmp_path.iterdir()] == ["talk.srt"]


def test_the_output_is_checked_before_any_work(cli, speech_clips, tmp_path, monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("the model was loaded before the output was checked")

    monkeypatch.setattr(offline, "load_decoder", no_work)
    monkeypatch.setattr(pipeline, "Pipeline", no_work)
    wav = speech_clips[CLIP].wav
    for live in ((), ("--realtime",)):
        out = tmp_path / "full" / "talk.txt"
        out.parent.mkdir(exist_ok=True)
        with pytest.MonkeyPatch.context() as patch:
            FullDisk(patch, out).full = True  # the folder's disk is full
            code, _, err = cli(wav, *live, "-o", out)
        assert code == 2
        assert_one_line(err, "No space left on device")
        assert list(out.parent.iterdir()) == []
        # /proc takes no new files (and root passes every permission check).
        code, _, err = cli(wav, *live, "-o", "/proc/talk.txt")
        assert code == 2
        assert_one_line(err, "cannot write /proc/talk.txt")


def test_a_failed_write_keeps_the_whole_captions_of_a_live_replay(cli, speech_clips, tmp_path, monkeypatch):
    # A live replay writes its file in place, caption by caption: a kill must keep them. The
    # disk fills after the first caption: the file keeps it whole, the torn second is cut back.
    out = tmp_path / "live.srt"
    FullDisk(monkeypatch, out, room_writes=1)
    code, _, err = cli(JFK, "--realtime", "-o", out)  # two cues at least (104 characters)
    assert code == 2
    assert_one_line(err, f"cannot write {out}: No space left on device; it keeps the 1 caption(s) written before")
    cues = list(srt.parse(out.read_text(encoding="utf-8"), ignore_errors=False))
    assert [c.index for c in cues] == [1] and cues[0].content.strip()


def test_a_live_replay_that_fails_before_its_first_caption_leaves_no_file(cli, speech_clips, tmp_path, monkeypatch):
    out = tmp_path / "live.vtt"
    FullDisk(monkeypatch, out, room_writes=1)  # the WebVTT header fits, the first cue does not
    code, _, err = cli(speech_clips[CLIP].wav, "--realtime", "-o", out)
    assert code == 2
    assert_one_line(err, f"cannot write {out}: No space left on device")
    assert list(tmp_path.iterdir()) == []  # no header-only file that looks like a silent recording


def test_ctrl_c_keeps_the_committed_lines_of_a_live_replay_to_a_text_file(tmp_path):
    out = tmp_path / "live.txt"
    process = subprocess.Popen(
        [sys.executable, "-m", "captioner", "transcribe", JFK, "--realtime", "-f", "txt", "-o", str(out)],
        env=dict(os.environ, CAPTIONER_DEVICE="cpu"), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out.exists() and out.read_text(encoding="utf-8").endswith("\n")):
            assert process.poll() is None, process.stderr.read()
            assert time.monotonic() < deadline, "no committed line in 120 s"
            time.sleep(0.05)
        committed = out.read_text(encoding="utf-8")
        assert process.poll() is None, "the first line was written only at the end"
        process.send_signal(signal.SIGINT)  # Ctrl-C mid-replay
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130 and said(err) == [], err
    kept = out.read_text(encoding="utf-8")
    assert kept.startswith(committed) and committed.strip()  # the open text is committed after it
    assert all(line.strip() for line in kept.splitlines())


# -- stdout: closed, full, or its reader gone ---------------------------------------------------

def test_a_closed_stdout_is_refused_before_any_work_unless_the_output_is_a_file(speech_clips, tmp_path):
    wav = str(speech_clips[CLIP].wav)
    for argv in (("transcribe", wav), ("transcribe", wav, "--realtime"), ("devices", "--no-pulse")):
        done = run_captioner(*argv, shell_redirect=">&-", stdout=None)
        assert done.returncode == 2
        assert_one_line(done.stderr, "standard output is closed")
        assert "%" not in done.stderr  # said before the model was loaded
    # With -o the command needs no stdout; the file it opens must not inherit fd 1 either
    # (anything printed would then land in it).
    out = tmp_path / "talk.txt"
    done = run_captioner("transcribe", wav, "-o", str(out), shell_redirect=">&-", stdout=None)
    assert done.returncode == 0 and said(done.stderr) == [], done.stderr
    assert out.read_text(encoding="utf-8") == "I'm from the cutter lying off the coast.\n"


@pytest.mark.skipif(not HAS_DEV_FULL, reason="no /dev/full here")
@pytest.mark.parametrize("argv", [("transcribe", "{wav}"), ("transcribe", "{wav}", "--realtime", "-f", "jsonl"),
                                  ("devices", "--no-pulse")], ids=["offline", "live", "devices"])
def test_a_full_stdout_is_one_line(speech_clips, argv):
    done = run_captioner(*[a.format(wav=speech_clips[CLIP].wav) for a in argv], shell_redirect="> /dev/full",
                     stdout=None)
    assert done.returncode == 2
    assert_one_line(done.stderr, "cannot write standard output: No space left on device")


@pytest.mark.parametrize("live", [(), ("--realtime",)], ids=["offline", "live"])
def test_a_reader_that_goes_away_ends_the_command_quietly(speech_clips, live):
    read_fd, write_fd = os.pipe()
    os.close(read_fd)  # `| head -n 0`: nobody will read what is written
    try:
        done = run_captioner("transcribe", str(speech_clips[CLIP].wav), *live, stdout=write_fd)
    finally:
        os.close(write_fd)
    assert done.returncode == PIPE_CLOSED_EXIT == 141
    assert said(done.stderr) == [], done.stderr  # no traceback, no "Exception ignored", no error


# -- listen: the transcript's path, and a reader that goes away -----------------------------------

@pytest.mark.pulse
@pytest.mark.parametrize("where,message", [
    ("folder", "is a folder; give a file name"),
    ("/proc/transcript.txt", "/proc is not a disk"),
    ("/dev/full", "is not a regular file"),
    ("env:/proc/captioner", "(set by CAPTIONER_TRANSCRIPT_DIR): /proc is not a disk"),
    ("full-disk", "disk full"),
])
def test_listen_refuses_a_transcript_it_cannot_write_on_one_line(pulse_server, tmp_path, where, message):
    env = dict(pulse_server.env)
    argv = ["listen", "--input", pulse_server.sink.device]
    code = "from captioner.app.cli import main; raise SystemExit(main())"
    if where == "folder":
        argv += ["--transcript", str(tmp_path)]
    elif where.startswith("env:"):
        env["CAPTIONER_TRANSCRIPT_DIR"] = where[len("env:"):]
    elif where == "full-disk":
        env["CAPTIONER_TRANSCRIPT_DIR"] = str(tmp_path / "transcripts")
        # The transcripts' disk is full: no new file can be made there (where mounting a small
        # tmpfs is not allowed).
        code = textwrap.dedent("""
            import errno, os
            real_open, full = os.open, os.environ["CAPTIONER_TRANSCRIPT_DIR"]
            def full_open(path, flags, *args, **kwargs):
                if flags & os.O_CREAT and os.fspath(path).startswith(full):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
                return real_open(path, flags, *args, **kwargs)
            os.open = full_open
        """) + code
    else:
        argv += ["--transcript", where]
    done = subprocess.run([sys.executable, "-c", code, *argv], env=dict(env, CAPTIONER_DEVICE="cpu"),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert_one_line(done.stderr, message)  # and before the model was loaded: no "loading" line
    assert not Path("/proc/captioner").exists()
    if where == "full-disk":
        assert not any((tmp_path / "transcripts").iterdir())


@pytest.mark.pulse
def test_listen_piped_into_head_ends_quietly_and_keeps_its_transcript(pulse_server, speech_clips, tmp_path):
    transcript = tmp_path / "t.txt"
    process = subprocess.Popen(
        # No speaker labels: the one line `head` reads is then a cue's words, not a turn's heading.
        [sys.executable, "-m", "captioner", "listen", "--input", pulse_server.sink.device,
         "--transcript", str(transcript), "--speakers", "off"],
        env=dict(pulse_server.env, CAPTIONER_DEVICE="cpu"), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        started: list[str] = []
        while not started or "listening to" not in started[-1]:
            started.append(process.stderr.readline())
            assert process.poll() is None and time.monotonic() < deadline, "".join(started)
        pulse_server.play(speech_clips[THREE_LINES].wav)
        first = process.stdout.readline()  # `| head -n 1`: one line read, then the reader is gone
        assert first.startswith("[Meeting] "), first
        process.stdout.close()
        pulse_server.play(speech_clips[THREE_LINES].wav)  # more lines, with nowhere to go
        assert process.wait(timeout=120) == PIPE_CLOSED_EXIT
        err = process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
    assert said(err) == [], err
    lines = transcript.read_text(encoding="utf-8").splitlines()[1:]
    # The transcript has a line per commit, the view a cue's lines: the words shown are kept.
    kept = " ".join(line.split("Meeting: ", 1)[1] for line in lines).split()
    shown = first[len("[Meeting] "):].split()
    assert shown and kept[:len(shown)] == shown
