"""``captioner serve``: an asyncio WebSocket server in front of the engine (docs/protocol.md).

Each connection is one stream. The loop thread only moves bytes and JSON: it checks each
message, hands audio to the engine's inbox without waiting (:class:`~captioner.serve.engine_link.NetworkSource`),
and sends each connection what its outbox holds. The model work runs on each device's worker
thread; what may block (opening or closing a stream while the inbox is full) runs on helper
threads (``asyncio.to_thread``). A bad client is closed with its own code and reason; nothing it
sends reaches another connection's stream.

Tasks on the loop: one handler and one sender per connection; the pump (captions and stream
states from the engine, every 20 ms); the status task (one ``status`` message a second to each
connection, from its device's engine status and GPU telemetry).
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import queue
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from urllib.parse import urlsplit

from captioner.errors import StreamRefused, UserError, one_line
from captioner.serve import protocol
from captioner.serve.engine_link import (
    CaptionBell,
    EngineLink,
    Lease,
    export_metrics,
    relabelled,
    status_fields,
)
from captioner.serve.loop_lag import LoopLag
from captioner.serve.protocol import ProtocolError, close_reason, peer, send_outbox
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
SHUTDOWN_S = 15.0


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

    __slots__ = ("id", "ws", "params", "lease", "outbox", "flags", "pace", "peer", "ready")

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

    def lease_changed(self, lease: Lease) -> None:
        """Loop thread (from the pump)."""
        if lease.state == "open" and self.ready:
            self.outbox.put_nowait(self.ready)  # before any caption or status: the pump queues those after
        self.flags.follow_lease(lease.state)


class _TranscriptThread(threading.Thread):
    """``--transcripts DIR``: each connection's committed lines, appended by a writer the command
    makes (``make_writer(title)``, e.g. the app's fsync'ing TranscriptWriter), off the loop."""

    def __init__(self, make_writer: Callable[[str], object]) -> None:
        super().__init__(name="captioner-serve-transcripts", daemon=True)
        self._make_writer = make_writer
        self.items: queue.Queue = queue.Queue()
        self._writers: dict[int, object] = {}
        self.error = ""

    def run(self) -> None:
        while True:
            item = self.items.get()
            if item is None:
                break
            conn_id, title, update = item
            try:
                writer = self._writers.get(conn_id)
                if writer is None:
                    writer = self._writers[conn_id] = self._make_writer(title)
                if update is None:
                    self._writers.pop(conn_id).close()
                else:
                    writer.write(update)
            except Exception as error:  # a full disk must not stop the captions
                self.error = one_line(error)
        for writer in self._writers.values():
            writer.close()


class CaptionServer:
    """The WebSocket server. ``link``: the started engines. ``token``: the bearer token clients
    must send (``None``: none needed, only allowed on a loopback address). ``ssl_context``:
    TLS. ``transcripts``: ``title -> writer`` for ``--transcripts`` (``None``: nothing is written).
    ``metrics``: an object with ``observe_caption``, ``update_status`` and ``update_telemetry``
    (the app's Prometheus exporter). ``log``: one line per event (a connection opened, refused,
    closed); never audio or caption text."""

    def __init__(self, link: EngineLink, host: str = "127.0.0.1", port: int = 8765, *, token: str | None = None,
                 ssl_context=None, max_ahead_s: float = protocol.MAX_AHEAD_S,
                 transcripts: Callable[[str], object] | None = None, metrics=None,
                 status_period_s: float = protocol.STATUS_PERIOD_S,
                 log: Callable[[str], None] = lambda line: None) -> None:
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
        self.log = log
        self._transcripts = _TranscriptThread(transcripts) if transcripts is not None else None
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
    def _process_request(self, connection, request):
        """Before the upgrade: a wrong path is 404, a missing or wrong token 401 (no WebSocket
        is opened, so nothing of the server is reachable without the token)."""
        if urlsplit(request.path).path != protocol.PATH:
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
        try:
            params = protocol.parse_path(ws.request.path)
        except ProtocolError as error:
            self.counts["refused"] += 1
            await ws.close(error.code, close_reason(error.reason))
            return
        if self._stopping:
            await ws.close(protocol.CLOSE_GOING_AWAY, "the server is shutting down")
            return
        conn = _Conn(next(self._ids), ws, params, self.max_ahead_s)
        conn.peer = peer(ws)
        try:
            lease = await asyncio.to_thread(self.link.open, params.label, params.language, params.sample_rate_hz,
                                            conn.lease_changed)
        except StreamRefused as error:
            self.counts["refused"] += 1
            self.log(f"#{conn.id} {conn.peer}: refused at capacity: {one_line(error)}")
            await ws.close(protocol.CLOSE_TRY_LATER, close_reason(str(error)))
            return
        except UserError as error:  # a language the model lacks
            self.counts["refused"] += 1
            await ws.close(protocol.CLOSE_POLICY, close_reason(str(error)))
            return
        conn.lease = lease
        self._conns[conn.id] = conn
        self._by_lease[lease.key] = conn
        self.counts["accepted"] += 1
        self.log(f"#{conn.id} {conn.peer}: open ({params.sample_rate_hz} Hz, {lease.worker.device or 'auto'})")
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
                    return True
                now_ns = time.monotonic_ns()  # one clock read for the pace and the chunk's capture time
                conn.pace.add(n_samples / rate, now_ns / 1e9)
                if n_samples:
                    lease.push(message, now_ns)
        except ConnectionClosed as closed:
            rcvd = closed.rcvd
            if rcvd is not None and rcvd.code == protocol.CLOSE_TOO_BIG:
                raise ProtocolError(protocol.CLOSE_TOO_BIG, rcvd.reason) from None
            sent = closed.sent
            if sent is not None and sent.code == protocol.CLOSE_TOO_BIG:
                raise ProtocolError(protocol.CLOSE_TOO_BIG, sent.reason) from None
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
                self._transcripts.items.put((conn.id, "", None))

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
                    self._transcripts.items.put((conn.id, f"{conn.params.label} via {conn.peer}",
                                                 relabelled(update, conn.params.label)))
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
                       asyncio.create_task(self.loop_lag.watch(), name="captioner-serve-loop-lag")]

    def stop_background(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._tasks = []
        if self._transcripts is not None and self._transcripts.is_alive():
            self._transcripts.items.put(None)
            self._transcripts.join(10)

    async def stop_all(self) -> None:
        """Every open stream is committed, its finals sent, its connection closed with 1001."""
        self._stopping = True
        await self._drain_on_stop()

    async def serve(self, stop: asyncio.Event) -> None:
        """Serves until ``stop`` is set; then every open stream is committed, its finals sent and
        its connection closed with 1001."""
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
                await self.stop_all()
                server.close(close_connections=False)
        finally:
            self.stop_background()

    async def _drain_on_stop(self) -> None:
        """Every open stream is committed and its finals sent before its connection closes."""
        conns = list(self._conns.values())
        for conn in conns:
            if conn.lease is not None and conn.lease.state in ("opening", "open"):
                asyncio.create_task(self._shutdown_one(conn))
        deadline = time.monotonic() + SHUTDOWN_S
        while self._conns and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def _shutdown_one(self, conn: _Conn) -> None:
        """Commits the stream; its handler sends the finals and closes with 1001 once it is done."""
        try:
            await conn.flags.wait(OPENED, SHUTDOWN_S)
            await asyncio.to_thread(self.link.close, conn.lease)
        except asyncio.TimeoutError:
            await conn.ws.close(protocol.CLOSE_GOING_AWAY, "the server is shutting down")


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

    def stop(self, timeout_s: float = 30.0) -> None:
        """Drains (each stream committed, 1001) and joins; safe to call twice."""
        if not self._thread.ident:  # never started
            return
        if self._loop is not None and self._stop is not None and not self._done.is_set():
            try:
                self._loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:  # the loop closed meanwhile: the server has stopped
                pass
        if self._done.wait(timeout_s):
            self._thread.join(1.0)
