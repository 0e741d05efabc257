"""captioner.serve.loop_lag: how late a loop runs its work (the serving loop's share of a
caption's way back, and a load test's clients' own)."""

from __future__ import annotations

import asyncio
import time

from captioner.serve.loop_lag import LoopLag, lateness_quantiles_ms


def test_a_loop_held_busy_is_seen_late_by_as_long_as_it_was_held():
    lag = LoopLag(period_s=0.005)

    async def run() -> None:
        watcher = asyncio.create_task(lag.watch())
        await asyncio.sleep(0.05)  # a few wakes on time
        time.sleep(0.08)  # the loop held, as a long callback holds it
        await asyncio.sleep(0.05)
        watcher.cancel()

    asyncio.run(run())
    p50, p99, largest = lag.quantiles_ms()
    assert 70.0 <= largest < 1000.0  # the held wake, late by about the 80 ms it was held
    assert p50 < 20.0  # most wakes came on time
    assert p50 <= p99 <= largest


def test_no_wake_yet_means_no_figures():
    assert LoopLag().quantiles_ms() is None
    assert lateness_quantiles_ms([]) is None
    assert lateness_quantiles_ms([1.0, 2.0, 3.0]) == (2.0, 3.0, 3.0)
