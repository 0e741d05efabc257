"""`captioner transcribe` end to end on a real recording: every output format parses with a
real parser, bad input is one line on stderr and exit code 2."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import srt
import webvtt

from captioner.app.cli import main
from captioner.app.progress import TextProgress
from e2e_helpers import words_of

pytestmark = pytest.mark.slow


@pytest.fixture()
def cli(onnx_cache_dir, monkeypatch, capsys):
    # The session's private model cache (conftest): tiny.en and base are converted once a run,
    # not again for this module.
    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(onnx_cache_dir))
    monkeypatch.setenv("CAPTIONER_DEVICE", "cpu")

    def run(*argv):
        code = main(["transcribe", *map(str, argv)])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_text_to_stdout(cli, speech_clips):
    code, out, err = cli(speech_clips["en_jfk_inaugural_excerpt"].wav)
    assert code == 0
    # Laid out as captions: a cue's lines may break anywhere in the sentence.
    assert "ask not what your country can do for you" in " ".join(out.lower().split())
    assert out.endswith("\n") and "-->" not in out
    assert "detected language" not in err  # an English-only model detects nothing


def test_a_multilingual_model_says_which_language_it_detected(cli, speech_clips):
    code, out, err = cli(speech_clips["zh_BAC009S0724W0121"].wav, "--model", "base")
    assert code == 0 and out.strip()
    assert [line for line in err.splitlines() if "detected language" in line] == [
        "captioner: detected language: Chinese (zh)"]
    code, _, err = cli(speech_clips["zh_BAC009S0724W0121"].wav, "--model", "base", "--language", "zh")
    assert code == 0 and "detected language" not in err  # named, not detected


def test_a_too_short_file_is_the_same_error_offline_and_live(cli, tmp_path):
    short = tmp_path / "one-sample.wav"
    soundfile.write(short, np.zeros(1, np.float32), 16_000)
    offline, live = cli(short), cli(short, "--realtime")
    assert offline[0] == live[0] == 2 and offline[1] == live[1] == ""
    assert offline[2] == live[2] and offline[2].count("\n") == 1, (offline, live)


def test_srt_of_a_long_recording_parses(cli, speech_clips, tmp_path):
    # The 53 s sonnet: the subtitles run past the 30 s window, in order, to its end.
    wav = speech_clips["en_sonnet001_librivox"].wav
    code, out, _ = cli(wav, "--model", "tiny.en", "--language", "en", "-o", tmp_path / "s.srt")
    assert code == 0 and out == ""
    subs = list(srt.parse((tmp_path / "s.srt").read_text(encoding="utf-8"), ignore_errors=False))
    assert len(subs) >= 4
    assert subs[-1].end.total_seconds() > 45
    assert all(a.start <= b.start for a, b in zip(subs, subs[1:]))
    assert "fairest creatures" in " ".join(s.content for s in subs).lower()


def test_vtt_and_jsonl_files_parse_and_carry_the_srt_cues(cli, speech_clips, tmp_path):
    # The formats differ only in how the same cues are written: a 2 s clip shows that as well as
    # the long recording above does, at a twentieth of the decoding.
    wav = speech_clips["en_ls_7902-96591-0000"].wav
    code, out, _ = cli(wav, "-o", tmp_path / "s.srt")
    assert code == 0 and out == ""
    subs = list(srt.parse((tmp_path / "s.srt").read_text(encoding="utf-8"), ignore_errors=False))
    assert subs and "cutter" in " ".join(s.content for s in subs).lower()

    code, _, _ = cli(wav, "--format", "vtt", "-o", tmp_path / "s.txt")
    assert code == 0
    cues = list(webvtt.from_buffer(io.StringIO((tmp_path / "s.txt").read_text(encoding="utf-8"))))
    assert [c.text for c in cues] == [s.content for s in subs]

    code, out, _ = cli(wav, "--format", "jsonl")
    assert code == 0
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["text"] for r in records] == [s.content for s in subs]
    assert all(r["stream"] == "en_ls_7902-96591-0000" and r["kind"] == "final" for r in records)
    assert {"start_s", "end_s", "emitted_audio_s", "emitted_wall_s"} <= set(records[0])


@pytest.mark.parametrize(
    "argv,message",
    [
        (["{missing}"], "not found"),
        (["{notaudio}"], "not an audio file"),
        (["{wav}", "--language", "de"], "English-only"),
        (["{wav}", "--task", "translate"], "cannot translate"),
        (["{wav}", "--model", "base", "--language", "xx"], "unknown language"),
        (["{wav}", "--model", "{tmp}"], "lacks model.bin"),
        (["{wav}", "-o", "{tmp}"], "is a folder"),
        (["{wav}", "-o", "{tmp}/no/such/out.srt"], "does not exist"),
        (["{wav}", "--realtime", "-o", "{tmp}"], "is a folder"),
        (["{short}"], "too short"),
        (["{short}", "--realtime"], "too short"),
    ],
)
def test_bad_input_is_one_line(cli, speech_clips, tmp_path, argv, message):
    (tmp_path / "notaudio.wav").write_text("hello", encoding="utf-8")
    soundfile.write(tmp_path / "short.wav", np.zeros(1, np.float32), 16_000)  # one sample
    values = {
        "short": tmp_path / "short.wav",
        "missing": tmp_path / "missing.wav",
        "notaudio": tmp_path / "notaudio.wav",
        "wav": speech_clips["en_ls_7902-96591-0000"].wav,  # any short clip that ships in tests/data
        "tmp": tmp_path,
    }
    code, out, err = cli(*[a.format(**values) for a in argv])
    assert code == 2 and out == ""
    lines = [line for line in err.splitlines() if line.startswith("captioner: error:")]
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err


def test_help_needs_no_model():
    out = subprocess.run([sys.executable, "-m", "captioner", "transcribe", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0
    for flag in ("--model", "--language", "--task", "--format", "--output", "--device", "--realtime"):
        assert flag in out.stdout


def test_progress_bar_text():
    stream = io.StringIO()
    bar = TextProgress(stream)
    bar("building encoder", 0.0)
    bar("building encoder", 0.5)
    bar("saving", 1.0)
    bar.close()
    # Not a terminal: one line per stage, no carriage returns.
    assert stream.getvalue() == "  0% building encoder\n100% saving\n"

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    bar = TextProgress(tty, width=10)
    bar("building", 0.5)
    bar.close()
    assert tty.getvalue().startswith("\r[#####-----]  50% building") and tty.getvalue().endswith("\n")


def test_progress_bar_on_a_terminal_shows_every_stage_and_the_end_but_rate_limits_steps():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    bar = TextProgress(tty, width=10)
    bar("converting", 0.0)
    for step in range(1, 50):  # a burst of small steps well inside 0.1 s
        bar("converting", step / 100)
    bar("saving", 0.6)  # a new stage: drawn at once
    bar("saving", 1.0)  # the end: drawn at once
    bar.close()
    bar.close()  # twice is harmless
    draws = tty.getvalue().split("\r")[1:]
    assert len(draws) < 10, "every small step was redrawn"
    assert draws[0].startswith("[----------]   0% converting")
    assert any(d.startswith("[######----]  60% saving") for d in draws)
    assert draws[-1].startswith("[##########] 100% saving") and tty.getvalue().endswith("\n")
    assert tty.getvalue().count("\n") == 1


def test_progress_says_nothing_when_nothing_is_being_done():
    """A cached model reports itself done at once: no line, no bar, no line end; work under way
    is shown to its end; a bar closed with ``leave=False`` takes itself off the screen."""
    class Tty(io.StringIO):
        def isatty(self):
            return True

    for stream in (io.StringIO(), Tty()):
        bar = TextProgress(stream)
        bar("tiny.en: ONNX graphs cached", 1.0)
        bar.close()
        assert stream.getvalue() == ""
    pipe = io.StringIO()
    bar = TextProgress(pipe)
    bar("tiny.en: ONNX graphs cached", 1.0)
    bar("base: building encoder", 0.0)
    bar("base: ONNX graphs ready", 1.0)
    bar("tiny.en: ONNX graphs cached", 1.0)
    assert pipe.getvalue() == "  0% base: building encoder\n100% base: ONNX graphs ready\n"
    tty = Tty()
    bar = TextProgress(tty, width=10, leave=False)
    bar("transcribing", 0.3)
    bar("transcribing", 1.0)
    bar.close()
    assert "\n" not in tty.getvalue() and tty.getvalue().rstrip(" ").endswith("\r")


def _visible(text: str) -> list[str]:
    """The lines a terminal shows for ``text``: what follows the last carriage return of each."""
    return [line.rstrip("\r").rsplit("\r", 1)[-1].rstrip() for line in text.split("\n")]


def _on_terminals(argv: list[str], env: dict, one_terminal: bool) -> tuple[str, str]:
    """Runs ``argv`` with stdout and stderr on pseudo-terminals of 100 columns (the same one, or
    one each); what each showed."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    import time

    def terminal():
        primary, secondary = pty.openpty()
        fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
        return primary, secondary

    out = terminal()
    err = out if one_terminal else terminal()
    process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out[1], stderr=err[1])
    for _, secondary in {out, err}:
        os.close(secondary)
    shown = {out[0]: b"", err[0]: b""}
    open_fds = set(shown)
    deadline = time.monotonic() + 120
    try:
        while open_fds and time.monotonic() < deadline:
            for fd in select.select(list(open_fds), [], [], 1.0)[0]:
                try:
                    piece = os.read(fd, 4096)
                except OSError:  # EIO: every writer has closed the terminal
                    piece = b""
                if piece:
                    shown[fd] += piece
                else:
                    open_fds.discard(fd)
        assert process.wait(max(1.0, deadline - time.monotonic())) == 0
    finally:
        if process.poll() is None:
            process.kill()
        for primary in set(shown):
            os.close(primary)
    return shown[out[0]].decode(), shown[err[0]].decode()


def test_a_cached_model_prints_no_progress_and_the_text_comes_first(onnx_cache_dir):
    """Through a pipe and on terminals (stdout and stderr apart, and on one), a transcript whose
    model is cached is the text alone: no progress line, no blank line before it."""
    jfk = Path(__file__).resolve().parent.parent / "src" / "captioner" / "data" / "jfk_inaugural_1961.flac"
    env = dict(os.environ, CAPTIONER_CACHE_DIR=str(onnx_cache_dir), CAPTIONER_DEVICE="cpu")
    argv = [sys.executable, "-m", "captioner", "transcribe", str(jfk)]
    subprocess.run(argv, env=env, capture_output=True, timeout=300, check=True)  # the graphs are cached now
    piped = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and piped.stderr == ""
    assert {"and", "so", "fellow"} <= words_of(piped.stdout.split("\n")[0]), piped.stdout
    out, err = _on_terminals(argv, env, one_terminal=False)
    assert {"and", "so", "fellow"} <= words_of(out.split("\n")[0]), repr(out)
    assert "\n" not in err and not "".join(_visible(err)), repr(err)
    both, _ = _on_terminals(argv, env, one_terminal=True)
    assert {"and", "so", "fellow"} <= words_of(_visible(both)[0]), repr(both)
