"""What has happened to one served stream, as flags a coroutine can wait on.

Each connection's task waits until its stream is opened, ended, asked to end or gone. With one
``asyncio.Event`` per condition and a task per wait (``asyncio.wait`` on three events), a
connection held dozens of objects the cyclic garbage collector walks (the events' waiter deques,
the tasks, their coroutines, contexts and futures), walked by every full collection of the
serving process with every engine thread stopped (benchmarks/results/serve/HISTORY.md, "What
each connection leaves"). Here a stream's flags are one integer, and a wait is one future, made
only while someone waits.

Loop thread only, like the events they replace.
"""

from __future__ import annotations

import asyncio

from captioner.serve.engine_link import ENDED_STATES

OPENED = 1
"""The engine listed the stream (or it ended first)."""
ENDED = 2
"""Done, refused or failed."""
END_ASKED = 4
"""The client sent ``end``."""
GONE = 8
"""The connection is over without ``end`` (or its front-end died)."""


class StreamFlags:
    """Flags that only go up (``raise_flag``) and futures that resolve once any of the flags
    they name is up (``when``)."""

    __slots__ = ("_up", "_waiters")

    def __init__(self) -> None:
        self._up = 0
        self._waiters: list[tuple[int, asyncio.Future]] | None = None  # only while something waits

    def is_up(self, flags: int) -> bool:
        """Whether any of ``flags`` (OR-ed together) is up."""
        return bool(self._up & flags)

    def raise_flag(self, flag: int) -> None:
        self._up |= flag
        if self._waiters is None:
            return
        waiting = []
        for flags, future in self._waiters:
            if future.done():  # cancelled: its wait timed out or was given up
                continue
            if flags & self._up:
                future.set_result(None)
            else:
                waiting.append((flags, future))
        self._waiters = waiting or None

    def follow_lease(self, state: str) -> None:
        """The lease's new state (the pump's callback, both servers): OPENED once it is past
        opening, ENDED once it is done, refused or failed."""
        if state != "opening":
            self.raise_flag(OPENED)
        if state in ENDED_STATES:
            self.raise_flag(ENDED)

    def when(self, flags: int) -> asyncio.Future:
        """A future of the running loop, done once any of ``flags`` is up (done already if one
        is). Cancelling it gives up that wait only."""
        future = asyncio.get_running_loop().create_future()
        if self._up & flags:
            future.set_result(None)
        else:
            if self._waiters is None:
                self._waiters = []
            self._waiters.append((flags, future))
        return future

    async def wait(self, flags: int, timeout_s: float | None = None) -> None:
        """Until any of ``flags`` is up; ``asyncio.TimeoutError`` after ``timeout_s``."""
        if self._up & flags:
            return
        if timeout_s is None:  # the connection's long wait: no timer, no coroutine of wait_for's
            await self.when(flags)
        else:
            await asyncio.wait_for(self.when(flags), timeout_s)
