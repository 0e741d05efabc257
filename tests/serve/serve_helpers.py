"""Helpers of the serve tests: a plain WebSocket client that streams a recording the way the
protocol says (int16 PCM at real-time pace, then ``{"type": "end"}``) and keeps what came back."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import numpy as np

TOKEN = "test-token-0123456789abcdef"
MAX_STREAMS = 6
MAX_AHEAD_S = 3.0


@dataclass
class Session:
    """What one client saw."""

    ready: dict | None = None
    captions: list[dict] = field(default_factory=list)
    statuses: list[dict] = field(default_factory=list)
    close_code: int | None = None
    close_reason: str = ""

    @property
    def committed(self) -> str:
        return " ".join(c["text"] for c in self.captions if c["kind"] == "final").strip()


def connect(url: str, token: str | None = TOKEN, path: str | None = None, **params):
    """An open connection, entered as its context (the caller closes it, or leaves the ``with``)."""
    from websockets.sync.client import connect as ws_connect

    from captioner.serve import protocol

    target = url + (path if path is not None else protocol.listen_path(**params))
    headers = {"Authorization": f"Bearer {token}"} if token else None
    ws = ws_connect(target, additional_headers=headers, open_timeout=30, max_size=None, compression=None)
    return ws.__enter__()  # what ``with`` does: the connection as a context, no legacy warning


def receive_all(ws, session: Session) -> None:
    """Every server message until the close (the caller's thread or a helper thread)."""
    from websockets.exceptions import ConnectionClosed

    try:
        for text in ws:
            message = json.loads(text)
            kind = message["type"]
            if kind == "ready":
                session.ready = message
            elif kind == "caption":
                session.captions.append(message)
            elif kind == "status":
                session.statuses.append(message)
    except ConnectionClosed:
        pass
    session.close_code, session.close_reason = ws.close_code, ws.close_reason or ""


def pcm_of(path) -> tuple[np.ndarray, int]:
    import soundfile as sf

    audio, rate = sf.read(str(path), dtype="float32", always_2d=True)
    mono = audio.mean(axis=1)
    return np.clip(np.rint(mono * 32767), -32768, 32767).astype("<i2"), int(rate)


def stream_recording(url: str, path, label: str, chunk_s: float = 0.1, token: str = TOKEN,
                     timeout_s: float = 240.0, source: str | None = None) -> Session:
    """Streams ``path`` at real-time pace as one connection (``source``: the ``source=`` it
    sends, none by default); returns what came back."""
    from captioner.serve import protocol

    pcm, rate = pcm_of(path)
    session = Session()
    ws = connect(url, token, label=label, sample_rate_hz=rate, source=source)
    receiver = threading.Thread(target=receive_all, args=(ws, session), daemon=True)
    receiver.start()
    step = max(1, int(rate * chunk_s))
    start_s = time.monotonic()
    for first in range(0, len(pcm), step):
        ws.send(pcm[first:first + step].tobytes())
        time.sleep(max(0.0, start_s + (first + step) / rate - time.monotonic()))
    ws.send(protocol.END_MESSAGE)
    receiver.join(timeout_s)
    ws.close()
    return session


def wer(references: list[str], hypotheses: list[str]) -> float:
    import jiwer
    from whisper_normalizer.english import EnglishTextNormalizer

    norm = EnglishTextNormalizer()
    return jiwer.wer([norm(r) for r in references], [norm(h) for h in hypotheses])


def clients_at_once(url: str, clips, offline_text) -> dict[str, Session]:
    """Each clip streamed by its own client at the same time; checks what every serving path
    must give (pooled WER within 2 points of ``offline_text(clip)``'s, a 1000 close, the ready
    message, captions labelled with the client's own stream) and returns the sessions by clip id."""
    from captioner.serve import protocol

    sessions: dict[str, Session] = {}

    def run(clip):
        sessions[clip.id] = stream_recording(url, clip.wav, label=clip.id[:20])

    threads = [threading.Thread(target=run, args=(clip,)) for clip in clips]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    offline = [offline_text(c) for c in clips]
    live = [sessions[c.id].committed for c in clips]
    live_wer, offline_wer = wer([c.reference for c in clips], live), wer([c.reference for c in clips], offline)
    print(f"served WER {live_wer:.3f}, offline {offline_wer:.3f}: {live}")
    assert live_wer <= offline_wer + 0.02, (live, offline)
    for clip in clips:
        session = sessions[clip.id]
        assert session.close_code == protocol.CLOSE_NORMAL, (session.close_code, session.close_reason)
        assert session.ready == {"type": "ready", "stream": clip.id[:20], "model": "tiny.en",
                                 "sample_rate": session.ready["sample_rate"], "language": "auto"}
        assert {c["stream"] for c in session.captions} == {clip.id[:20]}
    return sessions


def unwritten_finals(folder, sessions: dict[str, Session], timeout_s: float = 15.0) -> list[str]:
    """The committed lines the clients were sent that ``--transcripts`` never wrote into
    ``folder``. The server's writer thread appends (and fsyncs) off the event loop, so the last
    finals may reach the disk a moment after a client has them: wait for them, within a bound."""
    finals = [c["text"] for s in sessions.values() for c in s.captions if c["kind"] == "final"]
    deadline = time.monotonic() + timeout_s
    while True:
        written = " ".join(f.read_text(encoding="utf-8") for f in sorted(folder.glob("*.txt")))
        missing = [text for text in finals if text not in written]
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(0.1)


def check_capacity_refusal(url: str) -> None:
    """MAX_STREAMS connections held, the next one closed with 1013 and the engine's one-line
    memory reason (no ready message), then the held ones end normally."""
    from captioner.serve import protocol

    held = [connect(url, label=f"H{i}") for i in range(MAX_STREAMS)]
    try:
        for ws in held:
            assert '"ready"' in ws.recv(timeout=30)
        refused = Session()
        receive_all(connect(url, label="Over"), refused)
        assert refused.close_code == protocol.CLOSE_TRY_LATER, refused.close_reason
        assert "refused" in refused.close_reason and "memory" in refused.close_reason
        assert refused.ready is None
    finally:
        ended = []
        for ws in held:
            ws.send(np.zeros(1600, "<i2").tobytes())
            ws.send(protocol.END_MESSAGE)
        for ws in held:
            session = Session()
            receive_all(ws, session)
            ended.append(session.close_code)
    assert ended == [protocol.CLOSE_NORMAL] * MAX_STREAMS


def stream_then_stop(url: str, path, stop, speed: float = 2.0, token: str | None = TOKEN,
                     timeout_s: float = 120.0) -> Session:
    """Streams the recording at ``path`` ``speed`` times faster than real time (within the
    protocol's 10 s ahead of the clock) with no ``end``, calls ``stop()`` (a SIGTERM to the
    server) right after its last audio message, and returns what the client got until the close.
    At the stop the server holds seconds of the recording it has not captioned yet."""
    pcm, rate = pcm_of(path)
    ws = connect(url, token, label="Whole", sample_rate_hz=rate)
    assert '"ready"' in ws.recv(timeout=60)
    session = Session()
    receiver = threading.Thread(target=receive_all, args=(ws, session), daemon=True)
    receiver.start()
    step = rate // 10
    started = time.monotonic()
    for first in range(0, len(pcm), step):
        ws.send(pcm[first:first + step].tobytes())
        time.sleep(max(0.0, started + (first + step) / rate / speed - time.monotonic()))
    stop()
    receiver.join(timeout_s)
    return session


def words_of(text: str) -> set[str]:
    return set(text.lower().replace(",", " ").replace(".", " ").split())
