"""`captioner listen --server` against a real `captioner serve`: speech played into a PulseAudio
null sink, its monitor captured by listen, captioned by tiny.en on the CPU in the server process.
The server is killed mid-session and started again: listen says so, reconnects, goes on, and the
lines it had shown stay in its output and its transcript."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request

import pytest
from serve_helpers import TOKEN

from e2e_helpers import wait_for, words_of

pytestmark = [pytest.mark.pulse, pytest.mark.slow]

FIRST = "en_ls_1089-134686-0000"  # "he hoped there would be stew for dinner turnips and carrots ..."
SECOND = "en_jfk_inaugural_excerpt"  # "... ask not what your country can do for you ..."


class Proc:
    """A captioner subprocess with its stdout and stderr lines collected by threads."""

    def __init__(self, args: list[str], env: dict) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "captioner", *args], env=env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self.out: list[str] = []
        self.err: list[str] = []
        for stream, into in ((self.process.stdout, self.out), (self.process.stderr, self.err)):
            threading.Thread(target=self._read, args=(stream, into), daemon=True).start()

    @staticmethod
    def _read(stream, into):
        for line in stream:
            into.append(line.rstrip("\n"))

    def said(self, words: str) -> bool:
        return any(words in line for line in self.err)

    def stop(self, sig=signal.SIGINT, timeout_s=60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout_s)
        finally:
            if self.process.poll() is None:
                self.process.kill()


def start_server(port: int, token_file, env) -> Proc:
    server = Proc(["serve", "--port", str(port), "--token-file", str(token_file), "--device", "cpu"], env)
    wait_for(lambda: server.said("serving") or server.process.poll() is not None, 180, "the server")
    assert server.process.poll() is None, "\n".join(server.err)
    return server


def test_listen_captions_on_the_server_and_survives_its_restart(pulse_server, speech_clips, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("CAPTIONER_DEVICE", None)
    server = Proc(["serve", "--port", "0", "--token-file", str(token_file), "--device", "cpu", "--metrics-port", "0"],
                  env)
    listen = None
    try:
        wait_for(lambda: server.out or server.process.poll() is not None, 180, "the server's port")
        assert server.process.poll() is None, "\n".join(server.err)
        port = int(server.out[0])
        transcript = tmp_path / "t.txt"
        listen = Proc(["listen", "--server", f"ws://127.0.0.1:{port}", "--token-file", str(token_file),
                       "--input", pulse_server.sink.device, "--transcript", str(transcript)],
                      dict(pulse_server.env, PYTHONUNBUFFERED="1"))
        wait_for(lambda: listen.said("listening to") or listen.process.poll() is not None, 60, "listen")
        assert listen.process.poll() is None, "\n".join(listen.err)
        assert listen.said(f"on the server ws://127.0.0.1:{port}")
        player = pulse_server.play(speech_clips[FIRST].wav)
        wait_for(lambda: player.poll() is not None, 60, "paplay")
        wait_for(lambda: {"potatoes", "sauce"} <= words_of(" ".join(listen.out)), 120,
                 "the first recording's last words as committed lines")
        shown_before = list(listen.out)
        # --metrics-port: the server's Prometheus exporter counts the stream and its captions.
        (where,) = [line.split(" on ", 1)[1] for line in server.err if "Prometheus metrics on" in line]
        scraped = urllib.request.urlopen(where, timeout=10).read().decode()
        assert "captioner_streams 1.0" in scraped and "captioner_pipeline_info" in scraped, scraped[:2000]

        server.stop(signal.SIGKILL)  # the server dies: no close frame, no finals
        wait_for(lambda: listen.said("lost"), 30, "listen to notice the server is gone")
        server = start_server(port, token_file, env)
        wait_for(lambda: listen.said("is back"), 60, "listen to reconnect")
        player = pulse_server.play(speech_clips[SECOND].wav)
        wait_for(lambda: player.poll() is not None, 60, "paplay")
        wait_for(lambda: {"country", "americans"} <= words_of(" ".join(listen.out)), 120,
                 "the second recording captioned after the restart")
        assert listen.stop() == 0, "\n".join(listen.err)
    finally:
        if listen is not None:
            listen.stop(signal.SIGKILL, 5)
        server.stop()
    printed = listen.out
    assert printed[:len(shown_before)] == shown_before, "nothing shown before the restart was lost"
    # A monitor of an output is a meeting (source=meeting): the server's --speakers auto labels
    # its speakers, each turn headed by the stream and the speaker on a line of its own.
    assert re.fullmatch(r"\[Meeting \(Speaker \d\)\]", printed[0]), printed
    text = " ".join(line for line in printed if not line.startswith("[Meeting"))
    # (Not "ask": tiny.en hears JFK's "ask not" as "asked not" at some timings.)
    assert {"stew", "dinner", "carrots", "potatoes", "americans", "country"} <= words_of(text), text
    saved = transcript.read_text(encoding="utf-8").splitlines()[1:]
    # A line per commit in the transcript, cues on stdout: the same words.
    assert all(re.match(r"\[[^]]+\] Meeting \(Speaker \d\): ", line) for line in saved), saved
    assert " ".join(line.split("): ", 1)[1] for line in saved).split() == text.split()
    assert any("was lost 1 time" in line for line in listen.err), listen.err
