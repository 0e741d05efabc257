"""`captioner serve` for real: tiny.en on the CPU behind a WebSocket server on a loopback port,
clients streaming real recordings at real-time pace."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from serve_helpers import (
    Session,
    check_capacity_refusal,
    clients_at_once,
    connect,
    receive_all,
    stream_recording,
    stream_then_stop,
    unwritten_finals,
    words_of,
)

from captioner.serve import protocol

pytestmark = pytest.mark.slow

CLIPS = ("en_ls_1089-134691-0001", "en_ami_ES2011a_hs0_40-46s", "en_ljspeech_LJ001-0001")


def test_three_clients_get_their_own_captions(served, speech_clips, offline_tiny_en):
    """Three recordings at once, each its own connection: each client's committed text is its
    own recording's (pooled WER within 2 points of the offline transcription), status messages
    arrive every second, and ``end`` brings the last finals and a 1000 close."""
    clips = [speech_clips[c] for c in CLIPS]
    sessions = clients_at_once(served.url, clips, lambda clip: offline_tiny_en(clip).text)
    for clip in clips:
        session = sessions[clip.id]
        fields = set(session.captions[0])
        # A client that says nothing of its audio is "remote": the default --speakers auto labels it.
        assert fields == {"type", "stream", "kind", "text", "start_s", "end_s", "emitted_audio_s",
                          "emitted_wall_s", "segment", "language", "words", "speaker"}
        assert all(c["speaker"].startswith("Speaker ") for c in session.captions if c["kind"] == "final")
        last_final = max(i for i, c in enumerate(session.captions) if c["kind"] == "final")
        assert all(not c["text"] for c in session.captions[last_final + 1:]), "the end commits everything shown"
        assert len(session.statuses) >= 3, "one status a second while the recording plays"
        status = session.statuses[-1]
        assert status["model"] == "tiny.en" and status["provider"] == "CPUExecutionProvider"
        assert status["connections"] >= 1 and status["step_latency_ms"] is not None
        assert {"temperature_c", "power_w", "vram_used_bytes", "vram_total_bytes", "utilization_pct"} <= set(status["gpu"])
    # --transcripts: one file per connection, each committed line in it.
    assert len(list(served.transcripts.glob("*.txt"))) >= 3
    assert not unwritten_finals(served.transcripts, sessions)


def test_auth_missing_or_wrong_token_is_refused(served):
    from websockets.exceptions import InvalidStatus

    for token in (None, "wrong-token-0123456789abcdef", served.token[:-1]):
        with pytest.raises(InvalidStatus) as caught:
            connect(served.url, token=token)
        assert caught.value.response.status_code == 401
    with pytest.raises(InvalidStatus) as caught:
        connect(served.url, path="/other")
    assert caught.value.response.status_code == 404


def _bad(served, path=None, send=(), **params) -> Session:
    """One connection that breaks the protocol: what it was told."""
    session = Session()
    ws = connect(served.url, path=path, **params)
    try:
        for message in send:
            ws.send(message)
            time.sleep(0.001)
    except Exception:  # the server may close while we are still sending: that is the point
        pass
    receive_all(ws, session)
    return session


def test_bad_inputs_are_closed_with_their_codes_while_another_stream_captions(served, speech_clips):
    clip = speech_clips["en_ls_1089-134691-0001"]  # "for a full hour he had paced up and down ..."
    good: dict[str, Session] = {}
    streaming = threading.Thread(target=lambda: good.update(s=stream_recording(served.url, clip.wav, label="Good")))
    streaming.start()
    time.sleep(1.0)
    second = np.zeros(16000, "<i2").tobytes()  # silence: costs the engine no model step
    cases = {
        "unknown parameter": (_bad(served, path="/v1/listen?label=X&rate=16000"), protocol.CLOSE_POLICY, "unknown parameter"),
        "rate too low": (_bad(served, path="/v1/listen?sample_rate=4000"), protocol.CLOSE_POLICY, "outside 8000..48000"),
        "rate too high": (_bad(served, path="/v1/listen?sample_rate=96000"), protocol.CLOSE_POLICY, "outside"),
        "language": (_bad(served, path="/v1/listen?language=de"), protocol.CLOSE_POLICY, "English-only"),
        # No model has it: refused before the engine, whose tokenizer failed on it for everyone (issue 47).
        "unknown language": (_bad(served, path="/v1/listen?language=xx"), protocol.CLOSE_POLICY, "unknown language 'xx'"),
        "source": (_bad(served, path="/v1/listen?source=radio"), protocol.CLOSE_POLICY, "source must be one of"),
        "text": (_bad(served, send=[second, "hello"], label="T"), protocol.CLOSE_UNSUPPORTED, "text message"),
        "odd bytes": (_bad(served, send=[b"\x00\x01\x02"], label="O"), protocol.CLOSE_BAD_PAYLOAD, "even number of bytes"),
        "too big": (_bad(served, send=[b"\x00" * (protocol.MAX_MESSAGE_BYTES + 2)], label="B"), protocol.CLOSE_TOO_BIG, ""),
        "too fast": (_bad(served, send=[second] * 8, label="F"), protocol.CLOSE_POLICY, "faster than real time"),
    }
    streaming.join(300)
    for name, (session, code, words) in cases.items():
        assert session.close_code == code, (name, session.close_code, session.close_reason)
        assert words in session.close_reason, (name, session.close_reason)
        assert not session.captions, name
    session = good["s"]
    assert session.close_code == protocol.CLOSE_NORMAL, session.close_reason
    words = set(session.committed.lower().replace(",", "").replace(".", "").split())
    assert {"full", "hour", "paced", "waiting", "longer"} <= words, session.committed


def test_capacity_refusal_is_1013(served):
    """The engine holds MAX_STREAMS streams: the next connection is closed with 1013 and a
    one-line reason, the streams held go on and end normally."""
    check_capacity_refusal(served.url)
    # The slots are free again once the engine has let the streams go.
    deadline = time.monotonic() + 60
    while served.link.streams() and time.monotonic() < deadline:
        time.sleep(0.2)
    again = connect(served.url, label="Again")
    assert '"ready"' in again.recv(timeout=30)
    again.send(protocol.END_MESSAGE)
    session = Session()
    receive_all(again, session)
    assert session.close_code == protocol.CLOSE_NORMAL


def test_two_workers_least_loaded_over_tls(tls_certificate):
    """`--device all` on a machine with two devices, here two CPU workers: new connections go
    to the worker holding the fewest streams; and the server speaks TLS with --certfile/--keyfile."""
    import ssl

    from websockets.sync.client import connect as ws_connect

    from captioner.app.commands.serve import tls_context
    from captioner.engine.pipeline import Pipeline
    from captioner.serve.engine_link import EngineLink
    from captioner.serve.server import CaptionServer, ServerThread

    cert, key = tls_certificate
    link = EngineLink(["cpu", "cpu"], lambda device: Pipeline([], model="tiny.en", device=device))
    link.start()
    thread = ServerThread(CaptionServer(link, "127.0.0.1", 0, ssl_context=tls_context(cert, key)))
    thread.start()
    client_tls = ssl.create_default_context(cafile=cert)
    try:
        assert thread.url.startswith("wss://")
        opened = [ws_connect(thread.url + protocol.listen_path(f"W{i}"), ssl=client_tls, open_timeout=30).__enter__()
                  for i in range(4)]
        for ws in opened:
            assert '"ready"' in ws.recv(timeout=60)
            # No TLS 1.3 session tickets: they raced the sync client's upgrade request (serve/tls.py).
            assert not ws.socket.session.has_ticket
        assert sorted(len(worker.leases) for worker in link.workers) == [2, 2]
        for ws in opened:
            ws.send(protocol.END_MESSAGE)
        for ws in opened:
            session = Session()
            receive_all(ws, session)
            assert session.close_code == protocol.CLOSE_NORMAL
        with pytest.raises(ssl.SSLError):  # a client that does not trust the certificate gets nowhere
            ws_connect(thread.url + protocol.listen_path("X"), ssl=ssl.create_default_context(), open_timeout=10)
    finally:
        thread.stop()
        link.stop()


def test_sigterm_captions_the_audio_received_to_its_end_then_closes_1001(tmp_path, speech_clips):
    """`captioner serve` as a command, SIGTERM right after a recording's last audio message (sent
    at twice real time, no ``end``): the drain captions all the audio the server received, so the
    client gets the recording's last words as finals, then 1001, and the log says the drain
    finished, even with --quiet (issue 47: before, only the text on show was committed)."""
    command = [sys.executable, "-m", "captioner", "serve", "--port", "0", "--model", "tiny.en", "--device", "cpu",
               "--drain-s", "60", "--quiet"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        port = int(server.stdout.readline())
        # "... he had paced up and down waiting but he could wait no longer"
        session = stream_then_stop(f"ws://127.0.0.1:{port}", speech_clips["en_ls_1089-134691-0001"].wav,
                                   lambda: server.send_signal(signal.SIGTERM), token=None)
        assert server.wait(60) == 0
    finally:
        if server.poll() is None:
            server.kill()
    err = server.stderr.read()
    assert session.close_code == protocol.CLOSE_GOING_AWAY, (session.close_code, session.close_reason, err)
    assert {"paced", "waiting", "wait", "longer"} <= words_of(session.committed), (session.committed, err)
    last_final = max(i for i, c in enumerate(session.captions) if c["kind"] == "final")
    assert not [c for c in session.captions[last_final + 1:] if c["text"]], "nothing left on show"
    assert "drained: 1 stream(s) captioned to their end and closed in" in err, err


def test_two_voices_are_two_speakers_and_a_microphone_none(served, speech_clips, tmp_path):
    """Speaker labels over the protocol, for real: a LibriSpeech reader (male), a 1 s pause, then
    LJ Speech's reader (female), 11.4 s sent at real-time pace by two clients at once. Under the default
    ``--speakers auto`` a plain WebSocket client that says nothing of its audio ("remote") gets
    finals of two speakers, the first reader's and the second's; the project's own client
    (``listen --server``, the app), playing it from a source whose ``origin`` is a microphone,
    says ``source=microphone`` (one person) and gets no speaker at all."""
    import soundfile as sf

    from captioner.audio.file_source import FileSource
    from captioner.serve.client import RemotePipeline

    first, rate = sf.read(str(speech_clips["en_ls_1089-134691-0001"].wav), dtype="int16")
    second, rate_2 = sf.read(str(speech_clips["en_ljspeech_LJ001-0001"].wav), dtype="int16")
    assert rate == rate_2 == 16000
    wav = tmp_path / "two_voices.wav"
    # LJ Speech's first 5 s ("Printing, in the only sense with which we are at present concerned"):
    # 11.4 s in all, plenty for two voices (a new speaker needs 0.8 s of speech).
    sf.write(str(wav), np.concatenate([first, np.zeros(rate, np.int16), second[:5 * rate]]), rate, subtype="PCM_16")

    class Microphone(FileSource):  # what a MicrophoneSource on a microphone says it is
        origin = "microphone"

    sessions: dict[str, Session] = {}
    client = threading.Thread(target=lambda: sessions.update(s=stream_recording(served.url, wav, label="Remote",
                                                                                  timeout_s=120)))
    remote = RemotePipeline([Microphone(wav, stream="Me", realtime=True)], server=served.url, token=served.token)
    assert remote._links["Me"].source == "microphone"
    client.start()
    remote.start(timeout_s=60)
    try:
        assert remote.wait_exhausted(120)
    finally:
        remote.stop(30)
    client.join(120)

    session = sessions["s"]
    assert session.close_code == protocol.CLOSE_NORMAL, (session.close_code, session.close_reason)
    assert {"hour", "printing"} <= words_of(session.committed), session.committed
    finals = [c for c in session.captions if c["kind"] == "final" and c["text"].strip()]
    speakers = [c["speaker"] for c in finals]
    assert len(set(speakers)) >= 2 and all(s.startswith("Speaker ") for s in speakers), finals
    assert speakers[0] != speakers[-1], finals  # the first reader's line, the second reader's
    mic = remote.drain_captions()
    assert {"hour", "printing"} <= words_of(" ".join(u.text for u in mic if u.kind == "final")), mic
    assert not [u for u in mic if u.speaker], "a microphone is one person: no labels"
