"""libpulse's poll with a deadline: a question to a PulseAudio server that ends by itself.

pulsectl's calls wait in libpulse's main loop for as long as the server takes, and a thread
waiting there cannot be stopped from outside. A server that accepts a connection and then
answers nothing (frozen, wedged) would keep that thread for good. Given as the main loop's poll
function, :class:`DeadlinePoll` waits no later than the deadline and then reports our sockets
hung up, as a server gone: libpulse fails the connection, and every pulsectl wait returns.

It also turns ``POLLNVAL`` (an fd closed under libpulse) into a hang-up: libpulse does not read
``POLLNVAL`` as an error, so its loop would go round at full speed on an fd that is gone.
"""

from __future__ import annotations

import os
import select
import stat
import time
from collections.abc import Sequence
from typing import Any

HANG_UP = select.POLLHUP | select.POLLERR


def _is_socket(fd: int) -> bool:
    """The connection's sockets, not the main loop's own wake-up pipe or eventfd."""
    try:
        return stat.S_ISSOCK(os.fstat(fd).st_mode)
    except OSError:
        return True  # an fd closed under libpulse: hung up too


def _hang_up(pollfds: Sequence[Any]) -> int:
    hung = 0
    for pollfd in pollfds:
        pollfd.revents = HANG_UP if _is_socket(pollfd.fd) else 0
        hung += bool(pollfd.revents)
    return hung


class DeadlinePoll:
    """A pulsectl poll function (``Pulse.set_poll_func``) that waits no later than
    ``deadline_s`` (``time.monotonic()``), then hangs the connection up (:attr:`hung_up`)."""

    def __init__(self, deadline_s: float) -> None:
        self.deadline_s = deadline_s
        self.hung_up = False
        """Whether the deadline came before the exchange ended: the server did not answer."""

    def __call__(self, pollfds: Sequence[Any], timeout_s: float) -> int:
        remaining_s = self.deadline_s - time.monotonic()
        if remaining_s <= 0:
            hung = _hang_up(pollfds)
            if hung:
                self.hung_up = True
                return hung
            remaining_s = 0.0  # nothing of ours left open: only the loop's own fds
        # libpulse passes -1 ms (pulsectl: -0.001 s) for "no timeout".
        wait_s = remaining_s if timeout_s < 0 else min(timeout_s, remaining_s)
        poller = select.poll()
        for pollfd in pollfds:
            poller.register(pollfd.fd, pollfd.events)
        ready: dict[int, int] = {}
        for fd, events in poller.poll(wait_s * 1000.0):
            ready[fd] = ready.get(fd, 0) | events
        count = 0
        for pollfd in pollfds:
            events = ready.get(pollfd.fd, 0) & (pollfd.events | HANG_UP | select.POLLNVAL)
            if events & select.POLLNVAL:
                events = HANG_UP
            pollfd.revents = events
            count += bool(events)
        return count
