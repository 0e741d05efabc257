"""One front-end process of ``captioner serve --frontends K``: an asyncio WebSocket server on the
shared host:port (``SO_REUSEPORT``: the kernel spreads the connections over the K processes)
doing every connection's network work, and one channel to the hub (:mod:`captioner.serve.channel`).

What runs here, per connection: the HTTP upgrade, the token check (constant time), the query
parameters, the message-size limit, the message checks, the too-fast-sender check, int16 ->
float32 (once per batch for all connections, one NumPy call), the resampling and framing of each
connection's audio into whole 16 kHz frames (:mod:`captioner.serve.gather`), and sending the
ready, caption and status messages and the close. What the hub decides (a stream admitted or refused, its captions,
when it is over and with which code) arrives as events; the connection is closed as the hub says.
The protocol is the one of the single-process server (docs/protocol.md): a client cannot tell.

Started by :class:`captioner.serve.hub.FrontendHub` as ``python -m captioner.serve.frontend FD
INDEX`` (a fresh interpreter: none of the hub's threads, CUDA context or model). SIGINT and
SIGTERM are ignored: Ctrl-C in a terminal or a service manager's SIGTERM reaches the whole process
group, and the hub, which drains every stream first, tells the front-ends when to stop listening
and when to close. The end of the channel (the hub is gone) closes every connection with 1011 and
ends the process. ``/healthz`` and ``/readyz`` are answered here, the latter from what the hub
last said of its engines.

One thread, the loop's.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import signal
import socket
import sys
import time
from http import HTTPStatus
from urllib.parse import urlsplit

from captioner.engine.messages import Message
from captioner.heap import freeze_start_up
from captioner.serve import channel, protocol
from captioner.serve.bounds import close_idle
from captioner.serve.channel import (
    Admit,
    Caption,
    CaptionsBack,
    ClientEnded,
    ClientGone,
    ClientOpened,
    ClientRefused,
    CloseClient,
    Exit,
    FrontendFrame,
    FrontendLog,
    Listening,
    LoopLate,
    Readiness,
    StartFailed,
    StatusTexts,
    StopListening,
    StreamReady,
)
from captioner.serve.gather import AudioGather
from captioner.serve.loop_lag import LoopLag
from captioner.serve.protocol import (
    ProtocolError,
    close_reason,
    health_response,
    peer,
    send_outbox,
)

MAX_OUTBOX = 10_000
"""Messages waiting for a client that does not read: past this the connection is closed (1008)."""
SHUTDOWN_S = 20.0
"""How long the connections left at ``exit`` may take to send what they hold and close."""
HUB_GONE = (protocol.CLOSE_INTERNAL, "the server's engine process ended")
LATE_REPORT_S = 1.0
"""How often this loop's lateness since the last report goes to the hub (about 100 numbers)."""
STOPPING = (protocol.CLOSE_GOING_AWAY, "the server is shutting down")


class _Conn:
    """One connection on this front-end."""

    __slots__ = ("sid", "ws", "params", "pace", "peer", "outbox", "decision", "closing", "worker", "listed",
                 "last_audio_s")

    def __init__(self, sid: int, ws, params: protocol.StreamParams, max_ahead_s: float, peer: str) -> None:
        loop = asyncio.get_running_loop()
        self.sid = sid
        self.ws = ws
        self.params = params
        self.pace = protocol.Pace(max_ahead_s)
        self.peer = peer
        self.outbox: asyncio.Queue[str | None] = asyncio.Queue()
        self.decision: asyncio.Future = loop.create_future()  # None: admitted; (code, reason): refused
        self.closing: asyncio.Future = loop.create_future()  # (code, reason): the hub ended the stream
        self.worker = -1
        self.listed = False  # the ready message went out: status messages may follow
        self.last_audio_s = math.inf  # when its last audio came (the idle watch), from its admission

    def put(self, text: str) -> None:
        self.outbox.put_nowait(text)
        if self.outbox.qsize() == MAX_OUTBOX + 1:  # once: the close is on its way
            asyncio.create_task(self.ws.close(protocol.CLOSE_POLICY, "the client does not read its captions"))

    def resolve(self, code_reason: tuple[int, str]) -> None:
        if not self.decision.done():
            self.decision.set_result(code_reason)
        if not self.closing.done():
            self.closing.set_result(code_reason)


class FrontEnd:
    """The front-end's server. ``config``: what the hub sent (host, port, token, TLS files,
    max_ahead_s, flush_s); ``writer``/``reader``: the channel to the hub."""

    def __init__(self, index: int, config: dict, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.index = index
        self.host = config["host"]
        self.port = config["port"]
        self.token = config.get("token")
        self.tls_files = config.get("tls_files")
        self.max_ahead_s = config.get("max_ahead_s", protocol.MAX_AHEAD_S)
        self.flush_s = config.get("flush_s", channel.FLUSH_S)
        self.idle_timeout_s = config.get("idle_timeout_s", protocol.IDLE_TIMEOUT_S)
        self.not_ready = ""  # why the hub's engines take no new stream now ("" while they do)
        self._server = None
        self._reader, self._writer = reader, writer
        self.conns: dict[int, _Conn] = {}
        self._sids = itertools.count(1)
        self._events: list[Message] = []
        self._back_ms: list[float] = []  # captions' engine outbox -> this loop, since the last report
        self._audio = AudioGather()
        self.stopping = False
        self._end = STOPPING

    # -- to the hub ----------------------------------------------------------------------------------
    def _event(self, event: Message) -> None:
        self._events.append(event)

    def log(self, line: str) -> None:
        self._events.append(FrontendLog(line))

    def _add_audio(self, conn: _Conn, pcm: bytes, n_samples: int, capture_ns: int) -> None:
        self._audio.add(conn.sid, conn.params.sample_rate_hz, pcm, n_samples, capture_ns)
        if self._audio.bytes_held >= channel.FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        """What was gathered since the last frame, as one frame: every connection's audio in
        whole 16 kHz frames (:class:`AudioGather`), then the events."""
        index, samples = self._audio.take()
        if not self._events and not index:
            return
        frame = FrontendFrame(self._events, index, samples)
        self._events = []
        if not self._writer.is_closing():
            self._writer.write(channel.encode(frame))

    async def _report_measures(self, lag: LoopLag) -> None:
        """Every second, how late this loop woke since the last report, and how long each caption
        took from its engine's outbox to this loop (the hub sums up every front-end's in its last
        line: a caption's way back passes through this loop too)."""
        while True:
            await asyncio.sleep(LATE_REPORT_S)
            if lag.late_ms:
                self._event(LoopLate(list(lag.late_ms)))
                lag.late_ms.clear()
            if self._back_ms:
                self._event(CaptionsBack(self._back_ms))
                self._back_ms = []

    async def _flusher(self) -> None:
        while True:
            await asyncio.sleep(self.flush_s)
            self.flush()
            try:
                await self._writer.drain()
            except ConnectionError:  # the hub is gone: _from_hub ends the process
                return

    # -- from the hub --------------------------------------------------------------------------------
    async def _from_hub(self) -> None:
        """The hub's events until ``exit`` or the end of the channel."""
        while True:
            events = await channel.read_frame(self._reader)
            if events is None:
                self._end = HUB_GONE
                return
            for event in events:
                match event:
                    case Caption(sid=sid, fields=fields, rung_ns=rung_ns):
                        conn = self.conns.get(sid)
                        if conn is not None:
                            conn.put(protocol.caption_message(conn.params.label, fields))
                        if rung_ns:  # the engine's ring for it: 0 when the hub's pump went round unrung
                            self._back_ms.append((time.monotonic_ns() - rung_ns) / 1e6)
                    case StatusTexts(texts=texts):
                        for conn in self.conns.values():
                            text = texts.get(conn.worker) if conn.listed else None
                            if text is not None:
                                conn.put(text)
                    case StreamReady(sid=sid, text=text):
                        conn = self.conns.get(sid)
                        if conn is not None:
                            conn.listed = True
                            conn.put(text)
                    case Admit(sid=sid, worker_index=worker_index):
                        conn = self.conns.get(sid)
                        if conn is not None and not conn.decision.done():
                            conn.worker = worker_index
                            conn.decision.set_result(None)
                    case CloseClient(sid=sid, code=code, reason=reason):
                        conn = self.conns.get(sid)
                        if conn is not None:
                            conn.resolve((code, reason))
                    case Readiness(not_ready=not_ready):
                        self.not_ready = not_ready
                    case StopListening():  # the drain: no new connection; the hub ends the streams
                        self.stopping = True
                        if self._server is not None:
                            self._server.close(close_connections=False)
                    case Exit():
                        self._end = STOPPING
                        return
                    case _:
                        raise TypeError(f"unknown hub message {event!r}")

    # -- handshake -----------------------------------------------------------------------------------
    def _process_request(self, connection, request):
        """Before the upgrade: the health endpoints, a wrong path is 404, a missing or wrong token 401."""
        path = urlsplit(request.path).path
        if path in (protocol.HEALTH_PATH, protocol.READY_PATH):
            return health_response(connection, path, "the server is stopping" if self.stopping else self.not_ready)
        if path != protocol.PATH:
            return connection.respond(HTTPStatus.NOT_FOUND, f"captioner: connect to {protocol.PATH}\n")
        if self.token is not None and not protocol.token_matches(request.headers.get("Authorization"), self.token):
            self._event(ClientRefused())
            self.log(f"refused {peer(connection)}: missing or wrong token")
            response = connection.respond(HTTPStatus.UNAUTHORIZED, "captioner: missing or wrong bearer token\n")
            response.headers["WWW-Authenticate"] = 'Bearer realm="captioner"'
            return response
        return None

    # -- one connection ------------------------------------------------------------------------------
    async def handle(self, ws) -> None:
        """One connection, from its parameters to its close (the hub decides its stream)."""
        try:
            params = protocol.parse_path(ws.request.path)
        except ProtocolError as error:
            self._event(ClientRefused())
            self.log(f"{peer(ws)}: refused {error.code} ({error.reason})")
            await ws.close(error.code, close_reason(error.reason))
            return
        if self.stopping:
            await ws.close(*STOPPING)
            return
        conn = _Conn(next(self._sids), ws, params, self.max_ahead_s, peer(ws))
        self.conns[conn.sid] = conn
        self._event(ClientOpened(conn.sid, params.label, params.language, params.sample_rate_hz, conn.peer,
                                 params.source))
        try:
            refusal = await conn.decision
            if refusal is not None:
                await ws.close(refusal[0], close_reason(refusal[1]))
                return
            await self._serve(conn)
        finally:
            self.conns.pop(conn.sid, None)

    async def _serve(self, conn: _Conn) -> None:
        conn.last_audio_s = time.monotonic()
        sender = asyncio.create_task(self._sender(conn))
        receiver = asyncio.create_task(self._receive(conn))
        code, reason = protocol.CLOSE_NORMAL, ""
        try:
            await asyncio.wait({receiver, conn.closing}, return_when=asyncio.FIRST_COMPLETED)
            if receiver.done():
                try:
                    got_end = receiver.result()
                except ProtocolError as error:
                    got_end, code, reason = False, error.code, error.reason
                # The connection's last partial frame goes in the same frame as its end or its
                # leaving, ahead of it (the hub takes a frame's audio before its events).
                self._audio.end(conn.sid, time.monotonic_ns())
                if got_end:
                    self._event(ClientEnded(conn.sid))
                    code, reason = await conn.closing
                else:
                    if code == protocol.CLOSE_NORMAL:
                        code = None  # the client went away: nothing to send
                    self._event(ClientGone(conn.sid, code, reason))
            else:
                receiver.cancel()
                code, reason = conn.closing.result()
        except asyncio.CancelledError:
            code, reason = STOPPING
            raise
        finally:
            if not receiver.done():
                receiver.cancel()
            self._audio.end(conn.sid, time.monotonic_ns())  # any other way out: its ingest is let go
            conn.outbox.put_nowait(None)
            if code not in (None, protocol.CLOSE_NORMAL, protocol.CLOSE_GOING_AWAY):
                sender.cancel()  # a refused client gets its code now, not its captions
            try:
                await asyncio.wait_for(sender, 30.0)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                pass
            if code is not None:
                await conn.ws.close(code, close_reason(reason))

    async def _receive(self, conn: _Conn) -> bool:
        """The client's messages until ``end`` (True) or until it closes (False); raises
        :class:`ProtocolError` for a message the protocol does not allow."""
        from websockets.exceptions import ConnectionClosed

        rate = conn.params.sample_rate_hz
        try:
            async for message in conn.ws:
                n_samples = protocol.check_audio(message)
                if n_samples < 0:
                    conn.last_audio_s = math.inf  # its audio is over: waiting for its finals is not idling
                    return True
                now_ns = time.monotonic_ns()
                conn.pace.add(n_samples / rate, now_ns / 1e9)
                if n_samples:
                    conn.last_audio_s = now_ns / 1e9
                    self._add_audio(conn, message, n_samples, now_ns)
        except ConnectionClosed as closed:
            # This front-end's own close (too big, idle, not reading, a keepalive ping unanswered)
            # is said as such, not as the client's leaving.
            by_server = protocol.closed_by_server(closed)
            if by_server is not None:
                raise by_server from None
        by_server = protocol.ended_by_server(conn.ws)
        if by_server is not None:
            raise by_server
        return False

    @staticmethod
    async def _sender(conn: _Conn) -> None:
        await send_outbox(conn.ws, conn.outbox)

    # -- running -------------------------------------------------------------------------------------
    async def run(self) -> None:
        from websockets.asyncio.server import serve

        try:
            server = await serve(self.handle, self.host, self.port, reuse_port=True,
                                 process_request=self._process_request, max_size=protocol.MAX_MESSAGE_BYTES,
                                 ssl=_tls_context(self.tls_files), compression=None, server_header=None,
                                 ping_interval=20, ping_timeout=20, close_timeout=5)
        except OSError as error:
            self._event(StartFailed(f"cannot listen on {self.host}:{self.port}: {error.strerror or error}"))
            self.flush()
            await self._writer.drain()
            return
        # What start-up made lives as long as the process: no later full collection walks it
        # (unfrozen, a front-end's full collection at a thousand connections held every caption
        # of its connections meanwhile; benchmarks/results/serve/HISTORY.md, "The hub hands out caption
        # values").
        freeze_start_up()
        self._server = server
        self._event(Listening(server.sockets[0].getsockname()[1] if server.sockets else self.port))
        self.flush()
        flusher = asyncio.create_task(self._flusher())
        lag = LoopLag(kept=10_000)
        watchers = [asyncio.create_task(lag.watch()), asyncio.create_task(self._report_measures(lag)),
                    asyncio.create_task(close_idle(lambda: () if self.stopping else self.conns.values(),
                                                   self.idle_timeout_s))]  # none while the hub drains
        try:
            await self._from_hub()
        finally:
            for watcher in watchers:
                watcher.cancel()
            self.stopping = True
            server.close(close_connections=False)  # no new connection; each one left ends below
            for conn in list(self.conns.values()):
                conn.resolve(self._end)
            try:
                await asyncio.wait_for(server.wait_closed(), SHUTDOWN_S)
            except asyncio.TimeoutError:
                pass
            flusher.cancel()
            self.flush()
            if not self._writer.is_closing():
                try:
                    await asyncio.wait_for(self._writer.drain(), 5.0)
                except (asyncio.TimeoutError, ConnectionError):
                    pass
                self._writer.close()


def _tls_context(files):
    if not files:
        return None
    from captioner.serve.tls import server_tls_context

    return server_tls_context(files[0], files[1])


async def _main(fd: int, index: int) -> None:
    sock = socket.socket(fileno=fd)
    reader, writer = await channel.open_channel(sock)
    config = await channel.read_frame(reader)
    if config is None:
        return
    await FrontEnd(index, config, reader, writer).run()


def main(argv: list[str] | None = None) -> None:
    """``python -m captioner.serve.frontend FD INDEX``: the process's entry."""
    fd, index = (sys.argv[1:3] if argv is None else argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        asyncio.run(_main(int(fd), int(index)))
    except KeyboardInterrupt:
        pass
    os._exit(0)  # nothing left to flush: the channel was drained above


if __name__ == "__main__":
    main()
