"""``captioner serve --frontends K`` (K > 1): the hub, the process that holds the engines.

K front-end processes (:mod:`captioner.serve.frontend`) listen on the same host:port
(``SO_REUSEPORT``) and do each connection's network work; each talks to the hub over one
local channel (:mod:`captioner.serve.channel`) in batches, every 5 ms by default
(``--frontend-flush-ms``). The hub keeps what must be
decided in one place: admission (the :class:`~captioner.serve.engine_link.EngineLink` and its
pipelines, as in the single-process server: refusals 1013, a language the model lacks 1008),
each stream's life, its captions, the status messages, ``--transcripts`` and the metrics. Per
frame it pays one copy of the batch's audio and one push per stream that sent audio, never a
WebSocket read, a message check or a JSON parse per client message.

A front-end that dies: its connections break (clients connect again, 1006), the hub ends their
streams as if each client had left and goes on with the others; the kernel sends new
connections to the front-ends still listening, and after a second a new front-end takes the dead
one's place (at most :data:`MAX_RESTARTS_PER_MIN` a minute). The hub that ends (its channel closes) ends the
front-ends, which close their connections with 1011.

Tasks on the hub's loop: one reader per front-end, one task per stream (opened, ended, closed),
the pump (captions from the engines as soon as one rings, then one frame to each front-end) and the status
task (one ``status`` text per device a second, to every front-end, and whether the engines take
new streams, for their ``/readyz``).

What one client may hold is counted here, over all front-ends (connections per client address);
each front-end closes its own connections that send no audio (``idle_timeout_s``). Stopping drains
as the single-process server does: the front-ends stop listening, each stream's audio is captioned
to its end within ``drain_s``, then 1001.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from captioner.engine.messages import Message
from captioner.errors import StreamRefused, UserError, one_line
from captioner.serve import channel, protocol
from captioner.serve.bounds import ConnectionCounter
from captioner.serve.engine_link import (
    CaptionBell,
    EngineDown,
    EngineLink,
    Lease,
    export_metrics,
    relabelled,
    status_fields,
)
from captioner.serve.loop_lag import LoopLag
from captioner.serve.server import (
    CUT_REASON,
    DRAIN_TAKE_S,
    END_TIMEOUT_S,
    OPEN_TIMEOUT_S,
    POLL_PERIOD_S,
    CaptionServer,
    drain_cut_line,
    is_loopback,
    transcripts_thread,
)
from captioner.serve.stream_flags import END_ASKED, ENDED, GONE, OPENED, StreamFlags

START_TIMEOUT_S = 60.0
"""How long a front-end may take to start and listen (a fresh interpreter importing websockets)."""
EXIT_TIMEOUT_S = 30.0
"""How long the front-ends may take to close what is left once told to, before they are killed."""
RESTART_DELAY_S = 1.0
"""A front-end that died is started again after this long (its clients are reconnecting meanwhile,
to the front-ends left)..."""
MAX_RESTARTS_PER_MIN = 5
"""...unless this many were started again in the last minute: a front-end that keeps dying is left
dead (and logged), the others serve on."""


class _Frontend:
    """One front-end process as the hub sees it (hub loop thread)."""

    def __init__(self, index: int, process: subprocess.Popen, reader, writer) -> None:
        self.index = index
        self.process = process
        self.reader = reader
        self.writer = writer
        self.out: list[tuple] = []
        self.streams: dict[int, _Stream] = {}
        self.alive = True
        self.accepted = 0
        """Streams admitted through this front-end so far."""
        self.readiness_told: str | None = None
        """What it was last told of the engines' readiness (``None``: nothing yet)."""

    @property
    def pid(self) -> int:
        return self.process.pid


class _Stream:
    """One connection's stream, as the hub sees it (hub loop thread)."""

    __slots__ = ("fe", "sid", "conn_id", "label", "language", "rate_hz", "peer", "source", "lease", "ready",
                 "flags", "closed_by")

    def __init__(self, fe: _Frontend, sid: int, conn_id: int, label: str, language: str | None, rate_hz: int,
                 peer: str, source: str = protocol.DEFAULT_SOURCE) -> None:
        self.fe, self.sid, self.conn_id = fe, sid, conn_id
        self.label, self.language, self.rate_hz, self.peer = label, language, rate_hz, peer
        self.source = source  # what the client said its audio is (source=): the stream's origin
        self.lease: Lease | None = None
        self.ready = ""  # the ready message, once the stream is admitted
        self.flags = StreamFlags()  # OPENED, ENDED, END_ASKED, GONE
        self.closed_by: tuple = (None, "")  # the front-end's close code and reason then (None: the client left)


class FrontendHub:
    """The server with ``frontends`` front-end processes. Arguments as :class:`CaptionServer`'s,
    but TLS as files (``tls_files``: certificate chain and key, loaded by each front-end).
    ``serve(stop)`` runs it on the calling thread's loop (:class:`ServerThread` runs it)."""

    def __init__(self, link: EngineLink, host: str = "127.0.0.1", port: int = 8765, *, frontends: int = 2,
                 token: str | None = None, tls_files: tuple[str, str] | None = None,
                 max_ahead_s: float = protocol.MAX_AHEAD_S, transcripts: Callable[[str], object] | None = None,
                 metrics=None, status_period_s: float = protocol.STATUS_PERIOD_S,
                 flush_s: float = channel.FLUSH_S, drain_s: float = protocol.DRAIN_S,
                 idle_timeout_s: float | None = protocol.IDLE_TIMEOUT_S, max_connections_per_client: int | None = None,
                 log: Callable[[str], None] = lambda line: None, notice: Callable[[str], None] | None = None) -> None:
        if not token and not is_loopback(host):
            raise UserError(f"refusing to serve on {host} without a token: anyone who can reach it could use "
                            "the GPU; give --token-file, or bind 127.0.0.1")
        if frontends < 1:
            raise UserError(f"--frontends must be at least 1, not {frontends}")
        self.link = link
        self.host = host
        self.port = port
        self.n_frontends = frontends
        self.token = token
        self.tls_files = tls_files
        self.scheme = "wss" if tls_files else "ws"
        self.max_ahead_s = max_ahead_s
        self.flush_s = flush_s
        """How often each front-end sends its batch (``--frontend-flush-ms``)."""
        self.metrics = metrics
        self.status_period_s = status_period_s
        self.drain_s = drain_s
        self.idle_timeout_s = idle_timeout_s
        self.log = log
        self.notice = notice or log
        self._per_client = ConnectionCounter(max_connections_per_client)
        self.frontends: list[_Frontend] = []
        self._transcripts = transcripts_thread(transcripts)
        self._by_lease: dict[str, _Stream] = {}
        self._ids = itertools.count(1)
        self._stopping = False
        self._flush_due = False
        self._tasks: list[asyncio.Task] = []
        self._placeholder: socket.socket | None = None
        self.restart_delay_s = RESTART_DELAY_S
        self._restarts: list[float] = []  # when front-ends were started again (monotonic s)
        self._inbound_ms: deque[float] = deque(maxlen=100_000)
        """Per frame with audio: how long its oldest audio waited between its front-end taking it
        in and the engine's inbox (the front-end's batching, the channel, the hub's loop)."""
        self.counts = {"accepted": 0, "refused": 0, "closed": 0}
        self.loop_lag = LoopLag()
        """How late the hub's loop ran its work (the summary line when `serve` ends)."""
        self.frontends_lag = LoopLag()
        """How late the front-ends' loops woke, as each reports it every second (not watched here)."""
        self.outbox_to_frontends_ms: deque[float] = deque(maxlen=100_000)
        """Captions from their engine's outbox to the front-end's loop, as the front-ends report it
        (the served way back's part in this server; the in-process pipeline's ends at the outbox)."""
        self.bound = threading.Event()
        """Set once every front-end listens (``port`` is then the real one, for port 0)."""

    # -- the front-end processes --------------------------------------------------------------------
    def _reserve_port(self) -> None:
        """For port 0: a port picked now and held by a bound (not listening) socket with
        ``SO_REUSEPORT``, so every front-end binds the same one and nothing else can take it."""
        if self.port != 0:
            return
        family, kind, proto, _, address = socket.getaddrinfo(self.host, 0, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        self._placeholder = sock
        self.port = sock.getsockname()[1]

    async def _start_frontend(self, index: int) -> _Frontend:
        """A fresh interpreter (``python -m captioner.serve.frontend``): none of this process's
        threads, CUDA context or model; it imports what this process imports (its ``sys.path``)."""
        ours, theirs = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        try:
            process = subprocess.Popen([sys.executable, "-m", "captioner.serve.frontend", str(theirs.fileno()),
                                        str(index)], pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env)
        finally:
            theirs.close()  # the child's end: its death then reads as the end of the channel here
        reader, writer = await channel.open_channel(ours)
        writer.write(channel.encode({"host": self.host, "port": self.port, "token": self.token,
                                     "tls_files": self.tls_files, "max_ahead_s": self.max_ahead_s,
                                     "flush_s": self.flush_s, "idle_timeout_s": self.idle_timeout_s}))
        return _Frontend(index, process, reader, writer)

    async def _wait_listening(self, fe: _Frontend) -> str:
        """"" once ``fe`` listens, else why it does not."""
        frame = await asyncio.wait_for(channel.read_frame(fe.reader), START_TIMEOUT_S)
        if frame is None:
            return f"front-end {fe.index} ended at its start (exit status {fe.process.wait()})"
        for event in frame.events:
            if type(event) is channel.StartFailed:
                return event.reason
            if type(event) is channel.Listening:
                return ""
        return f"front-end {fe.index} said {frame.events!r} at its start"

    async def _start_frontends(self) -> None:
        self._reserve_port()
        self.frontends = [await self._start_frontend(i) for i in range(self.n_frontends)]
        try:
            problems = await asyncio.gather(*(self._wait_listening(fe) for fe in self.frontends))
        except asyncio.TimeoutError:
            problems = [f"a front-end did not start within {START_TIMEOUT_S:g} s"]
        problems = [p for p in problems if p]
        if problems:
            await self._end_frontends(0.0)
            raise UserError(problems[0])
        for fe in self.frontends:
            self._tasks.append(asyncio.create_task(self._read(fe), name=f"captioner-hub-read-{fe.index}"))

    async def _end_frontends(self, timeout_s: float) -> None:
        for fe in self.frontends:
            self._send(fe, channel.Exit())
        self._flush()
        deadline = time.monotonic() + timeout_s
        for fe in self.frontends:
            try:
                await asyncio.to_thread(fe.process.wait, max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                fe.process.kill()
                await asyncio.to_thread(fe.process.wait)
            fe.writer.close()
        if self._placeholder is not None:
            self._placeholder.close()
            self._placeholder = None

    # -- from the front-ends ------------------------------------------------------------------------
    async def _read(self, fe: _Frontend) -> None:
        while True:
            frame = await channel.read_frame(fe.reader)
            if frame is None:
                break
            self._on_frame(fe, frame)
        self._frontend_ended(fe)

    def _on_frame(self, fe: _Frontend, frame: channel.FrontendFrame) -> None:
        """One batch: the audio first (a stream's audio precedes its end), then the events."""
        events, index, audio = frame.events, frame.audio_index, frame.audio_f32
        if index:
            self._inbound_ms.append((time.monotonic_ns() - min(entry[3] for entry in index)) / 1e6)
            # Whole 16 kHz frames already (the front-end framed them), read where they were
            # received: every engine gets one item for the whole batch, each stream a view.
            samples = np.frombuffer(audio, dtype=np.float32)
            streams = fe.streams
            by_worker: dict = {}
            offset = 0
            for sid, first, n_samples, capture_ns in index:
                stream = streams.get(sid)
                if stream is not None and stream.lease is not None:
                    by_worker.setdefault(stream.lease.worker, []).append(
                        (stream.lease, first, capture_ns, offset, n_samples))
                offset += n_samples
            for worker, pieces in by_worker.items():
                self.link.push_framed(worker, pieces, samples)
        for event in events:
            match event:
                case channel.ClientOpened(sid=sid):
                    stream = _Stream(fe, sid, next(self._ids), event.label, event.language, event.rate_hz, event.peer,
                                     event.source)
                    fe.streams[sid] = stream
                    asyncio.create_task(self._run_stream(stream))
                case channel.ClientEnded(sid=sid):
                    stream = fe.streams.get(sid)
                    if stream is not None:
                        stream.flags.raise_flag(END_ASKED)
                case channel.ClientGone(sid=sid):
                    stream = fe.streams.get(sid)
                    if stream is not None:
                        stream.closed_by = (event.code, event.reason)
                        stream.flags.raise_flag(GONE)
                case channel.FrontendLog(line=line):
                    self.log(f"front-end {fe.index}: {line}")
                case channel.ClientRefused():
                    self.counts["refused"] += 1
                case channel.LoopLate(late_ms=late_ms):
                    self.frontends_lag.late_ms.extend(late_ms)
                case channel.CaptionsBack(back_ms=back_ms):
                    self.outbox_to_frontends_ms.extend(back_ms)

    def _frontend_ended(self, fe: _Frontend) -> None:
        """Its channel closed: every stream of it ends as if its client had left."""
        fe.alive = False
        fe.out = []
        if not self._stopping:
            self.log(f"front-end {fe.index} (pid {fe.pid}) ended: its {len(fe.streams)} connection(s) "
                     "are closed, the other front-ends serve on")
        for stream in list(fe.streams.values()):
            stream.flags.raise_flag(GONE)
        asyncio.create_task(asyncio.to_thread(fe.process.wait))  # reaped, not left a zombie
        if not self._stopping:
            asyncio.create_task(self._restart(fe.index))

    async def _restart(self, index: int) -> None:
        """A dead front-end's place taken by a new one on the same port, within a restart budget."""
        now_s = time.monotonic()
        self._restarts = [t for t in self._restarts if now_s - t < 60.0]
        if len(self._restarts) >= MAX_RESTARTS_PER_MIN:
            self.log(f"front-end {index} not started again: {len(self._restarts)} were in the last minute")
            return
        self._restarts.append(now_s)
        await asyncio.sleep(self.restart_delay_s)
        if self._stopping:
            return
        fe = await self._start_frontend(index)
        try:
            problem = await self._wait_listening(fe)
        except asyncio.TimeoutError:
            problem = f"it did not listen within {START_TIMEOUT_S:g} s"
        if problem or self._stopping:
            fe.process.kill()
            await asyncio.to_thread(fe.process.wait)
            fe.writer.close()
            if problem:
                self.log(f"front-end {index} could not be started again: {problem}")
            return
        self.frontends[index] = fe
        self._tasks.append(asyncio.create_task(self._read(fe), name=f"captioner-hub-read-{index}"))
        self.log(f"front-end {index} started again (pid {fe.pid})")

    # -- to the front-ends --------------------------------------------------------------------------
    def _send(self, fe: _Frontend, event: Message) -> None:
        if fe.alive:
            fe.out.append(event)
            if not self._flush_due:
                self._flush_due = True
                asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Each front-end's pending events as one frame."""
        self._flush_due = False
        for fe in self.frontends:
            if fe.out and fe.alive:
                out, fe.out = fe.out, []
                if not fe.writer.is_closing():
                    fe.writer.write(channel.encode(out))

    # -- one stream ----------------------------------------------------------------------------------
    async def _run_stream(self, stream: _Stream) -> None:
        fe = stream.fe
        if self._stopping:
            self._send(fe, channel.CloseClient(stream.sid, *_STOPPING))
            fe.streams.pop(stream.sid, None)
            return
        too_many = self._per_client.take(stream.peer)  # over all front-ends: a client's connections land on any
        if too_many:
            self._refuse(stream, protocol.CLOSE_TRY_LATER, too_many)
            return
        counted = [True]

        def give_back() -> None:  # once the connection is over, not once its stream has left the engine
            if counted[0]:
                counted[0] = False
                self._per_client.give_back(stream.peer)

        try:
            await self._run_admitted(stream, give_back)
        finally:
            give_back()

    def _refuse(self, stream: _Stream, code: int, reason: str) -> None:
        """A connection closed before its stream opened (no room for it, or a language the model lacks)."""
        self.counts["refused"] += 1
        self.log(f"#{stream.conn_id} {stream.peer}: refused {code} ({one_line(reason)})")
        self._send(stream.fe, channel.CloseClient(stream.sid, code, reason))
        stream.fe.streams.pop(stream.sid, None)

    async def _run_admitted(self, stream: _Stream, give_back: Callable[[], None]) -> None:
        fe = stream.fe
        try:
            lease = await asyncio.to_thread(self.link.open, stream.label, stream.language, stream.rate_hz,
                                            lambda lease: self._lease_changed(stream, lease), stream.source)
        except EngineDown as error:  # a failed engine, being restarted: the log said why once
            self._refuse(stream, protocol.CLOSE_TRY_LATER, str(error))
            return
        except StreamRefused as error:
            self.counts["refused"] += 1
            self.log(f"#{stream.conn_id} {stream.peer}: refused at capacity: {one_line(error)}")
            self._send(fe, channel.CloseClient(stream.sid, protocol.CLOSE_TRY_LATER, str(error)))
            fe.streams.pop(stream.sid, None)
            return
        except UserError as error:  # a language the model lacks
            self._refuse(stream, protocol.CLOSE_POLICY, str(error))
            return
        except Exception as error:  # the engine failed: the client is told, not left waiting
            self.notice(f"#{stream.conn_id} {stream.peer}: the engine could not open the stream: {one_line(error)}")
            self._refuse(stream, protocol.CLOSE_INTERNAL, "the engine failed; try again")
            return
        stream.lease = lease
        self._by_lease[lease.key] = stream
        self.counts["accepted"] += 1
        fe.accepted += 1
        self.log(f"#{stream.conn_id} {stream.peer}: open ({stream.rate_hz} Hz, {lease.worker.device or 'auto'}, "
                 f"front-end {fe.index})")
        stream.ready = protocol.ready_message(stream.label, self.link.model, stream.rate_hz, lease.language)
        self._send(fe, channel.Admit(stream.sid, lease.worker.index))
        if lease.state == "open":  # listed already (the pump ran while the stream was opened)
            self._send(fe, channel.StreamReady(stream.sid, stream.ready))
        if self._stopping:  # admitted while the stop began: drained like the others
            asyncio.create_task(self._drain_one(stream))
        code: int | None = None
        reason = why = ""
        closed_by = None
        flags = stream.flags
        try:
            await flags.wait(END_ASKED | GONE | ENDED)
            if flags.is_up(GONE):
                code = None  # nothing to send: the connection is over
                closed_by, why = stream.closed_by
            elif flags.is_up(END_ASKED):
                code, reason = await self._finish(stream)
            else:
                code, reason = CaptionServer._end_code(lease)
                if self._stopping and code == protocol.CLOSE_NORMAL:  # committed by the stop
                    code, reason = _STOPPING
        finally:
            if code is not None:
                self._send(fe, channel.CloseClient(stream.sid, code, reason))
            give_back()
            await self._retire(stream)
            if code is None and closed_by is not None:  # the front-end closed it for the client's input
                code, reason = closed_by, why
            self.log(f"#{stream.conn_id} {stream.peer}: closed {code if code is not None else 'by the client'}"
                     + (f" ({one_line(reason)})" if reason else ""))

    def _lease_changed(self, stream: _Stream, lease: Lease) -> None:
        """Hub loop thread (from the pump)."""
        if lease.state == "open" and stream.ready:
            self._send(stream.fe, channel.StreamReady(stream.sid, stream.ready))  # before any caption or status
        stream.flags.follow_lease(lease.state)

    async def _finish(self, stream: _Stream) -> tuple[int, str]:
        """After ``end``: the stream's open text is committed, its finals go out, then 1000."""
        try:
            await stream.flags.wait(OPENED, OPEN_TIMEOUT_S)
            await asyncio.to_thread(self.link.close, stream.lease)
            await stream.flags.wait(ENDED, END_TIMEOUT_S)
        except asyncio.TimeoutError:
            return protocol.CLOSE_INTERNAL, "the engine did not finish the stream in time"
        return CaptionServer._end_code(stream.lease)

    async def _retire(self, stream: _Stream) -> None:
        """Whatever way a stream ended, it is committed and leaves the engine."""
        lease = stream.lease
        try:
            if lease is not None and lease.state in ("opening", "open"):
                await stream.flags.wait(OPENED, OPEN_TIMEOUT_S)
                await asyncio.to_thread(self.link.close, lease)
            await stream.flags.wait(ENDED, END_TIMEOUT_S)
        except asyncio.TimeoutError:
            pass
        finally:
            stream.fe.streams.pop(stream.sid, None)
            if lease is not None:
                self._by_lease.pop(lease.key, None)
            if self._transcripts is not None:
                self._transcripts.end(stream.conn_id)
            self.counts["closed"] += 1

    async def _drain_one(self, stream: _Stream) -> None:
        """Ends one stream at the stop: the audio on its way (in its front-end's next frames) is
        taken in, then the stream is closed (the engine captions what it holds to its end); its
        task closes it with 1001 once its finals are out. The drain's deadline cuts what takes longer."""
        await asyncio.sleep(DRAIN_TAKE_S)
        lease = stream.lease
        if lease is None or lease.state not in ("opening", "open"):
            return
        try:
            await stream.flags.wait(OPENED, self.drain_s)
            await asyncio.to_thread(self.link.close, lease)
        except asyncio.TimeoutError:
            pass

    # -- engine side ---------------------------------------------------------------------------------
    async def _pump(self) -> None:
        """Captions and stream states from the engine to the front-ends, one frame each per round."""
        bell = CaptionBell(asyncio.get_running_loop())
        self.link.ring_on_captions(bell.ring)
        while True:
            rung_ns = bell.heard_ns  # when the oldest of these reached its engine's outbox
            for lease, update in self.link.poll():
                stream = self._by_lease.get(lease.key)
                if stream is None:
                    continue
                # The values, not the message: its front-end makes the JSON (caption_fields).
                self._send(stream.fe, channel.Caption(stream.sid, protocol.caption_fields(update), rung_ns))
                if self.metrics is not None and update.text.strip():
                    self.metrics.observe_caption(update)
                if self._transcripts is not None and update.kind == "final" and update.text.strip():
                    self._transcripts.put([relabelled(update, stream.label)], stream.conn_id,
                                          f"{stream.label} via {stream.peer}")
            for line in self.link.take_notes():
                self.notice(line)
            self._flush()
            await bell.wait(POLL_PERIOD_S)

    async def _status(self) -> None:
        """One ``status`` text per device a second, to every front-end (each sends it to its
        connections on that device)."""
        while True:
            await asyncio.sleep(self.status_period_s)
            listed: dict[int, int] = {}
            for stream in self._by_lease.values():
                if stream.lease.live:
                    index = stream.lease.worker.index
                    listed[index] = listed.get(index, 0) + 1
            texts = {}
            if self.metrics is not None:
                export_metrics(self.metrics, self.link)
            for worker in self.link.workers:
                if listed.get(worker.index):
                    texts[worker.index] = protocol.status_message(status_fields(worker, listed[worker.index]))
            if texts:
                for fe in self.frontends:
                    self._send(fe, channel.StatusTexts(texts))
            self._tell_readiness()

    def _tell_readiness(self) -> None:
        """Each front-end's ``/readyz`` answers from what it was told last: told when it changes
        (and a new front-end at once), at most a status period late."""
        readiness = "the server is stopping" if self._stopping else self.link.readiness()
        for fe in self.frontends:
            if fe.readiness_told != readiness:
                fe.readiness_told = readiness
                self._send(fe, channel.Readiness(readiness))

    # -- running -------------------------------------------------------------------------------------
    def inbound_delay_ms(self) -> tuple[float, float] | None:
        """p50 and p99 of how long audio waited between a front-end and the engine's inbox
        (the oldest of each frame; the last 100,000 frames), or ``None`` before any audio."""
        waits = list(self._inbound_ms)
        if not waits:
            return None
        p50, p99 = np.percentile(waits, [50, 99])
        return round(float(p50), 1), round(float(p99), 1)

    def streams_on(self, frontend_index: int) -> list[str]:
        """The labels of the streams held through front-end ``frontend_index`` now (tests, logs)."""
        return [s.label for s in tuple(self.frontends[frontend_index].streams.values())]

    async def serve(self, stop: asyncio.Event) -> None:
        """Serves until ``stop`` is set; then every open stream is committed, its finals sent and
        its connection closed with 1001, and the front-ends end."""
        if self._transcripts is not None and not self._transcripts.is_alive():
            self._transcripts.start()
        try:
            await self._start_frontends()
            self._tasks += [asyncio.create_task(self._pump(), name="captioner-hub-pump"),
                            asyncio.create_task(self._status(), name="captioner-hub-status"),
                            asyncio.create_task(self.loop_lag.watch(), name="captioner-hub-loop-lag")]
            self.bound.set()
            await stop.wait()
            await self.stop_all()
        finally:
            for task in self._tasks:
                task.cancel()
            self._tasks = []
            await self._end_frontends(EXIT_TIMEOUT_S)
            if self._transcripts is not None and self._transcripts.is_alive():
                self._transcripts.close(10)

    async def stop_all(self) -> None:
        """The drain, as :meth:`CaptionServer.stop_all`: the front-ends stop listening, every
        open stream's audio received is captioned to its end, its finals sent and its connection
        closed with 1001, within ``drain_s``; what is left then is closed anyway, and one line says
        how many streams were cut."""
        self._stopping = True
        started_s = time.monotonic()
        for fe in self.frontends:
            self._send(fe, channel.StopListening())
        draining = list(self._by_lease.values())
        if draining:
            self.notice(f"stopping: no new connections; captioning the {len(draining)} open stream(s) to the end "
                        f"of their audio (at most {self.drain_s:g} s)")
        for stream in draining:
            asyncio.create_task(self._drain_one(stream))
        deadline_s = started_s + self.drain_s
        while any(fe.streams for fe in self.frontends) and time.monotonic() < deadline_s:
            await asyncio.sleep(0.05)
        left = [stream for fe in self.frontends for stream in fe.streams.values() if stream.lease is not None]
        for stream in left:
            self._send(stream.fe, channel.CloseClient(stream.sid, protocol.CLOSE_GOING_AWAY, CUT_REASON))
            # Its task ends now, waiting no more for the engine (the loop's end would wait for it).
            stream.closed_by = (protocol.CLOSE_GOING_AWAY, CUT_REASON)
            stream.flags.raise_flag(OPENED | ENDED | GONE)
        if left:
            self.notice(drain_cut_line(len(left), len(draining), self.drain_s))
        elif draining:
            self.notice(f"drained: {len(draining)} stream(s) captioned to their end and closed in "
                        f"{time.monotonic() - started_s:.1f} s")
        self._flush()


_STOPPING = (protocol.CLOSE_GOING_AWAY, "the server is shutting down")
