"""A flag given once, then a plain launch: the app as a user starts it, in a real X server.

`captioner gui --server … --token-file … --overlay --theme light` once, and `gui --model nosuch`
once, must leave nothing behind: the next plain launch captions the default input (a private
PulseAudio whose default source hears a recording played into it). And a server that an older
version did save, and that now refuses, gives way to this computer for the run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from captioner.trace import load_trace
from captioner.ui.settings import load_settings, open_settings, save_settings
from e2e_helpers import words_of

pytestmark = [pytest.mark.pulse, pytest.mark.slow]

SPEECH = "en_jfk_inaugural_excerpt"  # "... ask not what your country can do for you ..."


class _Refuses(BaseHTTPRequestHandler):
    """A server that answers every WebSocket handshake 401, as `captioner serve` does for a
    wrong token."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(401)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def refusing_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refuses)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"ws://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def gui(tmp_path, pulse_server):
    if shutil.which("xvfb-run") is None:
        pytest.skip("xvfb-run is not installed")
    ini = tmp_path / "settings.ini"
    env = dict(os.environ, CAPTIONER_TRANSCRIPT_DIR=str(tmp_path / "transcripts"), CAPTIONER_DEVICE="cpu",
               PULSE_SERVER=pulse_server.server)
    env.pop("QT_QPA_PLATFORM", None)  # the real xcb platform

    def run(*argv, timeout_s=240):
        return subprocess.run(["xvfb-run", "-a", "-s", "-screen 0 1920x1080x24", sys.executable, "-m", "captioner",
                               "gui", "--settings", str(ini), *argv],
                              env=env, capture_output=True, text=True, timeout=timeout_s)

    run.ini = str(ini)
    return run


def _play_while(process_done: threading.Event, pulse_server, wav) -> threading.Thread:
    """Plays ``wav`` into the default sink again and again until ``process_done``."""

    def loop():
        while not process_done.is_set():
            player = pulse_server.play(wav)
            while player.poll() is None and not process_done.wait(0.2):
                pass
            if player.poll() is None:
                player.kill()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def _plain_launch(gui, pulse_server, speech_clips, tmp_path, *extra):
    """`captioner gui` with nothing but the settings file, while speech plays into the default
    input; returns (result, committed text)."""
    trace = tmp_path / "plain.trace.jsonl"
    done = threading.Event()
    _play_while(done, pulse_server, speech_clips[SPEECH].wav)
    try:
        result = gui("--quit-after", "30", "--save-trace", str(trace), *extra)
    finally:
        done.set()
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    committed = " ".join(c.text for c in load_trace(trace).final_captions())
    return result, committed


def test_flags_given_once_leave_the_next_plain_launch_as_it_was_and_a_refusing_server_gives_way(
        gui, refusing_server, pulse_server, speech_clips, tmp_path):
    """Flags given once (a server that refuses, the overlay, a theme, a policy) and a bad model
    leave the settings as they were. Then, as an older version (or a choice in the app) would
    have, the refusing server is saved: the next plain launch captions the default input on this
    computer and keeps the saved server (one launch of 30 s for both)."""
    token = tmp_path / "token"
    token.write_text("not-the-token-this-server-takes\n")
    first = gui("--server", refusing_server, "--token-file", str(token), "--overlay", "--theme", "light",
                "--policy", "localagreement", "--quit-after", "4")
    assert first.returncode == 0, first.stderr[-3000:]
    nosuch = gui("--model", "nosuch")
    assert nosuch.returncode == 2 and nosuch.stderr.count("\n") == 1 and "nosuch" in nosuch.stderr
    s = load_settings(open_settings(gui.ini))
    assert (s.server, s.model, s.overlay_visible, s.theme, s.policy) == ("", "tiny.en", False, "dark", "auto")

    save_settings(open_settings(gui.ini), replace(s, server=refusing_server))
    shot = tmp_path / "fallback.png"
    _, committed = _plain_launch(gui, pulse_server, speech_clips, tmp_path, "--screenshot", str(shot))
    assert {"ask", "country"} <= words_of(committed), committed
    after = load_settings(open_settings(gui.ini))
    assert after.server == refusing_server
    assert (after.model, after.overlay_visible, after.theme, after.policy) == ("tiny.en", False, "dark", "auto")
    assert shot.stat().st_size > 10_000
