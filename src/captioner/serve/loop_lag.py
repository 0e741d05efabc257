"""How late an asyncio loop runs what it was asked to run.

Everything a server's loop does (each front-end's audio frames, the pump's captions, a task per
stream, the status messages) waits for whatever the loop is busy with, and for the interpreter
lock the engine's threads hold. A task that asks to wake every 10 ms and notes how late it woke
measures that wait directly, whatever its cause: at p99 it says how much of a caption's way back
the loop alone can account for (docs/serve.md). The same measure serves a load test's clients,
whose own lateness would otherwise count as the server's.
"""

from __future__ import annotations

import asyncio
from collections import deque

import numpy as np

PERIOD_S = 0.01
KEPT = 100_000  # the last ~17 minutes at one wake every 10 ms


class LoopLag:
    """Run :meth:`watch` as a task on the loop to be measured; read :meth:`quantiles_ms`."""

    def __init__(self, period_s: float = PERIOD_S, kept: int = KEPT) -> None:
        self.period_s = period_s
        self.late_ms: deque[float] = deque(maxlen=kept)

    async def watch(self) -> None:
        """Loop thread, until cancelled: wakes every ``period_s``, noting by how much each wake
        came after the time it asked for."""
        loop = asyncio.get_running_loop()
        while True:
            due_s = loop.time() + self.period_s
            await asyncio.sleep(self.period_s)
            self.late_ms.append(max(0.0, (loop.time() - due_s) * 1e3))

    def quantiles_ms(self) -> tuple[float, float, float] | None:
        """p50, p99 and the largest lateness noted, in ms; ``None`` before the first wake."""
        return lateness_quantiles_ms(list(self.late_ms))


def lateness_quantiles_ms(late_ms: list[float]) -> tuple[float, float, float] | None:
    """p50, p99 and max of lateness samples (ms), rounded to 0.1 ms; ``None`` for none."""
    if not late_ms:
        return None
    p50, p99 = np.percentile(late_ms, [50, 99])
    return round(float(p50), 1), round(float(p99), 1), round(float(max(late_ms)), 1)
