"""`captioner listen --file`: a recording captioned as if it were said now, headless (no
microphone, no sound server). With files alone the session ends by itself once every file has
played, its last words committed and its transcript closed, with exit status 0; a file that is
missing or not audio is one line and exit status 2 before anything starts.

Through a `captioner serve` server the same file is captioned there: tests/serve/test_listen_file_remote.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from captioner.app.cli import main
from e2e_helpers import words_of

JFK = Path(__file__).resolve().parent.parent / "src" / "captioner" / "data" / "jfk_inaugural_1961.flac"
"""11 s: "And so my fellow Americans, ask not what your country can do for you; ask what you can
do for your country." (it ships with the package)"""


@pytest.mark.parametrize("server", [None, "ws://127.0.0.1:9"])
def test_a_missing_or_unreadable_file_is_one_line(tmp_path, capsys, server):
    (tmp_path / "notes.wav").write_text("not audio", encoding="utf-8")
    extra = ["--server", server] if server else ["--device", "cpu"]
    for name, words in (("missing.wav", "audio file not found"), ("notes.wav", "not an audio file")):
        transcript = tmp_path / "t.txt"
        code = main(["listen", "--file", str(JFK), "--file", str(tmp_path / name), "--transcript", str(transcript),
                     *extra])
        out, err = capsys.readouterr()
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert err.startswith("captioner: error: ") and words in err, err
        assert not transcript.exists()  # refused before anything started


@pytest.mark.slow
def test_a_file_is_captioned_in_real_time_and_the_session_ends_by_itself(tmp_path):
    transcript = tmp_path / "t.txt"
    env = dict(os.environ, CAPTIONER_DEVICE="cpu", PYTHONUNBUFFERED="1")
    # Bounded: 11 s of audio at its own pace, the model's load, the last commit.
    done = subprocess.run([sys.executable, "-m", "captioner", "listen", "--file", str(JFK), "--transcript",
                           str(transcript)], env=env, capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    errors = done.stderr.splitlines()
    assert "captioner: listening to jfk_inaugural_1961 (tiny.en on CPUExecutionProvider)" in done.stderr
    assert "captioner: finished: every file has played" in errors, errors
    assert errors[-1].startswith(f"captioner: transcript saved to {transcript} ("), errors
    lines = done.stdout.splitlines()
    # A file's speakers are labelled (--speakers auto): each turn is headed by the file and the
    # speaker on a line of its own.
    assert lines and re.fullmatch(r"\[jfk_inaugural_1961 \(Speaker \d\)\]", lines[0]), lines
    text = " ".join(line for line in lines if not line.startswith("[jfk_inaugural_1961"))
    assert {"fellow", "americans", "country", "do", "for", "your"} <= words_of(text), text
    saved = transcript.read_text(encoding="utf-8").splitlines()[1:]
    # Every committed line is in the transcript, the last words too: the same words as the cues.
    assert all(re.match(r"\[[^]]+\] jfk_inaugural_1961 \(Speaker \d\): ", line) for line in saved), saved
    assert " ".join(line.split("): ", 1)[1] for line in saved).split() == text.split()
