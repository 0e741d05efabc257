"""A client of ``captioner serve``: local audio sources captioned on a server.

:class:`RemotePipeline` has the shape of :class:`~captioner.engine.pipeline.Pipeline` (``start``,
``stop``, ``drain_captions``, ``latest_status``, ``running``, ``source_errors``, ``lost_inputs``,
…), so ``captioner listen --server`` and the desktop app drive it like a local pipeline. Each
source is one connection (one stream on the server), run by a :class:`_Link`:

- the source pushes its chunks into the link's inbox (a live source never waits, a file replay
  waits for room) from its own thread, as it would into the engine's inbox;
- the link's thread turns them into 16 kHz int16 PCM (:class:`~captioner.audio.ingest.StreamIngest`,
  the engine's own resampler and framer) and sends them; a receiver thread per connection
  takes the server's captions and status;
- a connection that breaks (or a server that restarts, or refuses for now with 1013) is tried
  again after 0.5 s, then 1, 2, 4 … at most 10 s; the audio captured meanwhile is kept (the
  last ``BACKLOG_S`` of it) and sent when the link is back, and the times of the new
  connection's captions are moved on by the audio sent before, so a stream's clock goes on;
- every committed line received is written to the transcript (when there is one) before it
  reaches the outbox, and kept; a partial that was on show when a connection broke is committed
  here, since the server that would have committed it is gone. A committed line is never lost;
- each connection says what its source's audio is (``source=``, from the source's ``origin``: a
  microphone, a meeting's audio from a monitor of an output, a file), so the server's
  ``--speakers auto`` leaves a microphone unlabelled; the captions' ``speaker`` is kept.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import replace
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from captioner.audio.ingest import StreamIngest
from captioner.audio.source import RawChunk, SourceEnd, live_sink_into, replay_sink_into
from captioner.engine.transcript_thread import TranscriptThread
from captioner.errors import UserError, one_line
from captioner.events import (
    SAMPLE_RATE_HZ,
    CaptionUpdate,
    PipelineStatus,
    TelemetrySample,
)
from captioner.serve import protocol
from captioner.serve.engine_link import telemetry_from_status

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 10.0
BACKLOG_S = 5.0
"""Audio captured while the server was away that is still sent when it is back (half the
server's allowance for audio ahead of the clock); older audio is skipped, its time kept."""
INBOX_CHUNKS = 3000
END_WAIT_S = 300.0
"""How long a link waits for its finals after ``end`` (the server captions its backlog first)."""
_STOP = object()


def stream_url(server: str, label: str, language: str | None, sample_rate_hz: int = SAMPLE_RATE_HZ,
               source: str | None = None) -> str:
    """``ws://host:port`` (or ``wss://``, with or without ``/v1/listen``) -> the stream's URL; a
    one-line ``UserError`` for anything else. ``source``: what the audio is (one of
    ``protocol.CLIENT_SOURCES``), left out when not known."""
    parts = urlsplit(server.strip())
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise UserError(f"--server must be ws://HOST:PORT or wss://HOST:PORT, not {server!r}")
    try:
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError:
        raise UserError(f"bad port in --server {server!r}") from None
    path, _, query = protocol.listen_path(label, language, sample_rate_hz, source).partition("?")
    return urlunsplit((parts.scheme, parts.netloc, path, query, ""))


def source_kind(source, speakers: str = "auto") -> str | None:
    """What a local source's audio is, as the protocol's ``source=`` says it: its ``origin``
    (``MicrophoneSource``: ``meeting`` for a monitor of an output, else ``microphone``;
    ``FileSource``: ``file``) where it is one a client may give; ``None`` (not said: the server
    takes the stream as ``remote``) for anything else. With ``speakers="on"`` (the user wants
    every stream labelled) a microphone is not said to be one, so a server labelling under
    ``auto`` labels it too."""
    origin = getattr(source, "origin", None)
    if origin == "microphone" and speakers == "on":
        return None
    return origin if origin in protocol.CLIENT_SOURCES else None


class _Fatal(Exception):
    """The server refused this stream for good (a bad token, a bad parameter): no retry."""


def _connect(url: str, token: str | None, ssl_context, timeout_s: float):
    """Opens the WebSocket; raises ``_Fatal`` for a refusal that retrying cannot mend, ``OSError``
    (or ``TimeoutError``) for a server that cannot be reached now."""
    from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI
    from websockets.sync.client import connect

    headers = {"Authorization": f"Bearer {token}"} if token else None
    try:
        return connect(url, additional_headers=headers, open_timeout=timeout_s, ssl=ssl_context,
                       max_size=protocol.MAX_MESSAGE_BYTES, compression=None, close_timeout=5)
    except InvalidStatus as error:
        status = error.response.status_code
        if status == 401:
            # Said apart: a server that wants a token, and one that did not take the token sent.
            if not token:
                raise _Fatal("the server needs a token (401): pass --token-file") from None
            raise _Fatal("the server refused the token (401): check --token-file") from None
        if status in (502, 503, 504):
            raise OSError(f"the server answered {status}") from None  # a proxy whose server is restarting
        raise _Fatal(f"the server answered HTTP {status} to {url}") from None
    except InvalidURI as error:
        raise _Fatal(str(error)) from None
    except InvalidHandshake as error:
        raise OSError(one_line(error)) from None


class _Link(threading.Thread):
    """One source's connection(s) to the server (its own thread; a receiver thread per connection)."""

    def __init__(self, owner: RemotePipeline, label: str, source: str | None = None) -> None:
        super().__init__(name=f"captioner-client-{label}", daemon=True)
        self.owner = owner
        self.label = label
        self.source = source  # what the audio is (source=), None: not said
        self.inbox: queue.Queue = queue.Queue(maxsize=INBOX_CHUNKS)
        self.connected = threading.Event()
        self.first_attempt = threading.Event()  # the first connection succeeded or failed
        self.finished = threading.Event()
        self.fatal: str | None = None
        self.lost: str | None = None
        self.losses = 0
        self.lost_s = 0.0
        self._lost_since: float | None = None
        self._ingest = StreamIngest(label)
        self._sent_samples = 0  # 16 kHz samples sent over all connections: the stream's clock
        self._partial = ""  # the partial on show, committed here if the connection breaks
        self._last: CaptionUpdate | None = None

    # -- the source's side ---------------------------------------------------------------------------
    def sink_for(self, live: bool):
        if live:
            return live_sink_into(self.inbox)
        return replay_sink_into(self.inbox, self.owner._stopping)

    # -- the link's thread ---------------------------------------------------------------------------
    def run(self) -> None:
        delay_s = BACKOFF_FIRST_S
        try:
            while True:
                outcome = self._session()
                if outcome == "done":
                    return
                self._mark_lost(outcome)
                self.first_attempt.set()
                if self.owner._stopping.is_set():
                    return  # stopping while the server is away: nothing more can be captioned
                if self.owner._stopping.wait(delay_s) or self.owner._abandon.is_set():
                    return  # stopping while the server is away: nothing more can be captioned
                delay_s = min(2 * delay_s, BACKOFF_MAX_S)
        except _Fatal as error:
            self.fatal = one_line(error)
        except BaseException as error:  # reported, never a traceback in the terminal
            self.fatal = f"client error: {one_line(error)}"
        finally:
            self.first_attempt.set()
            self.connected.clear()
            self.finished.set()

    _ended = False

    def _mark_lost(self, why: str) -> None:
        if self.lost is None:
            self.losses += 1
            self._lost_since = time.monotonic()
        self.lost = why
        self.connected.clear()

    def _mark_back(self) -> None:
        if self._lost_since is not None:
            self.lost_s += time.monotonic() - self._lost_since
            self._lost_since = None
        self.lost = None
        self.connected.set()

    def _session(self) -> str:
        """One connection: "done" after its finals and a 1000 close, else why it ended (retry)."""
        url = stream_url(self.owner.server, self.label, self.owner.language, source=self.source)
        try:
            ws = _connect(url, self.owner.token, self.owner.ssl_context, timeout_s=10.0)
        except OSError as error:
            return f"cannot reach the server: {one_line(error) or type(error).__name__}"
        with ws:
            return self._connected(ws)

    def _connected(self, ws) -> str:
        first_message = self._first_message(ws)
        if first_message is not None:
            return first_message
        self._mark_back()
        self.first_attempt.set()
        self._skip_old_backlog()
        offset_s = self._sent_samples / SAMPLE_RATE_HZ
        receiver = threading.Thread(target=self._receive, args=(ws, offset_s), daemon=True,
                                    name=f"captioner-client-rx-{self.label}")
        receiver.start()
        from websockets.exceptions import ConnectionClosed

        try:
            while receiver.is_alive():
                try:
                    item = self.inbox.get(timeout=0.1)
                except queue.Empty:
                    continue
                if item is _STOP or isinstance(item, SourceEnd):
                    self._send_pcm(ws, self._ingest.flush(time.monotonic_ns()))
                    self._ended = True
                    ws.send(protocol.END_MESSAGE)
                    receiver.join(END_WAIT_S)
                    break
                self._send_pcm(ws, self._ingest.accept(item.rate_hz, item.samples, item.capture_ns))
        except ConnectionClosed:
            pass
        receiver.join(5.0)
        ws.close()
        code = ws.close_code
        reason = ws.close_reason or ""
        if code == protocol.CLOSE_NORMAL and self._ended:
            return "done"
        self._commit_partial()
        if code is not None and code not in protocol.RETRYABLE_CLOSE_CODES and code != protocol.CLOSE_NORMAL:
            raise _Fatal(f"the server closed the stream ({code}: {reason or 'no reason'})")
        if self._ended and code == protocol.CLOSE_NORMAL:
            return "done"
        if self._ended:
            self._ended = False  # the finals were not all received: the stream goes on elsewhere
            self.inbox.put(SourceEnd(self.label))
        return f"connection to the server lost ({code or 1006}{': ' + reason if reason else ''})"

    def _first_message(self, ws) -> str | None:
        """Waits for ``ready``; a close instead (1013 at capacity) is returned as why, or raised."""
        from websockets.exceptions import ConnectionClosed

        try:
            text = ws.recv(timeout=30.0)
        except (ConnectionClosed, TimeoutError):
            code, reason = ws.close_code, ws.close_reason or ""
            ws.close()
            if code is not None and code not in protocol.RETRYABLE_CLOSE_CODES:
                raise _Fatal(f"the server refused the stream ({code}: {reason or 'no reason'})") from None
            self.owner._note_refusal(code, reason)
            return f"the server did not take the stream ({code or 'timeout'}{': ' + reason if reason else ''})"
        try:
            message = protocol.parse_server_message(text)
        except ValueError:
            message = {}
        if message.get("type") != "ready":
            ws.close()
            raise _Fatal("the server does not speak the captioner protocol")
        self.owner._ready(message)
        return None

    def _skip_old_backlog(self) -> None:
        """Audio older than ``BACKLOG_S`` that waited while the server was away is skipped (its
        time still counts on the stream's clock)."""
        waiting = self.inbox.qsize()
        if not waiting:
            return
        kept: list = []
        skipped_s = 0.0
        try:
            items = [self.inbox.get_nowait() for _ in range(waiting)]
        except queue.Empty:
            items = []
        total_s = sum(i.n_samples / i.rate_hz for i in items if isinstance(i, RawChunk))
        for item in items:
            if isinstance(item, RawChunk) and total_s - skipped_s > BACKLOG_S:
                skipped_s += item.n_samples / item.rate_hz
                continue
            kept.append(item)
        self._sent_samples += int(round(skipped_s * SAMPLE_RATE_HZ))
        self._ingest = StreamIngest(self.label) if skipped_s else self._ingest
        for item in kept:
            self.inbox.put(item)

    def _send_pcm(self, ws, block) -> None:
        if block is None or block.n_samples == 0:
            return
        pcm = np.clip(np.rint(block.samples * 32767.0), -32768, 32767).astype("<i2")
        ws.send(pcm.tobytes())
        self._sent_samples += block.n_samples

    def _receive(self, ws, offset_s: float) -> None:
        """Receiver thread: captions (times moved on by ``offset_s``) and status until the close."""
        from websockets.exceptions import ConnectionClosed

        try:
            for text in ws:
                try:
                    message = protocol.parse_server_message(text)
                except ValueError:
                    continue
                if message["type"] == "caption":
                    self._caption(message, offset_s)
                elif message["type"] == "status":
                    self.owner._status_from(message)
        except ConnectionClosed:
            pass

    def _caption(self, message: dict, offset_s: float) -> None:
        update = CaptionUpdate(
            stream=self.label, kind=message["kind"], text=message["text"],
            start_s=message["start_s"] + offset_s, end_s=message["end_s"] + offset_s,
            emitted_audio_s=message["emitted_audio_s"] + offset_s,
            emitted_wall_s=message["emitted_wall_s"] + offset_s,
            segment=message.get("segment", 0), language=message.get("language", ""),
            words=tuple((str(w), float(a) + offset_s, float(b) + offset_s) for w, a, b in message.get("words", ())),
            speaker="" if self.owner.speakers == "off" else str(message.get("speaker") or ""))
        self._partial = update.text if update.kind == "partial" else ""
        self._last = update
        self.owner._publish([update])

    def _commit_partial(self) -> None:
        """The partial on show when the connection broke becomes committed here."""
        last = self._last
        if self._partial.strip() and last is not None:
            self.owner._publish([replace(last, kind="final")])  # a final takes the partial off the screen
        self._partial = ""


class RemotePipeline:
    """Local sources captioned by ``captioner serve`` at ``server`` (``ws://host:port``).

    Takes the arguments of :class:`~captioner.engine.pipeline.Pipeline` that mean something for
    a client (``sources``, ``language``, ``transcript``) and ignores the others (the model and
    the device are the server's). ``speakers`` (``auto``, ``on``, ``off``; ``None``: ``auto``):
    the server labels speakers as its ``--speakers`` and each stream's ``source=`` say; ``off``
    drops the labels here, ``on`` does not tell the server that a microphone is one
    (:func:`source_kind`). Threads: each source's own; one link thread per source, a
    receiver thread per connection, and the transcript's (when there is one). The public methods are for the owner's thread, the
    outboxes for any thread."""

    def __init__(self, sources, server: str, token: str | None = None, language: str | None = None,
                 transcript=None, ssl_context=None, speakers: str | None = "auto", **_ignored) -> None:
        self.sources = list(sources)
        names = [s.stream for s in self.sources]
        if len(set(names)) != len(names):
            raise UserError(f"two sources have the same label: {names}")
        stream_url(server, "check", None)  # a bad URL is refused before anything starts
        self.server = server
        self.token = token
        self.language = None if language in (None, "", "auto") else language
        self.transcript = transcript
        if ssl_context is None and server.startswith("wss:"):
            import ssl

            ssl_context = ssl.create_default_context()
        self.ssl_context = ssl_context
        speakers = speakers or "auto"
        if speakers not in ("auto", "on", "off"):
            raise UserError(f"speakers must be one of auto, on, off, not {speakers!r}")
        self.speakers = speakers
        self._links = {s.stream: _Link(self, s.stream, source_kind(s, speakers)) for s in self.sources}
        self._captions: deque[CaptionUpdate] = deque()
        self._lock = threading.Lock()
        self._status: dict | None = None
        self._status_at_s = 0.0
        self._server_info: dict = {}
        self._status_seq = 0  # status messages received: a new one makes new values
        self._status_key: tuple | None = None
        self._status_value: PipelineStatus | None = None
        self._telemetry_key: int | None = None
        self._telemetry_value: TelemetrySample | None = None
        self._stopping = threading.Event()
        self._abandon = threading.Event()  # stop trying to reconnect
        self._started = False
        self.backend = None
        self.captioner = None
        self.model = ""
        self.refusals: list[tuple[int | None, str]] = []
        self._writer: TranscriptThread | None = None

    # -- lifecycle (owner thread) -------------------------------------------------------------------
    def start(self, timeout_s: float = 60.0) -> None:
        """Connects every stream, then starts the sources; ``UserError`` when the server cannot
        be reached or refuses (a bad token, no room)."""
        if self._started:
            return
        if self.transcript is not None:  # a thread of its own each start: a thread runs once
            transcript = self.transcript
            self._writer = TranscriptThread("captioner-transcript", lambda key, title: transcript,
                                            then=self._to_outbox)
            self._writer.start()
        for link in self._links.values():
            link.start()
        deadline = time.monotonic() + timeout_s
        for link in self._links.values():
            link.first_attempt.wait(max(0.0, deadline - time.monotonic()))
        problems = [link.fatal or link.lost for link in self._links.values() if not link.connected.is_set()]
        if problems:
            self._abandon.set()
            self._stopping.set()
            for link in self._links.values():
                link.inbox.put(_STOP)
                link.join(5)
            if self._writer is not None:
                self._writer.close(5)
            raise UserError(f"{self.server}: {problems[0]}")
        started = []
        try:
            for source in self.sources:
                source.start(self._links[source.stream].sink_for(getattr(source, "live", True)))
                started.append(source)
        except BaseException:
            for source in started:
                source.stop()
            self.stop(10.0)
            raise
        self._started = True

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stops capturing, lets the server commit and send what each stream shows, closes."""
        self._stopping.set()
        for source in self.sources:
            source.stop()
        for link in self._links.values():
            if link.is_alive():
                link.inbox.put(_STOP)
        deadline = time.monotonic() + timeout_s
        for link in self._links.values():
            link.finished.wait(max(0.0, deadline - time.monotonic()))
        self._abandon.set()  # a link still trying to reconnect gives up now
        for link in self._links.values():
            link.join(5)
        if self._writer is not None:  # the last finals written and on to the outbox
            self._writer.close(max(1.0, deadline - time.monotonic()))
        self._started = False

    def wait_exhausted(self, timeout_s: float | None = None) -> bool:
        """Every stream has ended and its finals arrived (finite sources)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for link in self._links.values():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not link.finished.wait(left):
                return False
        # ...and its finals written: they reach the outbox only then.
        while self._writer is not None and not self._writer.idle():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    @property
    def running(self) -> bool:
        return self._started and any(link.is_alive() for link in self._links.values())

    @property
    def error(self) -> BaseException | None:
        fatal = [link.fatal for link in self._links.values() if link.fatal]
        return UserError(fatal[0]) if fatal and len(fatal) == len(self._links) else None

    @property
    def failure(self) -> str | None:
        fatal = [link.fatal for link in self._links.values() if link.fatal]
        return fatal[0] if fatal else None

    @property
    def provider(self) -> str:
        return f"{self.model or 'the model'} on the server {self.server}"

    @property
    def source_errors(self) -> dict[str, str]:
        return {label: link.fatal for label, link in self._links.items() if link.fatal}

    @property
    def lost_inputs(self) -> dict[str, str]:
        """Streams whose connection to the server is down and being retried, with why."""
        return {label: link.lost for label, link in self._links.items() if link.lost and not link.fatal}

    @property
    def input_losses(self) -> dict:
        from captioner.engine.worker import InputLoss

        return {label: InputLoss(link.losses, link.lost_s) for label, link in self._links.items() if link.losses}

    def notices(self) -> list:
        return []

    # -- outboxes (any thread) -------------------------------------------------------------------------
    def drain_captions(self) -> list[CaptionUpdate]:
        with self._lock:
            out = list(self._captions)
            self._captions.clear()
        return out

    def latest_status(self) -> PipelineStatus | None:
        """The server's latest status as a :class:`PipelineStatus` (its device, step latency,
        streams), with the state of the connections in ``message``."""
        with self._lock:
            fields, at_s, seq = self._status, self._status_at_s, self._status_seq
        if fields is None:
            return None
        lost = self.lost_inputs
        key = (seq, tuple(lost.items()))
        if key == self._status_key:  # the same value while nothing changed: a GUI redraws on a new one
            return self._status_value
        message = "; ".join(f"{label}: {why}; reconnecting" for label, why in lost.items())
        self._status_key = key
        self._status_value = PipelineStatus(
            time_s=at_s, provider=str(fields.get("provider", "")), model=str(fields.get("model", "")),
            device_name=f"{fields.get('device_name', '')} @ {urlsplit(self.server).netloc}",
            streams=tuple(self._links), step_latency_ms=fields.get("step_latency_ms"),
            frame_latency_ms=fields.get("frame_latency_ms"), caption_latency_s=fields.get("caption_latency_s"),
            lag_s=float(fields.get("lag_s") or 0.0), real_time_factor=fields.get("real_time_factor"),
            batch_size=int(fields.get("batch_size") or 0), dropped_frames=int(fields.get("dropped_frames") or 0),
            queue_depth=int(fields.get("queue_depth") or 0), message=message,
            lost_inputs=tuple(lost),
            extra=(("server_streams", float(fields.get("streams") or 0)),
                   ("server_connections", float(fields.get("connections") or 0))),
        )
        return self._status_value

    def latest_telemetry(self) -> TelemetrySample | None:
        """The server's GPU as its last status message described it (the dashboard plots it)."""
        with self._lock:
            fields, at_s, seq = self._status, self._status_at_s, self._status_seq
        if fields is None:
            return None
        if self._telemetry_key != seq:
            self._telemetry_key, self._telemetry_value = seq, telemetry_from_status(fields, at_s)
        return self._telemetry_value

    # -- link callbacks (link and receiver threads) ----------------------------------------------------
    def _publish(self, updates: list[CaptionUpdate]) -> None:
        writer = self._writer
        if writer is not None and writer.is_alive():
            writer.put(updates)  # on to the outbox once the finals are on disk
            return
        if self.transcript is not None:  # a link that outlived the stop: written here, as before
            for update in updates:
                self.transcript.write(update)
        self._to_outbox(updates)

    def _to_outbox(self, updates: list[CaptionUpdate]) -> None:
        with self._lock:
            self._captions.extend(updates)

    def _status_from(self, message: dict) -> None:
        with self._lock:
            self._status, self._status_at_s = message, time.monotonic()
            self._status_seq += 1

    def _ready(self, message: dict) -> None:
        with self._lock:
            self._server_info = {**self._server_info, **message}
            self.model = str(message.get("model", ""))

    def _note_refusal(self, code: int | None, reason: str) -> None:
        with self._lock:
            self.refusals.append((code, reason))
