"""What one client may hold on a server: connections per client address, and a connection's time
without audio. Both servers use them (the single-process one, and the hub with its front-ends).

Loop thread only.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable

from captioner.serve import protocol


def client_address(peer: str) -> str:
    """The address part of ``host:port`` (:func:`~captioner.serve.protocol.peer`): what one client
    is counted by (its ports change with each connection)."""
    host, _, port = peer.rpartition(":")
    return host if host and port.isdigit() else peer


class ConnectionCounter:
    """Connections open per client address, at most ``limit`` each (``None``: no limit).

    Counted by address, not by token: a server has one token, shared by all its clients, so a cap
    per token would be a cap on the whole server. Behind a proxy every client has the proxy's
    address: raise the limit there, or turn it off (0)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit or None
        self._open: dict[str, int] = {}

    def take(self, peer: str) -> str:
        """Counts a new connection from ``peer``; "" when it may stay, else the one-line reason to
        close it (1013: its own connections that end make room)."""
        key = client_address(peer)
        held = self._open.get(key, 0)
        if self.limit is not None and held >= self.limit:
            return f"too many connections from {key}: {held} open, {self.limit} allowed per client (--max-connections-per-client)"
        self._open[key] = held + 1
        return ""

    def give_back(self, peer: str) -> None:
        """A connection that :meth:`take` counted has ended."""
        key = client_address(peer)
        held = self._open.get(key, 0) - 1
        if held > 0:
            self._open[key] = held
        else:
            self._open.pop(key, None)

    def held(self, peer: str) -> int:
        return self._open.get(client_address(peer), 0)


def idle_reason(timeout_s: float) -> str:
    return f"no audio for {timeout_s:g} s: an idle connection is closed (--idle-timeout-s); connect again to send audio"


async def close_idle(connections: Callable[[], Iterable], timeout_s: float | None) -> None:
    """Forever: each connection of ``connections()`` (objects with ``ws`` and ``last_audio_s``, a
    ``time.monotonic()`` its receiver moves on with each audio message) that has sent no audio for
    ``timeout_s`` is closed with 1001 and says why; its handler then ends its stream as for any
    close. One task for all connections, a look a second: no timer per connection or message.
    ``None`` or 0: never."""
    if not timeout_s:
        return
    period_s = min(1.0, timeout_s / 4)
    reason = idle_reason(timeout_s)
    while True:
        await asyncio.sleep(period_s)
        now_s = time.monotonic()
        for conn in list(connections()):
            if now_s - conn.last_audio_s >= timeout_s:
                conn.last_audio_s = math.inf  # closed once
                asyncio.create_task(conn.ws.close(protocol.CLOSE_GOING_AWAY, reason))
