"""`scripts/run-app.sh` as a new user runs it a second time, on a machine with no display and no
microphone, watched through a pty as a terminal shows it (issue 15):

- the set-up is skipped (its stamp) and the first line is on the terminal within 3 s;
- the bundled sample is captioned live: the first committed words appear within 4 s of the end of
  the audio's first sentence, while the rest still plays, not all at once at the end;
- partial words are drawn dim and rewritten in place, committed lines scroll.

The set-up itself runs first (a no-op when it is up to date, as after scripts/run-tests.sh).
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
FIRST_SENTENCE_END_S = 2.24
"""Where "And so, my fellow Americans" ends in the bundled sample: the end of "Americans" in the
word times of a live run (AlignAtt's alignment); by ear 2.2-2.3 s."""
FIRST_COMMIT_BOUND_S = 4.0
SECOND_LAUNCH_FIRST_LINE_S = 3.0
_DIM = re.compile(r"\x1b\[2m.*?\x1b\[0m", re.S)
_CODES = re.compile(r"\x1b\[\d*[A-Za-z]")


def committed(raw: str) -> str:
    return _CODES.sub("", _DIM.sub("", raw))


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "CAPTIONER_DEVICE", "QT_QPA_PLATFORM")}
    env["PULSE_SERVER"] = "unix:/nonexistent/captioner-test"  # no sound server: no input device
    return env


@pytest.fixture(scope="module")
def set_up():
    if not (REPO / ".venv" / "bin" / "captioner").exists():
        pytest.skip("needs the checkout's .venv (scripts/setup.sh)")
    done = subprocess.run(["scripts/setup.sh", "app"], cwd=REPO, env=environment(), capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    probe = subprocess.run(
        [str(REPO / ".venv" / "bin" / "python"), "-c",
         "from captioner.audio.devices import list_input_devices as ls; print(any(d.is_default for d in ls()))"],
        env=environment(), capture_output=True, text=True, timeout=60)
    if probe.stdout.strip() == "True":
        pytest.skip("this machine has a default input: run-app.sh would caption it, not the sample")


def watch(argv: list[str], timeout_s: float = 180.0) -> tuple[list[tuple[float, str, str]], int]:
    """Runs ``argv`` with stdout on a pty and stderr on a pipe; returns what each wrote, when
    (seconds since the start), and the exit status."""
    leader, follower = os.openpty()
    err_read, err_write = os.pipe()
    start = time.monotonic()
    process = subprocess.Popen(argv, cwd=REPO, env=environment(), stdin=subprocess.DEVNULL,
                               stdout=follower, stderr=err_write)
    os.close(follower)
    os.close(err_write)
    names = {leader: "out", err_read: "err"}
    seen: list[tuple[float, str, str]] = []
    try:
        while names and time.monotonic() - start < timeout_s:
            ready, _, _ = select.select(list(names), [], [], 0.5)
            for fd in ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:  # the child closed the terminal
                    chunk = b""
                if not chunk:
                    del names[fd]
                    continue
                seen.append((time.monotonic() - start, names[fd], chunk.decode("utf-8", "replace")))
        code = process.wait(timeout=max(1.0, timeout_s - (time.monotonic() - start)))
    finally:
        os.close(leader)
        os.close(err_read)
        if process.poll() is None:
            process.kill()
    return seen, code


def test_a_second_launch_without_display_or_microphone_captions_the_sample_live(set_up):
    seen, code = watch(["scripts/run-app.sh"])
    transcript = "".join(text for _, _, text in seen)
    assert code == 0, transcript
    assert "Traceback" not in transcript

    first_s = seen[0][0]
    assert "up to date" in seen[0][2], transcript  # the set-up was skipped
    assert first_s < SECOND_LAUNCH_FIRST_LINE_S, f"first line after {first_s:.2f} s"
    assert "no display and no microphone; captioning the bundled sample" in transcript

    playing_s = next(t for t, name, text in seen if name == "err" and "captioner: playing" in text)
    out_so_far, first_commit_s = "", None
    for t, name, text in seen:
        if name == "out" and t >= playing_s:
            out_so_far += text
            if first_commit_s is None and committed(out_so_far).strip():
                first_commit_s = t
    assert first_commit_s is not None, transcript
    first_line = committed(out_so_far).strip().lower()
    assert "americans" in first_line, first_line

    # Live, as `listen` draws it: partials dim and rewritten in place, and more committed text
    # came after the first (the rest of the clip was still playing).
    out = "".join(text for _, name, text in seen if name == "out")
    assert "\x1b[2m" in out and "\r\x1b[K" in out
    later = committed("".join(text for t, name, text in seen if name == "out" and t > first_commit_s)).lower()
    assert "country" in later, out

    after_sentence_s = first_commit_s - playing_s - FIRST_SENTENCE_END_S
    if after_sentence_s > FIRST_COMMIT_BOUND_S:
        # The CPU path needs about 0.65 of a core to keep real time (docs/latency.md): on a
        # machine running several times more work than it has cores, no bound on latency holds.
        load = os.getloadavg()[0]
        cores = os.cpu_count() or 1
        if load > 1.5 * cores:
            pytest.xfail(f"first commit {after_sentence_s:.2f} s after the sentence, on a machine "
                         f"oversubscribed (load {load:.1f} on {cores} cores)")
    assert after_sentence_s <= FIRST_COMMIT_BOUND_S, \
        f"first committed line {after_sentence_s:.2f} s after the first sentence ended:\n{transcript}"
