"""Issue 47: a shared server that one client cannot break. Both server modes (one process, and
the hub with two front-end processes) with a scripted model on the CPU (no model to load, so
each server starts in about a second): the health endpoints, an engine that fails (said so on
one line, refused as "the engine failed", restarted), idle connections, the connections one
client may hold, no transcript file for a connection that committed nothing, and a drain that
runs out of time. The drain that captions everything with a real model is tests/serve/test_drain.py."""

from __future__ import annotations

import http.client
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import TOKEN, Session, connect, receive_all

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from scripted import ScriptedRecognizer, phrase, render_speech  # noqa: E402

from captioner.serve import protocol  # noqa: E402

IDLE_S = 2.0
DRAIN_S = IDLE_S + 1.5
PER_CLIENT = 3
SILENCE = np.zeros(1600, "<i2").tobytes()  # 0.1 s


class Engines:
    """``make_pipeline`` of the link: a real pipeline around a scripted model. Once ``hold`` is
    cleared, the next one made (a restart) waits until it is set again."""

    def __init__(self, recognizer_type=ScriptedRecognizer) -> None:
        self.recognizer_type = recognizer_type
        self.made: list = []
        self.recognizers: list = []
        self.hold = threading.Event()
        self.hold.set()

    def __call__(self, device):
        from captioner.engine.core import EngineConfig
        from captioner.engine.pipeline import Pipeline
        from captioner.gpu.backend import cpu_backend

        if self.made:
            self.hold.wait(60)
        recognizer = self.recognizer_type({})
        self.recognizers.append(recognizer)
        pipeline = Pipeline([], config=EngineConfig(), recognizer_factory=lambda: (cpu_backend(), recognizer))
        self.made.append(pipeline)
        return pipeline


class Metrics:
    """What the server hands a Prometheus exporter, kept."""

    def __init__(self) -> None:
        self.engines: list[tuple[bool, int, str]] = []

    def update_engine(self, up: bool, restarts: int, engine: str = "") -> None:
        self.engines.append((up, restarts, engine))

    def update_status(self, status, engine: str = "") -> None:
        pass

    def update_telemetry(self, sample) -> None:
        pass

    def observe_caption(self, update) -> None:
        pass


class LineFile:
    """A transcript writer that makes its file when it is made, as the app's does."""

    made = 0

    def __init__(self, folder: Path, title: str) -> None:
        LineFile.made += 1
        self.path = folder / f"t{LineFile.made}.txt"
        self.path.write_text(f"# {title}\n", encoding="utf-8")

    def write(self, update) -> None:
        with self.path.open("a", encoding="utf-8") as out:
            out.write(update.text + "\n")

    def close(self) -> None:
        pass


@dataclass
class Shared:
    url: str
    port: int
    server: object
    link: object
    engines: Engines
    metrics: Metrics
    lines: list[str]
    transcripts: Path


def _start(mode: str, engines: Engines, folder: Path, lines: list[str], metrics=None, drain_s: float = 10.0):
    from captioner.serve.engine_link import EngineLink
    from captioner.serve.hub import FrontendHub
    from captioner.serve.server import CaptionServer, ServerThread

    link = EngineLink(["cpu"], engines)
    link.start()
    common = dict(token=TOKEN, transcripts=lambda title: LineFile(folder, title), metrics=metrics,
                  status_period_s=0.2, drain_s=drain_s, idle_timeout_s=IDLE_S, max_connections_per_client=PER_CLIENT,
                  log=lines.append)
    server = (CaptionServer(link, "127.0.0.1", 0, **common) if mode == "server"
              else FrontendHub(link, "127.0.0.1", 0, frontends=2, **common))
    thread = ServerThread(server)
    thread.start()
    return thread, link


@pytest.fixture(scope="module", params=["server", "hub"])
def shared(request, tmp_path_factory):
    engines, metrics, lines = Engines(), Metrics(), []
    folder = tmp_path_factory.mktemp("transcripts")
    thread, link = _start(request.param, engines, folder, lines, metrics)
    try:
        yield Shared(thread.url, thread.server.port, thread.server, link, engines, metrics, lines, folder)
    finally:
        engines.hold.set()
        thread.stop()
        link.stop()


def _get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def _wait_for(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s:g} s: {what}")


def _admitted(url: str, label: str):
    ws = connect(url, label=label)
    assert '"ready"' in ws.recv(timeout=30)
    return ws


def _closed(ws, timeout_s: float = 30.0) -> Session:
    session = Session()
    done = threading.Thread(target=receive_all, args=(ws, session), daemon=True)
    done.start()
    done.join(timeout_s)
    assert not done.is_alive(), "the server did not close the connection"
    return session


def _end(ws) -> Session:
    ws.send(SILENCE)
    ws.send(protocol.END_MESSAGE)
    return _closed(ws)


class KeepAlive:
    """Sends 0.1 s of silence on each held connection every 0.3 s: they are not idle."""

    def __init__(self, connections) -> None:
        self.connections = list(connections)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            for ws in list(self.connections):
                try:
                    ws.send(SILENCE)
                except Exception:  # closed meanwhile
                    self.connections.remove(ws)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def test_health_endpoints_answer_without_a_token(shared):
    assert _get(shared.port, "/healthz") == (200, "ok\n")
    assert _get(shared.port, "/readyz") == (200, "ready\n")
    assert _get(shared.port, "/metrics")[0] == 404


def test_a_failed_engine_is_said_so_refused_as_such_and_restarted(shared):
    """The engine's worker ends (here a message it does not know, as an error outside a model
    step would): its stream is closed with 1011, ``/readyz`` says 503 and why, a new connection
    is refused with 1013 saying the engine failed (not the failure's own text, which may be a
    client's), the log says it once on one line, the metrics say the engine is down; then a
    fresh engine takes its place and new connections are served again."""
    held = _admitted(shared.url, "Held")
    shared.engines.hold.clear()  # the fresh engine waits for the test
    lines_before = len(shared.lines)
    shared.link.workers[0].pipeline._send(object())  # the worker thread raises and ends
    cut = _closed(held)
    assert cut.close_code == protocol.CLOSE_INTERNAL, (cut.close_code, cut.close_reason)
    assert "engine failed" in cut.close_reason
    status, text = _wait_for(lambda: (lambda r: r if r[0] == 503 else None)(_get(shared.port, "/readyz")), 10,
                             "/readyz says 503")
    assert text.startswith("not ready: the engine failed") and text.count("\n") == 1, text
    refused = _closed(connect(shared.url, label="During"))
    assert refused.close_code == protocol.CLOSE_TRY_LATER, (refused.close_code, refused.close_reason)
    assert "engine failed and is being restarted" in refused.close_reason
    assert "unknown worker message" not in refused.close_reason
    failed = [line for line in shared.lines[lines_before:] if "engine 0 (cpu) failed" in line]
    assert len(failed) == 1 and "unknown worker message" in failed[0] and "\n" not in failed[0], shared.lines
    assert not any("at capacity" in line for line in shared.lines[lines_before:])
    _wait_for(lambda: any(not up for up, _, _ in shared.metrics.engines), 10, "captioner_engine_up 0")
    shared.engines.hold.set()
    _wait_for(lambda: _get(shared.port, "/readyz")[0] == 200, 30, "/readyz says 200 again")
    assert any("engine 0 (cpu) restarted in" in line for line in shared.lines[lines_before:]), shared.lines
    again = _admitted(shared.url, "Again")
    assert _end(again).close_code == protocol.CLOSE_NORMAL
    shared.metrics.engines.clear()
    _wait_for(lambda: shared.metrics.engines, 10, "the metrics are updated")
    assert shared.metrics.engines[-1][:2] == (True, 1)


def test_a_connection_without_audio_is_closed_and_one_with_audio_is_not(shared):
    opened_s = time.monotonic()  # before its admission, from which its idle time counts
    idle = _admitted(shared.url, "Idle")
    talking = _admitted(shared.url, "Talking")
    keep = KeepAlive([talking])
    try:
        session = _closed(idle, IDLE_S + 10)
        waited_s = time.monotonic() - opened_s
    finally:
        keep.stop()
    assert session.close_code == protocol.CLOSE_GOING_AWAY, (session.close_code, session.close_reason)
    assert f"no audio for {IDLE_S:g} s" in session.close_reason
    assert IDLE_S - 0.05 <= waited_s <= IDLE_S + 5, waited_s
    assert _end(talking).close_code == protocol.CLOSE_NORMAL, "audio kept it open"
    _wait_for(lambda: any(f"closed 1001 (no audio for {IDLE_S:g} s" in line for line in shared.lines), 10,
              "the log says why")


def test_a_client_holds_at_most_its_share_of_connections(shared):
    held = [connect(shared.url, label=f"C{i}") for i in range(PER_CLIENT)]
    keep = KeepAlive(held)
    try:
        for ws in held:
            assert '"ready"' in ws.recv(timeout=30)
        over = _closed(connect(shared.url, label="Over"))
        assert over.close_code == protocol.CLOSE_TRY_LATER, (over.close_code, over.close_reason)
        assert f"too many connections from 127.0.0.1: {PER_CLIENT} open, {PER_CLIENT} allowed" in over.close_reason
        keep.connections.remove(held[0])
        assert _end(held.pop(0)).close_code == protocol.CLOSE_NORMAL
        # Its place is free once its stream has left: the next one is admitted.
        room = _wait_for(lambda: _try_admit(shared.url), 20, "a connection admitted after one ended")
        held.append(room)
        keep.connections.append(room)
    finally:
        keep.stop()
        for ws in held:
            _end(ws)


def _try_admit(url: str):
    ws = connect(url, label="Room")
    text = None
    try:
        text = ws.recv(timeout=30)
    except Exception:  # closed: not yet
        pass
    return ws if text and '"ready"' in text else None


def test_no_transcript_file_for_a_connection_that_committed_nothing(shared):
    """With --transcripts, a connection refused, closed for bad input or ending with nothing
    said leaves no file (before: every connection left one, most of them a header alone)."""
    before = sorted(shared.transcripts.iterdir())
    sessions = [_closed(connect(shared.url, label="BadLanguage", language="xx"))]
    text = _admitted(shared.url, "Text")
    text.send("hello")
    sessions.append(_closed(text))
    odd = _admitted(shared.url, "Odd")
    odd.send(b"\x00\x01\x02")
    sessions.append(_closed(odd))
    sessions.append(_end(_admitted(shared.url, "Silent")))
    assert [s.close_code for s in sessions] == [protocol.CLOSE_POLICY, protocol.CLOSE_UNSUPPORTED,
                                                protocol.CLOSE_BAD_PAYLOAD, protocol.CLOSE_NORMAL], sessions
    time.sleep(0.5)  # the transcript thread's queue
    assert sorted(shared.transcripts.iterdir()) == before


class HeldRecognizer(ScriptedRecognizer):
    """Each model step waits for the test: a stream's end is never captioned until then."""

    release = threading.Event()

    def decode(self, requests):
        self.release.wait(60)
        return super().decode(requests)


@pytest.mark.parametrize("mode", ["server", "hub"])
def test_the_drain_stops_listening_and_cuts_what_it_cannot_finish_in_time(mode, tmp_path):
    """A stop whose engine cannot finish a stream within ``drain_s`` (its model step is held):
    no new connection is taken meanwhile, the stream is closed with 1001 saying the drain ran
    out (not before: the drain is longer than the idle timeout, and a stream waiting for its
    finals is not idle), and one line says how many streams were cut."""
    from websockets.exceptions import InvalidHandshake

    HeldRecognizer.release.clear()
    engines, lines = Engines(HeldRecognizer), []
    thread, link = _start(mode, engines, tmp_path, lines, drain_s=DRAIN_S)
    stopper = threading.Thread(target=thread.stop, daemon=True)
    try:
        ws = _admitted(thread.url, "Long")
        words = phrase("a stream whose end the engine cannot reach in time", 0.2)
        speech = np.clip(np.rint(render_speech(words, 3.0) * 32767), -32768, 32767).astype("<i2")
        for first in range(0, speech.shape[0], 1600):
            ws.send(speech[first:first + 1600].tobytes())
            time.sleep(0.05)
        session = Session()
        receiver = threading.Thread(target=receive_all, args=(ws, session), daemon=True)
        receiver.start()
        stopped_s = time.monotonic()
        stopper.start()
        time.sleep(0.3)
        with pytest.raises((OSError, InvalidHandshake)):  # the listening socket is closed
            connect(thread.url, label="Late")
        receiver.join(DRAIN_S + 15)
        assert session.close_code == protocol.CLOSE_GOING_AWAY, (session.close_code, session.close_reason)
        assert "drain time ran out" in session.close_reason
        stopper.join(10)
        assert not stopper.is_alive(), "the stop waits for nothing past the drain"
        assert DRAIN_S <= time.monotonic() - stopped_s < DRAIN_S + 10
        cut = [line for line in lines if line.startswith("drain: ")]
        assert cut == [f"drain: 1 of 1 stream(s) cut after {DRAIN_S:g} s (--drain-s), the end of their audio not "
                       "captioned"], lines
    finally:
        HeldRecognizer.release.set()
        if stopper.is_alive():
            stopper.join(30)
        thread.stop()
        link.stop()


def test_the_engines_state_in_the_prometheus_text():
    """``--metrics-port``: ``captioner_engine_up`` and ``captioner_engine_restarts_total``,
    labelled by engine where there are several."""
    from prometheus_client import generate_latest

    from captioner.app.metrics import MetricsExporter

    one = MetricsExporter(0)
    one.update_engine(False, 2)
    text = generate_latest(one.registry).decode()
    assert "captioner_engine_up 0.0" in text and "captioner_engine_restarts_total 2.0" in text, text
    several = MetricsExporter(0)
    several.update_engine(True, 0, engine="0")
    several.update_engine(False, 1, engine="1")
    text = generate_latest(several.registry).decode()
    assert 'captioner_engine_up{engine="0"} 1.0' in text and 'captioner_engine_up{engine="1"} 0.0' in text, text
