"""`captioner listen --server URL --file PATH`: a recording played here at real-time pace and
captioned by a real `captioner serve` (tiny.en on the CPU) on loopback, no sound server needed;
the session ends by itself when the file has played. A server that wants a token says so when
none was sent, and says it refused the token when a wrong one was."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from serve_helpers import TOKEN

from e2e_helpers import wait_for, words_of

JFK = Path(__file__).resolve().parents[2] / "src" / "captioner" / "data" / "jfk_inaugural_1961.flac"


class _Answers401:
    """A loopback HTTP server that answers every request 401, as a server with a token does to
    a client without the right one (no model, no WebSocket)."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.url = f"ws://127.0.0.1:{self.socket.getsockname()[1]}"
        self.tokens: list[str | None] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            with connection:
                request = b""
                while b"\r\n\r\n" not in request:
                    piece = connection.recv(4096)
                    if not piece:
                        break
                    request += piece
                headers = request.decode("latin-1").splitlines()
                self.tokens.append(next((h.split("Bearer ", 1)[1] for h in headers
                                         if h.lower().startswith("authorization:")), None))
                connection.sendall(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


def test_a_401_says_whether_a_token_is_needed_or_was_refused():
    from captioner.audio.file_source import FileSource
    from captioner.errors import UserError
    from captioner.serve.client import RemotePipeline

    server = _Answers401()
    try:
        for token, words in ((None, "the server needs a token (401): pass --token-file"),
                             (TOKEN, "the server refused the token (401): check --token-file")):
            remote = RemotePipeline([FileSource(JFK, stream="Me", realtime=True)], server=server.url, token=token)
            with pytest.raises(UserError) as caught:
                remote.start(timeout_s=30)
            assert str(caught.value) == f"{server.url}: {words}"
    finally:
        server.socket.close()
    assert server.tokens == [None, TOKEN]


class _Proc:
    """A captioner subprocess, its stdout and stderr lines collected by threads."""

    def __init__(self, args: list[str]) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("CAPTIONER_DEVICE", None)
        self.process = subprocess.Popen([sys.executable, "-m", "captioner", *args], env=env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [threading.Thread(target=lambda s=stream, i=into: i.extend(line.rstrip("\n") for line in s),
                                          daemon=True)
                         for stream, into in ((self.process.stdout, self.out), (self.process.stderr, self.err))]
        for reader in self._readers:
            reader.start()

    def finish(self, timeout_s: float) -> int:
        """The exit status, once every line it wrote was read; killed after ``timeout_s``."""
        try:
            return self.process.wait(timeout_s)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(10)
            for reader in self._readers:
                reader.join(10)


@pytest.mark.slow
def test_listen_plays_a_file_to_the_server_and_ends_when_it_has_played(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    wrong_file = tmp_path / "wrong"
    wrong_file.write_text("wrong-token-0123456789abcdef\n")
    server = _Proc(["serve", "--port", "0", "--token-file", str(token_file), "--device", "cpu"])
    try:
        wait_for(lambda: any("serving" in line for line in server.err) or server.process.poll() is not None, 180,
                 "the server")
        assert server.process.poll() is None, "\n".join(server.err)
        url = f"ws://127.0.0.1:{int(server.out[0])}"
        for token_args, words in (([], "the server needs a token (401): pass --token-file"),
                                  (["--token-file", str(wrong_file)], "the server refused the token (401)")):
            refused = _Proc(["listen", "--server", url, *token_args, "--file", str(JFK), "--no-transcript"])
            assert refused.finish(60) == 2
            assert refused.err[-1].startswith(f"captioner: error: {url}: {words}"), refused.err
        transcript = tmp_path / "t.txt"
        listen = _Proc(["listen", "--server", url, "--token-file", str(token_file), "--file", str(JFK),
                        "--transcript", str(transcript)])
        assert listen.finish(120) == 0, "\n".join(listen.err)  # 11 s of audio, then the finals
    finally:
        server.process.terminate()
        server.finish(60)
    assert f"on the server {url}" in listen.err[1] and "captioner: finished: every file has played" in listen.err
    # listen says it plays a file (source=file): the server's --speakers auto labels its speakers,
    # as a local listen does, each turn headed by the file and the speaker on a line of its own.
    assert re.fullmatch(r"\[jfk_inaugural_1961 \(Speaker \d\)\]", listen.out[0]), listen.out
    text = " ".join(line for line in listen.out if not line.startswith("[jfk_inaugural_1961"))
    assert {"fellow", "americans", "country", "do", "for", "your"} <= words_of(text), text
    saved = transcript.read_text(encoding="utf-8").splitlines()[1:]
    assert all(re.match(r"\[[^]]+\] jfk_inaugural_1961 \(Speaker \d\): ", line) for line in saved), saved
    assert " ".join(line.split("): ", 1)[1] for line in saved).split() == text.split()
