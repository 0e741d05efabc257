"""`captioner serve --frontends 2` for real: tiny.en on the CPU in the hub, two front-end
processes on one loopback port (SO_REUSEPORT), clients streaming real recordings at real-time
pace. What a client sees must be what the single-process server gives it (docs/protocol.md)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import (
    MAX_STREAMS,
    TOKEN,
    Session,
    check_capacity_refusal,
    clients_at_once,
    connect,
    pcm_of,
    receive_all,
    stream_then_stop,
    unwritten_finals,
    words_of,
)

from captioner.serve import protocol

pytestmark = pytest.mark.slow

CLIPS = ("en_ls_1089-134691-0001", "en_ami_ES2011a_hs0_40-46s", "en_ls_1089-134686-0001")


class HubServed:
    def __init__(self, url, hub, link, transcripts, lines):
        self.url, self.hub, self.link, self.transcripts, self.lines = url, hub, link, transcripts, lines


@pytest.fixture(scope="module")
def hub_served(tmp_path_factory):
    """The served engine of conftest's ``served`` (admission holds MAX_STREAMS streams), behind
    a hub with two front-ends."""
    from captioner.app.transcript import TranscriptWriter
    from captioner.engine.admission import AdmissionConfig
    from captioner.engine.core import EngineConfig
    from captioner.engine.pipeline import Pipeline
    from captioner.gpu.backend import cpu_backend
    from captioner.gpu.features import FeaturePool
    from captioner.gpu.telemetry import TelemetrySampler
    from captioner.serve.engine_link import EngineLink
    from captioner.serve.hub import FrontendHub
    from captioner.serve.server import ServerThread

    base = EngineConfig()
    bank_bytes = FeaturePool(cpu_backend(), n_mels=80, ring_frames=base.ring_frames, block_streams=1).block_bytes
    admission = AdmissionConfig(vram_budget_bytes=int((MAX_STREAMS + 0.6) / 0.85 * bank_bytes), max_interval_s=600.0)

    def make_pipeline(device):
        return Pipeline([], model="tiny.en", device=device, config=EngineConfig(block_streams=1, admission=admission))

    link = EngineLink(["cpu"], make_pipeline, lambda device: TelemetrySampler(gpu_index=0))
    link.start()
    folder = tmp_path_factory.mktemp("transcripts")
    lines: list[str] = []
    # The protocol's own 10 s ahead of the clock (not serve_helpers' 3 s): the app's client sends
    # up to 5 s of backlog at once when it connects again.
    hub = FrontendHub(link, "127.0.0.1", 0, frontends=2, token=TOKEN,
                      transcripts=lambda title: TranscriptWriter(directory=folder, title=title), log=lines.append)
    thread = ServerThread(hub)
    thread.start()
    try:
        yield HubServed(thread.url, hub, link, folder, lines)
    finally:
        thread.stop()
        link.stop()
    assert all(fe.process.poll() is not None for fe in hub.frontends), "every front-end process ended"


def test_three_clients_get_their_own_captions(hub_served, speech_clips, offline_tiny_en):
    """As tests/serve/test_server.py's, through the front-ends: each client's committed text is
    its own recording's (pooled WER within 2 points of offline), a status every second, ``end``
    brings the last finals and 1000, and --transcripts (written by the hub) holds every final."""
    clips = [speech_clips[c] for c in CLIPS]
    sessions = clients_at_once(hub_served.url, clips, lambda clip: offline_tiny_en(clip).text)
    for clip in clips:
        session = sessions[clip.id]
        last_final = max(i for i, c in enumerate(session.captions) if c["kind"] == "final")
        assert all(not c["text"] for c in session.captions[last_final + 1:]), "the end commits everything shown"
        # The speaker crosses the hub and the front-end like every field ("remote": labelled under auto).
        assert all(c.get("speaker", "").startswith("Speaker ") for c in session.captions if c["kind"] == "final")
        assert len(session.statuses) >= 3, "one status a second while the recording plays"
        status = session.statuses[-1]
        assert status["model"] == "tiny.en" and status["provider"] == "CPUExecutionProvider"
        assert 1 <= status["connections"] <= 3 and status["step_latency_ms"] is not None
    assert not unwritten_finals(hub_served.transcripts, sessions)


def _short_stream(url: str, label: str) -> Session:
    """A connection that is admitted, sends 0.1 s of silence and ends."""
    ws = connect(url, label=label)
    assert '"ready"' in ws.recv(timeout=30)
    ws.send(np.zeros(1600, "<i2").tobytes())
    ws.send(protocol.END_MESSAGE)
    session = Session()
    receive_all(ws, session)
    return session


def test_connections_land_on_both_frontends(hub_served):
    """The kernel spreads connections over the front-ends (by a hash of the client's address and
    port): within 24 connections both have taken some (all on one: a chance of 2^-23)."""
    before = [fe.accepted for fe in hub_served.hub.frontends]
    for i in range(24):
        session = _short_stream(hub_served.url, f"L{i}")
        assert session.close_code == protocol.CLOSE_NORMAL, session.close_reason
        if all(fe.accepted > b for fe, b in zip(hub_served.hub.frontends, before)):
            break
    assert all(fe.accepted > b for fe, b in zip(hub_served.hub.frontends, before)), before
    assert any("front-end 0)" in line for line in hub_served.lines)
    assert any("front-end 1)" in line for line in hub_served.lines)


def _bad(url, path=None, send=(), **params) -> Session:
    session = Session()
    ws = connect(url, path=path, **params)
    try:
        for message in send:
            ws.send(message)
            time.sleep(0.001)
    except Exception:  # the server may close while we are still sending: that is the point
        pass
    receive_all(ws, session)
    return session


def test_auth_and_bad_inputs_are_refused_by_the_frontends(hub_served):
    """401/404 before any WebSocket, and each protocol breach closed with its code and reason;
    the language check (the model's) is the hub's, relayed."""
    from websockets.exceptions import InvalidStatus

    url = hub_served.url
    for token in (None, "wrong-token-0123456789abcdef", TOKEN[:-1]):
        with pytest.raises(InvalidStatus) as caught:
            connect(url, token=token)
        assert caught.value.response.status_code == 401
    with pytest.raises(InvalidStatus) as caught:
        connect(url, path="/other")
    assert caught.value.response.status_code == 404
    second = np.zeros(16000, "<i2").tobytes()
    cases = {
        "unknown parameter": (_bad(url, path="/v1/listen?label=X&rate=16000"), protocol.CLOSE_POLICY, "unknown parameter"),
        "rate too low": (_bad(url, path="/v1/listen?sample_rate=4000"), protocol.CLOSE_POLICY, "outside 8000..48000"),
        "language": (_bad(url, path="/v1/listen?language=de"), protocol.CLOSE_POLICY, "English-only"),
        # No model has it: refused before the engine, whose tokenizer failed on it for everyone (issue 47).
        "unknown language": (_bad(url, path="/v1/listen?language=xx"), protocol.CLOSE_POLICY, "unknown language 'xx'"),
        "source": (_bad(url, path="/v1/listen?source=radio"), protocol.CLOSE_POLICY, "source must be one of"),
        "text": (_bad(url, send=[second, "hello"], label="T"), protocol.CLOSE_UNSUPPORTED, "text message"),
        "odd bytes": (_bad(url, send=[b"\x00\x01\x02"], label="O"), protocol.CLOSE_BAD_PAYLOAD, "even number of bytes"),
        "too big": (_bad(url, send=[b"\x00" * (protocol.MAX_MESSAGE_BYTES + 2)], label="B"), protocol.CLOSE_TOO_BIG, ""),
        "too fast": (_bad(url, send=[second] * 14, label="F"), protocol.CLOSE_POLICY, "faster than real time"),
    }
    for name, (session, code, words) in cases.items():
        assert session.close_code == code, (name, session.close_code, session.close_reason)
        assert words in session.close_reason, (name, session.close_reason)
        assert not session.captions, name
    assert any("missing or wrong token" in line for line in hub_served.lines)
    after = _short_stream(url, "AfterBad")  # none of them touched the engine
    assert after.close_code == protocol.CLOSE_NORMAL, (after.close_code, after.close_reason)


def test_capacity_refusal_reaches_the_client_as_1013(hub_served):
    """The hub's engine holds MAX_STREAMS streams: the next connection, whichever front-end took
    it, is closed with 1013 and the engine's reason; the streams held end normally."""
    deadline = time.monotonic() + 60
    while hub_served.link.streams() and time.monotonic() < deadline:
        time.sleep(0.2)
    check_capacity_refusal(hub_served.url)


def test_the_app_client_reconnects_when_its_frontend_dies(hub_served, speech_clips):
    """The project's own client (`RemotePipeline`, what `listen --server` and the app use) on a
    front-end that is killed mid-sentence: it loses the link once, connects again (to the
    front-end left, or to the one started in the dead one's place), sends what it captured
    meanwhile, and the recording is captioned from the break to its end."""
    from captioner.audio.file_source import FileSource
    from captioner.serve.client import RemotePipeline

    hub = hub_served.hub
    clip = speech_clips["en_jfk_inaugural_excerpt"]
    remote = RemotePipeline([FileSource(clip.wav, stream="Remote", realtime=True)], server=hub_served.url, token=TOKEN)
    remote.start()
    try:
        deadline = time.monotonic() + 30
        where = None
        while where is None and time.monotonic() < deadline:
            where = next((fe.index for fe in hub.frontends if "Remote" in hub.streams_on(fe.index)), None)
            time.sleep(0.05)
        assert where is not None
        time.sleep(2.5)  # "And so my fellow Americans, ask ..."
        killed_pid = hub.frontends[where].pid
        os.kill(killed_pid, signal.SIGKILL)
        assert remote.wait_exhausted(240)
    finally:
        remote.stop(60)
    updates = remote.drain_captions()
    committed = " ".join(u.text for u in updates if u.kind == "final").lower()
    # What the engine had of the stream but had not committed when the link broke went with the
    # connection (as when a whole server dies); from the break on, nothing is lost.
    assert {"ask", "what", "you", "do", "country"} <= set(committed.replace(",", " ").replace(".", " ").split()), committed
    assert remote.input_losses["Remote"].count == 1, remote.input_losses
    deadline = time.monotonic() + 30  # the next test wants two front-ends again
    while hub.frontends[where].pid == killed_pid and time.monotonic() < deadline:
        time.sleep(0.2)
    assert hub.frontends[where].pid != killed_pid, "a new front-end took the dead one's place"


def test_a_killed_frontend_drops_only_its_connections(hub_served, speech_clips):
    """Last in the module: it kills a front-end. Its client's connection breaks (1006); the
    client on the other front-end streams on and gets its captions and 1000; the hub lets the
    dead front-end's stream go; a client connecting again is served; a new front-end takes the
    dead one's place."""
    import psutil

    hub = hub_served.hub
    deadline = time.monotonic() + 60
    while hub_served.link.streams() and time.monotonic() < deadline:
        time.sleep(0.2)
    # One connection held on each front-end: a connection that lands where one is held already ends.
    placed: dict[int, object] = {}
    for i in range(24):
        ws = connect(hub_served.url, label=f"K{i}")
        assert '"ready"' in ws.recv(timeout=30)
        where = next(fe.index for fe in hub.frontends if f"K{i}" in hub.streams_on(fe.index))
        if where in placed:
            ws.send(protocol.END_MESSAGE)
            receive_all(ws, Session())
            continue
        placed[where] = ws
        if len(placed) == 2:
            break
    assert len(placed) == 2
    victim_ws, survivor_ws = placed[0], placed[1]
    victim = Session()
    victim_thread = threading.Thread(target=receive_all, args=(victim_ws, victim), daemon=True)
    victim_thread.start()
    survivor = Session()
    survivor_thread = threading.Thread(target=receive_all, args=(survivor_ws, survivor), daemon=True)
    survivor_thread.start()
    pcm, rate = pcm_of(speech_clips["en_ls_1089-134691-0001"].wav)
    assert rate == 16000
    hub.restart_delay_s = 10.0  # long enough for a client to connect while one front-end is left
    accepted_left = hub.frontends[1].accepted
    again: dict[str, Session] = {}
    step = rate // 10
    started = time.monotonic()
    killed_pid = hub.frontends[0].pid
    lines_before = len(hub_served.lines)  # the hub is shared: an earlier test may have restarted front-end 0 too
    for first in range(0, len(pcm), step):
        survivor_ws.send(pcm[first:first + step].tobytes())
        if first == 2 * rate:
            os.kill(killed_pid, signal.SIGKILL)
        if first == 3 * rate:  # the victim's client connecting again
            reconnect = threading.Thread(target=lambda: again.update(s=_short_stream(hub_served.url, "Again")))
            reconnect.start()
        time.sleep(max(0.0, started + (first + step) / rate - time.monotonic()))
    survivor_ws.send(protocol.END_MESSAGE)
    victim_thread.join(30)
    survivor_thread.join(240)
    reconnect.join(60)
    assert victim.close_code == 1006, (victim.close_code, victim.close_reason)
    assert survivor.close_code == protocol.CLOSE_NORMAL, (survivor.close_code, survivor.close_reason)
    words = set(survivor.committed.lower().replace(",", "").replace(".", "").split())
    assert {"full", "hour", "paced", "waiting", "longer"} <= words, survivor.committed
    assert any(f"front-end 0 (pid {killed_pid})" in line and "ended" in line for line in hub_served.lines)
    assert killed_pid not in psutil.pids() or psutil.Process(killed_pid).status() == psutil.STATUS_ZOMBIE
    deadline = time.monotonic() + 30
    while hub_served.link.streams() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not hub_served.link.streams(), "the dead front-end's stream left the engine"
    assert again["s"].close_code == protocol.CLOSE_NORMAL, again["s"].close_reason
    assert hub.frontends[1].accepted == accepted_left + 1, "the front-end left served the reconnection"
    # Then a new front-end takes the dead one's place, and connections land on it too.
    deadline = time.monotonic() + 30
    def restarted() -> bool:
        return any("front-end 0 started again (pid" in line for line in hub_served.lines[lines_before:])

    while not restarted() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert restarted(), hub_served.lines[-5:]
    assert hub.frontends[0].pid != killed_pid and hub.frontends[0].process.poll() is None
    for i in range(24):
        if hub.frontends[0].accepted:
            break
        assert _short_stream(hub_served.url, f"N{i}").close_code == protocol.CLOSE_NORMAL
    assert hub.frontends[0].accepted, "the new front-end takes connections"


def test_cli_sigterm_captions_the_audio_received_to_its_end_then_closes_1001(tmp_path, speech_clips):
    """`captioner serve --frontends 2` as a command, SIGTERM right after a recording's last audio
    message (sent at twice real time, no ``end``): the drain captions all the audio the server
    received (issue 47: before, only the text on show was committed), the client gets the last
    words as finals, then 1001, the front-ends end, and the hub wrote the transcript."""
    import psutil

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    command = [sys.executable, "-m", "captioner", "serve", "--port", "0", "--model", "tiny.en", "--device", "cpu",
               "--frontends", "2", "--frontend-flush-ms", "5", "--gil-switch-ms", "2", "--token-file", str(token_file),
               "--transcripts", str(tmp_path / "t"), "--drain-s", "60"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        port = int(server.stdout.readline())
        children = psutil.Process(server.pid).children(recursive=True)
        assert len(children) >= 2
        # "... he had paced up and down waiting but he could wait no longer"
        session = stream_then_stop(f"ws://127.0.0.1:{port}", speech_clips["en_ls_1089-134691-0001"].wav,
                                   lambda: server.send_signal(signal.SIGTERM))
        assert server.wait(60) == 0
    finally:
        if server.poll() is None:
            server.kill()
    err = server.stderr.read()
    assert session.close_code == protocol.CLOSE_GOING_AWAY, (session.close_code, session.close_reason, err)
    assert {"paced", "waiting", "wait", "longer"} <= words_of(session.committed), (session.committed, err)
    assert "drained: 1 stream(s) captioned to their end and closed in" in err, err
    assert "2 front-end processes (audio to the engines every 5 ms)" in err and "served 1 connection(s)" in err, err
    assert "interpreter lock switched every 2 ms" in err, err  # read back from sys.getswitchinterval()
    assert re.search(r"the serving loop ran late p50 [\d.]+ / p99 [\d.]+ / max [\d.]+ ms; "
                     r"the front-ends' loops p50 [\d.]+ / p99 [\d.]+ / max [\d.]+ ms", err), err
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE], "front-ends ended"
    written = " ".join(f.read_text(encoding="utf-8") for f in Path(tmp_path / "t").glob("*.txt"))
    assert "longer" in written.lower(), written


def test_cli_refuses_a_bad_flush_period_in_one_line():
    for value in ("0", "101", "soon"):
        done = subprocess.run([sys.executable, "-m", "captioner", "serve", "--frontends", "2", "--port", "0",
                               "--frontend-flush-ms", value], capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
        assert done.returncode == 2, done.stderr
        assert "--frontend-flush-ms must be a number of milliseconds from 1 to 100" in done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_cli_refuses_a_bad_switch_interval_in_one_line():
    for value in ("0", "51", "often"):
        done = subprocess.run([sys.executable, "-m", "captioner", "serve", "--port", "0", "--gil-switch-ms", value],
                              capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
        assert done.returncode == 2, done.stderr
        assert "--gil-switch-ms must be a number of milliseconds from 0.1 to 50" in done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_cli_refuses_a_bad_frontends_count(tmp_path):
    for value in ("0", "many", "65"):
        done = subprocess.run([sys.executable, "-m", "captioner", "serve", "--frontends", value, "--port", "0"],
                              capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
        assert done.returncode == 2, done.stderr
        assert "--frontends must be auto or a whole number 1..64" in done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_dead_hub_ends_the_frontends(tmp_path):
    """The serve process killed (SIGKILL: no drain): its front-ends see their channel close, close
    their connections with 1011 (a client connects again) and exit."""
    import psutil

    command = [sys.executable, "-m", "captioner", "serve", "--port", "0", "--model", "tiny.en", "--device", "cpu",
               "--frontends", "2", "--quiet"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        port = int(server.stdout.readline())
        frontends = [c for c in psutil.Process(server.pid).children(recursive=True)
                     if "captioner.serve.frontend" in " ".join(c.cmdline())]
        assert len(frontends) == 2
        ws = connect(f"ws://127.0.0.1:{port}", token=None, label="Orphan")
        assert '"ready"' in ws.recv(timeout=30)
        ws.send(np.zeros(1600, "<i2").tobytes())
        server.kill()
        session = Session()
        receive_all(ws, session)
        assert session.close_code == protocol.CLOSE_INTERNAL, (session.close_code, session.close_reason)
        assert "engine process ended" in session.close_reason
        gone, alive = psutil.wait_procs(frontends, timeout=30)
        assert not alive, "the front-ends exit once the hub is gone"
    finally:
        if server.poll() is None:
            server.kill()
        server.wait(30)


def test_tls_through_the_frontends(tls_certificate):
    """--certfile/--keyfile: each front-end loads the certificate and serves wss://."""
    import ssl

    from websockets.sync.client import connect as ws_connect

    from captioner.engine.pipeline import Pipeline
    from captioner.serve.engine_link import EngineLink
    from captioner.serve.hub import FrontendHub
    from captioner.serve.server import ServerThread

    cert, key = tls_certificate
    link = EngineLink(["cpu"], lambda device: Pipeline([], model="tiny.en", device=device))
    link.start()
    thread = ServerThread(FrontendHub(link, "127.0.0.1", 0, frontends=2, tls_files=(cert, key)))
    thread.start()
    try:
        assert thread.url.startswith("wss://")
        ws = ws_connect(thread.url + protocol.listen_path("S"), ssl=ssl.create_default_context(cafile=cert),
                        open_timeout=30).__enter__()
        assert '"ready"' in ws.recv(timeout=60)
        assert not ws.socket.session.has_ticket  # no TLS 1.3 session tickets (serve/tls.py)
        ws.send(protocol.END_MESSAGE)
        session = Session()
        receive_all(ws, session)
        assert session.close_code == protocol.CLOSE_NORMAL, session.close_reason
        with pytest.raises(ssl.SSLError):  # a client that does not trust the certificate gets nowhere
            ws_connect(thread.url + protocol.listen_path("X"), ssl=ssl.create_default_context(), open_timeout=10)
    finally:
        thread.stop()
        link.stop()


def test_a_switch_interval_with_ray_is_refused_not_ignored():
    import argparse

    from captioner.app.commands.serve import add_arguments, check_arguments
    from captioner.errors import UserError

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(UserError, match="--gil-switch-ms is for the plain server"):
        check_arguments(parser.parse_args(["--ray", "--gil-switch-ms", "1"]))
    check_arguments(parser.parse_args(["--ray"]))  # the default is no choice: nothing to refuse
