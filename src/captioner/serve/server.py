"""``captioner serve``: an asyncio WebSocket server in front of the engine (docs/protocol.md).

Each connection is one stream. The loop thread only moves bytes and JSON: it checks each
message, hands audio to the engine's inbox without waiting (:class:`~captioner.serve.engine_link.NetworkSource`),
and sends each connection what its outbox holds. The model work runs on each device's worker
thread; what may block (opening or closing a stream while the inbox is full) runs on helper
threads (``asyncio.to_thread``). A bad client is closed with its own code and reason; nothing it
sends reaches another connection's stream.

Tasks on the loop: one handler and one sender per connection; the pump (captions and stream
states from the engine, every 20 ms); the status task (one ``status`` message a second to each
connection, from its device's engine status and GPU telemetry); the idle watch (connections
that send no audio, :mod:`captioner.serve.bounds`).

Stopping (Ctrl-C, SIGTERM) drains: no new connection is taken, each stream's audio received is
captioned to its end and its finals sent, then each connection is closed with 1001, all within
``drain_s``; what is still open then is closed anyway, and the log says how many were cut.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import math
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from urllib.parse import urlsplit

from captioner.engine.transcript_thread import TranscriptThread
from captioner.errors import StreamRefused, UserError, one_line
from captioner.serve import protocol
from captioner.serve.bounds import ConnectionCounter, close_idle
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
from captioner.serve.protocol import (
    ProtocolError,
    close_reason,
    health_response,
    peer,
    send_outbox,
)
from captioner.serve.stream_flags import ENDED, OPENED, StreamFlags

POLL_PERIOD_S = 0.02
"""How often the pump goes round when no engine rings (:class:`~captioner.serve.engine_link.CaptionBell`):
the streams' states follow the engines' status; captions go out as soon as they are made."""
OPEN_TIMEOUT_S = 120.0
"""How long a stream may wait for the engine to list it (a first model step on a slow CPU)."""
END_TIMEOUT_S = 300.0
"""How long the finals of an ended stream may take (its backlog is captioned first)."""
MAX_OUTBOX = 10_000
"""Messages waiting for a client that does not read: past this the connection is closed (1008)."""
DRAIN_TAKE_S = 0.5
"""At a stop, audio still arriving this long is taken in before each stream is closed: what a
client had sent when the stop came may still be on its way (the socket, the front-end's batch)."""


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server to this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


class _Conn:
    """One connection: its stream's lease, its outbox and the events the pump sets (loop thread)."""

    __slots__ = ("id", "ws", "params", "lease", "outbox", "flags", "pace", "peer", "ready", "last_audio_s")

    def __init__(self, conn_id: int, ws, params: protocol.StreamParams, max_ahead_s: float) -> None:
        self.id = conn_id
        self.ws = ws
        self.params = params
        self.lease: Lease | None = None
        self.outbox: asyncio.Queue[str | None] = asyncio.Queue()
        self.flags = StreamFlags()  # OPENED, ENDED
        self.pace = protocol.Pace(max_ahead_s)
        self.peer = ""
        self.ready = ""  # the ``ready`` message, sent once the engine has admitted the stream
        self.last_audio_s = time.monotonic()  # when its last audio came (the idle watch)

    def lease_changed(self, lease: Lease) -> None:
        """Loop thread (from the pump)."""
        if lease.state == "open" and self.ready:
            self.outbox.put_nowait(self.ready)  # before any caption or status: the pump queues those after
        self.flags.follow_lease(lease.state)


def transcripts_thread(transcripts: Callable[[str], object] | None) -> TranscriptThread | None:
    """``--transcripts DIR``: each connection's committed lines, appended by a writer the command
    makes (``transcripts(title)``, e.g. the app's fsync'ing TranscriptWriter), off the loop."""
    if transcripts is None:
        return None
    return TranscriptThread("captioner-serve-transcripts", lambda conn_id, title: transcripts(title))


class CaptionServer:
    """The WebSocket server. ``link``: the started engines. ``token``: the bearer token clients
    must send (``None``: none needed, only allowed on a loopback address). ``ssl_context``:
    TLS. ``transcripts``: ``title -> writer`` for ``--transcripts`` (``None``: nothing is written).
    ``metrics``: an object with ``observe_caption``, ``update_status``, ``update_telemetry`` and
    ``update_engine`` (the app's Prometheus exporter). ``drain_s``: how long a stop may take to
    caption the streams to their end. ``idle_timeout_s``: a connection without audio this long
    is closed (``None``: never). ``max_connections_per_client``: connections one client address
    may hold (``None``: any number). ``log``: one line per event (a connection opened, refused,
    closed); never audio or caption text. ``notice``: lines about the server itself (an engine
    failed or came back, the drain), shown even where ``log`` is not (default: ``log``)."""

    def __init__(self, link: EngineLink, host: str = "127.0.0.1", port: int = 8765, *, token: str | None = None,
                 ssl_context=None, max_ahead_s: float = protocol.MAX_AHEAD_S,
                 transcripts: Callable[[str], object] | None = None, metrics=None,
                 status_period_s: float = protocol.STATUS_PERIOD_S, drain_s: float = protocol.DRAIN_S,
                 idle_timeout_s: float | None = protocol.IDLE_TIMEOUT_S, max_connections_per_client: int | None = None,
                 log: Callable[[str], None] = lambda line: None, notice: Callable[[str], None] | None = None) -> None:
        if not token and not is_loopback(host):
            raise UserError(f"refusing to serve on {host} without a token: anyone who can reach it could use "
                            "the GPU; give --token-file, or bind 127.0.0.1")
        self.link = link
        self.host = host
        self.port = port
        self.token = token
        self.ssl_context = ssl_context
        self.max_ahead_s = max_ahead_s
        self.metrics = metrics
        self.status_period_s = status_period_s
        self.drain_s = drain_s
        self.idle_timeout_s = idle_timeout_s
        self.log = log
        self.notice = notice or log
        self._per_client = ConnectionCounter(max_connections_per_client)
        self._transcripts = transcripts_thread(transcripts)
        self._conns: dict[int, _Conn] = {}
        self._by_lease: dict[str, _Conn] = {}
        self._ids = itertools.count(1)
        self._stopping = False
        self._tasks: list[asyncio.Task] = []
        self.counts = {"accepted": 0, "refused": 0, "closed": 0}
        self.loop_lag = LoopLag()
        """How late this server's loop ran its work (the summary line when `serve` ends)."""
        self.bound = threading.Event()
        """Set once the socket is listening (``port`` is then the real one, for port 0)."""

    # -- handshake -----------------------------------------------------------------------------------
    def readiness(self) -> str:
        """"" while a new stream would be taken now, else why not (``/readyz``)."""
        return "the server is stopping" if self._stopping else self.link.readiness()

    def _process_request(self, connection, request):
        """Before the upgrade: the health endpoints answer (no token: they say only whether the
        server serves), a wrong path is 404, a missing or wrong token 401 (no WebSocket is opened,
        so nothing of the server is reachable without the token)."""
        path = urlsplit(request.path).path
        if path in (protocol.HEALTH_PATH, protocol.READY_PATH):
            return health_response(connection, path, self.readiness())
        if path != protocol.PATH:
            return connection.respond(HTTPStatus.NOT_FOUND, f"captioner: connect to {protocol.PATH}\n")
        if self.token is not None and not protocol.token_matches(request.headers.get("Authorization"), self.token):
            self.counts["refused"] += 1
            self.log(f"refused {peer(connection)}: missing or wrong token")
            response = connection.respond(HTTPStatus.UNAUTHORIZED, "captioner: missing or wrong bearer token\n")
            response.headers["WWW-Authenticate"] = 'Bearer realm="captioner"'
            return response
        return None

    @property
    def scheme(self) -> str:
        return "wss" if self.ssl_context is not None else "ws"

    # -- one connection ------------------------------------------------------------------------------
    async def handle(self, ws) -> None:
        """Loop thread: one connection, from its parameters to its close. ``ws`` is a websockets
        ``ServerConnection`` or anything with its surface (``request.path``, ``remote_address``,
        async iteration over messages, ``send``, ``close``: the Ray Serve app adapts Starlette's)."""
        self.start_background()
        where = peer(ws)
        try:
            params = protocol.parse_path(ws.request.path)
        except ProtocolError as error:
            await self._refuse(ws, where, error.code, error.reason)
            return
        if self._stopping:
            await ws.close(protocol.CLOSE_GOING_AWAY, "the server is shutting down")
            return
        too_many = self._per_client.take(where)
        if too_many:
            await self._refuse(ws, where, protocol.CLOSE_TRY_LATER, too_many)
            return
        try:
            await self._run(ws, where, params)
        finally:
            self._per_client.give_back(where)

    async def _refuse(self, ws, where: str, code: int, reason: str) -> None:
        """A connection closed before its stream opened (its request, or no room for it)."""
        self.counts["refused"] += 1
        self.log(f"{where}: refused {code} ({one_line(reason)})")
        await ws.close(code, close_reason(reason))

    async def _run(self, ws, where: str, params: protocol.StreamParams) -> None:
        """One admitted connection, from its stream's opening to its close."""
        conn = _Conn(next(self._ids), ws, params, self.max_ahead_s)
        conn.peer = where
        try:
            lease = await asyncio.to_thread(self.link.open, params.label, params.language, params.sample_rate_hz,
                                            conn.lease_changed, params.source)
        except EngineDown as error:  # a failed engine, being restarted: the log said why once
            await self._refuse(ws, where, protocol.CLOSE_TRY_LATER, str(error))
            return
        except StreamRefused as error:
            self.counts["refused"] += 1
            self.log(f"#{conn.id} {conn.peer}: refused at capacity: {one_line(error)}")
            await ws.close(protocol.CLOSE_TRY_LATER, close_reason(str(error)))
            return
        except UserError as error:  # a language the model lacks
            await self._refuse(ws, where, protocol.CLOSE_POLICY, str(error))
            return
        except Exception as error:  # the engine failed as it took the stream: the client is told, not left waiting
            self.notice(f"#{conn.id} {conn.peer}: the engine could not open the stream: {one_line(error)}")
            await self._refuse(ws, where, protocol.CLOSE_INTERNAL, "the engine failed; try again")
            return
        conn.lease = lease
        conn.last_audio_s = time.monotonic()  # idle from its admission on
        self._conns[conn.id] = conn
        self._by_lease[lease.key] = conn
        self.counts["accepted"] += 1
        self.log(f"#{conn.id} {conn.peer}: open ({params.sample_rate_hz} Hz, {lease.worker.device or 'auto'})")
        if self._stopping:  # admitted while the stop began: drained like the others
            asyncio.create_task(self._drain_one(conn))
        sender = asyncio.create_task(self._sender(conn))
        conn.ready = protocol.ready_message(params.label, self.link.model, params.sample_rate_hz, lease.language)
        if lease.state == "open":  # listed already (the pump ran while the stream was opened)
            conn.outbox.put_nowait(conn.ready)
        code, reason = protocol.CLOSE_NORMAL, ""
        receiver = asyncio.create_task(self._receive(conn))
        ended = conn.flags.when(ENDED)
        try:
            await asyncio.wait({receiver, ended}, return_when=asyncio.FIRST_COMPLETED)
            if receiver.done():
                try:
                    got_end = receiver.result()
                except ProtocolError as error:
                    got_end, code, reason = False, error.code, error.reason
                if got_end:
                    code, reason = await self._finish(conn)
                elif code == protocol.CLOSE_NORMAL:
                    code = None  # the client went away: nothing to send
            else:
                receiver.cancel()
                code, reason = self._end_code(conn.lease)
                if self._stopping and code == protocol.CLOSE_NORMAL:  # committed by the stop
                    code, reason = protocol.CLOSE_GOING_AWAY, "the server is shutting down"
        except asyncio.CancelledError:  # the server is stopping
            code, reason = protocol.CLOSE_GOING_AWAY, "the server is shutting down"
            raise
        finally:
            ended.cancel()
            if not receiver.done():
                receiver.cancel()
            asyncio.create_task(self._retire(conn))
            conn.outbox.put_nowait(None)
            if code not in (None, protocol.CLOSE_NORMAL, protocol.CLOSE_GOING_AWAY):
                # A refused client gets its code now, not its captions; a stream the stop
                # committed (1001) gets its finals first, queued in the same pump round.
                sender.cancel()
            try:
                await asyncio.wait_for(sender, 30.0)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                pass
            if code is not None:
                await ws.close(code, close_reason(reason))
            self.counts["closed"] += 1
            self.log(f"#{conn.id} {conn.peer}: closed {code if code is not None else 'by the client'}"
                     + (f" ({one_line(reason)})" if reason else ""))

    async def _receive(self, conn: _Conn) -> bool:
        """The client's messages until ``end`` (True) or until it closes (False); raises
        :class:`ProtocolError` for a message the protocol does not allow."""
        from websockets.exceptions import ConnectionClosed

        rate = conn.params.sample_rate_hz
        lease = conn.lease
        assert lease is not None
        try:
            async for message in conn.ws:
                n_samples = protocol.check_audio(message)
                if n_samples < 0:
                    conn.last_audio_s = math.inf  # its audio is over: waiting for its finals is not idling
                    return True
                now_ns = time.monotonic_ns()  # one clock read for the pace, the idle watch and the capture time
                conn.pace.add(n_samples / rate, now_ns / 1e9)
                if n_samples:
                    conn.last_audio_s = now_ns / 1e9
                    lease.push(message, now_ns)
        except ConnectionClosed as closed:
            # This server's own close (too big, idle, not reading, a keepalive ping unanswered)
            # is said as such, not as the client's leaving.
            by_server = protocol.closed_by_server(closed)
            if by_server is not None:
                raise by_server from None
        by_server = protocol.ended_by_server(conn.ws)
        if by_server is not None:
            raise by_server
        return False

    async def _finish(self, conn: _Conn) -> tuple[int, str]:
        """After ``end``: the stream's open text is committed, its finals go out, then 1000."""
        lease = conn.lease
        assert lease is not None
        try:
            await conn.flags.wait(OPENED, OPEN_TIMEOUT_S)
            await asyncio.to_thread(self.link.close, lease)
            await conn.flags.wait(ENDED, END_TIMEOUT_S)
        except asyncio.TimeoutError:
            return protocol.CLOSE_INTERNAL, "the engine did not finish the stream in time"
        return self._end_code(lease)

    @staticmethod
    def _end_code(lease: Lease) -> tuple[int, str]:
        if lease.state == "done":
            return protocol.CLOSE_NORMAL, ""
        if lease.state == "refused":
            return protocol.CLOSE_TRY_LATER, lease.reason
        if lease.state == "failed":
            return protocol.CLOSE_INTERNAL, lease.reason
        return protocol.CLOSE_INTERNAL, f"stream ended in state {lease.state}"

    async def _retire(self, conn: _Conn) -> None:
        """Whatever way a connection ended, its stream is committed and leaves the engine (the
        engine must have listed it first, so the close cannot pass the open)."""
        lease = conn.lease
        try:
            if lease is not None and lease.state in ("opening", "open"):
                await conn.flags.wait(OPENED, OPEN_TIMEOUT_S)
                await asyncio.to_thread(self.link.close, lease)
            await conn.flags.wait(ENDED, END_TIMEOUT_S)
        except asyncio.TimeoutError:
            pass
        finally:
            self._conns.pop(conn.id, None)
            if lease is not None:
                self._by_lease.pop(lease.key, None)
            if self._transcripts is not None:
                self._transcripts.end(conn.id)

    async def _sender(self, conn: _Conn) -> None:
        await send_outbox(conn.ws, conn.outbox)

    # -- engine side -------------------------------------------------------------------------------
    async def _pump(self) -> None:
        """Captions and stream states from the engine to the connections' outboxes."""
        bell = CaptionBell(asyncio.get_running_loop())
        self.link.ring_on_captions(bell.ring)
        while True:
            for lease, update in self.link.poll():
                conn = self._by_lease.get(lease.key)
                if conn is None:
                    continue
                conn.outbox.put_nowait(protocol.caption_message(conn.params.label, protocol.caption_fields(update)))
                if conn.outbox.qsize() == MAX_OUTBOX + 1:  # once: the close is on its way
                    asyncio.create_task(conn.ws.close(protocol.CLOSE_POLICY, "the client does not read its captions"))
                if self.metrics is not None and update.text.strip():
                    self.metrics.observe_caption(update)
                if self._transcripts is not None and update.kind == "final" and update.text.strip():
                    self._transcripts.put([relabelled(update, conn.params.label)], conn.id,
                                          f"{conn.params.label} via {conn.peer}")
            for line in self.link.take_notes():
                self.notice(line)
            await bell.wait(POLL_PERIOD_S)

    async def _status(self) -> None:
        """One ``status`` message a second to every connection, about its own device."""
        while True:
            await asyncio.sleep(self.status_period_s)
            if self.metrics is not None:
                export_metrics(self.metrics, self.link)
            for worker in self.link.workers:
                conns = [c for c in self._conns.values()
                         if c.lease is not None and c.lease.worker is worker and c.lease.live]
                if not conns:
                    continue
                message = protocol.status_message(status_fields(worker, len(conns)))
                for conn in conns:
                    conn.outbox.put_nowait(message)

    # -- running -------------------------------------------------------------------------------------
    def start_background(self) -> None:
        """Loop thread: the pump and the status task (and the transcript thread), once."""
        if self._tasks:
            return
        if self._transcripts is not None and not self._transcripts.is_alive():
            self._transcripts.start()
        self._tasks = [asyncio.create_task(self._pump(), name="captioner-serve-pump"),
                       asyncio.create_task(self._status(), name="captioner-serve-status"),
                       asyncio.create_task(self.loop_lag.watch(), name="captioner-serve-loop-lag"),
                       asyncio.create_task(close_idle(self._idle_candidates, self.idle_timeout_s),
                                           name="captioner-serve-idle")]

    def _idle_candidates(self):
        """The connections the idle watch looks at: none while the server drains (a stream whose
        audio is over waits for its finals, which is not idling)."""
        return () if self._stopping else self._conns.values()

    def stop_background(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._tasks = []
        if self._transcripts is not None and self._transcripts.is_alive():
            self._transcripts.close(10)

    async def stop_all(self) -> None:
        """The drain: every open stream's audio received is captioned to its end, its finals
        sent and its connection closed with 1001, within ``drain_s``; then whatever is left is
        closed anyway, and one line says how many streams were cut."""
        self._stopping = True
        started_s = time.monotonic()
        draining = list(self._conns.values())
        if draining:
            self.notice(f"stopping: no new connections; captioning the {len(draining)} open stream(s) to the end "
                        f"of their audio (at most {self.drain_s:g} s)")
        for conn in draining:
            asyncio.create_task(self._drain_one(conn))
        deadline_s = started_s + self.drain_s
        while self._conns and time.monotonic() < deadline_s:
            await asyncio.sleep(0.05)
        left = list(self._conns.values())
        for conn in left:
            asyncio.create_task(conn.ws.close(protocol.CLOSE_GOING_AWAY, CUT_REASON))
        if left:
            self.notice(drain_cut_line(len(left), len(draining), self.drain_s))
        elif draining:
            self.notice(f"drained: {len(draining)} stream(s) captioned to their end and closed in "
                        f"{time.monotonic() - started_s:.1f} s")

    async def serve(self, stop: asyncio.Event) -> None:
        """Serves until ``stop`` is set; then stops listening and drains (:meth:`stop_all`)."""
        from websockets.asyncio.server import serve

        self.start_background()
        try:
            async with serve(self.handle, self.host, self.port, process_request=self._process_request,
                             max_size=protocol.MAX_MESSAGE_BYTES, ssl=self.ssl_context, compression=None,
                             server_header=None, ping_interval=20, ping_timeout=20, close_timeout=5) as server:
                sockets = list(server.sockets)
                if sockets:
                    self.port = sockets[0].getsockname()[1]
                self.bound.set()
                await stop.wait()
                server.close(close_connections=False)  # the listening socket first: no new connection
                await self.stop_all()
        finally:
            self.stop_background()

    async def _drain_one(self, conn: _Conn) -> None:
        """Ends one stream at the stop: the audio on its way is taken in, then the stream is
        closed (the engine captions what it holds to its end); its handler sends the finals and
        closes with 1001 once the engine is done. The drain's deadline cuts what takes longer."""
        await asyncio.sleep(DRAIN_TAKE_S)
        lease = conn.lease
        if lease is None or lease.state not in ("opening", "open"):
            return
        try:
            await conn.flags.wait(OPENED, self.drain_s)
            await asyncio.to_thread(self.link.close, lease)
        except asyncio.TimeoutError:
            pass


CUT_REASON = "the server is shutting down (its drain time ran out before this stream's audio was captioned)"


def drain_cut_line(cut: int, draining: int, drain_s: float) -> str:
    return (f"drain: {cut} of {draining} stream(s) cut after {drain_s:g} s (--drain-s), the end of their audio "
            "not captioned")


class ServerThread:
    """A :class:`CaptionServer` (or a :class:`~captioner.serve.hub.FrontendHub`) on a loop of its
    own thread (the command, tests, benchmarks): ``start`` returns once it listens, ``stop``
    drains and joins.

    Whether the loop has ended is an event of its own (``_done``), not ``Thread.is_alive()``: a
    ``join`` cut short by Ctrl-C or SIGTERM (the command waits in one) can leave ``is_alive()``
    False while the thread runs on (CPython before 3.13), and ``stop`` then skipped the drain:
    the process ended with every connection cut (1006), no stream committed."""

    def __init__(self, server: CaptionServer) -> None:
        self.server = server
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="captioner-serve-loop", daemon=True)
        self._done = threading.Event()
        self.error: BaseException | None = None

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            await self.server.serve(self._stop)

        try:
            asyncio.run(main())
        except BaseException as error:
            self.error = error
            self.server.bound.set()
        finally:
            self._done.set()

    def start(self, timeout_s: float = 30.0) -> int:
        self._thread.start()
        self.server.bound.wait(timeout_s)
        if self.error is not None:
            raise self.error
        return self.server.port

    @property
    def url(self) -> str:
        return f"{self.server.scheme}://{self.server.host}:{self.server.port}"

    def wait(self, timeout_s: float | None = None) -> bool:
        """Blocks until the server has stopped (or ``timeout_s``); whether it has."""
        return self._done.wait(timeout_s)

    def stop(self, timeout_s: float | None = None) -> None:
        """Drains (each stream captioned to its end, 1001) and joins; safe to call twice.
        ``timeout_s``: how long to wait for that (default: the server's drain time and 30 s)."""
        if timeout_s is None:
            timeout_s = getattr(self.server, "drain_s", protocol.DRAIN_S) + 30.0
        if not self._thread.ident:  # never started
            return
        if self._loop is not None and self._stop is not None and not self._done.is_set():
            try:
                self._loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:  # the loop closed meanwhile: the server has stopped
                pass
        if self._done.wait(timeout_s):
            self._thread.join(1.0)
