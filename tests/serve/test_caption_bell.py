"""Captions leave the server as soon as an engine has them: the pipeline rings the server loop's
:class:`~captioner.serve.engine_link.CaptionBell` instead of the pump finding them on its next
20 ms round (benchmarks/results/serve/HISTORY.md, "Three engines on one GPU with MPS")."""

from __future__ import annotations

import asyncio
import threading
import time

from captioner.engine.pipeline import Pipeline
from captioner.events import CaptionUpdate
from captioner.serve.engine_link import CaptionBell, EngineLink

WAIT_S = 30.0
"""A wait no ring should need: if it ran out, the bell did not wake the loop."""


def test_a_ring_from_another_thread_wakes_the_loop():
    async def scenario() -> float:
        bell = CaptionBell(asyncio.get_running_loop())
        threading.Timer(0.05, bell.ring).start()
        started = time.monotonic()
        await bell.wait(WAIT_S)
        return time.monotonic() - started

    assert asyncio.run(scenario()) < WAIT_S / 2


def test_rings_before_a_look_wake_once_and_a_ring_after_it_wakes_again():
    async def scenario() -> list[bool]:
        bell = CaptionBell(asyncio.get_running_loop())
        woken = []

        async def waited(timeout_s: float) -> bool:
            started = time.monotonic()
            await bell.wait(timeout_s)
            return time.monotonic() - started < timeout_s

        bell.ring()
        bell.ring()  # the engines step faster than the loop looks: one wake for both
        woken.append(await waited(WAIT_S))
        woken.append(await waited(0.2))  # nothing rang since: the round's timeout
        threading.Thread(target=bell.ring).start()
        woken.append(await waited(WAIT_S))
        return woken

    assert asyncio.run(scenario()) == [True, False, True]


def test_a_ring_after_the_loop_closed_is_quiet():
    loop = asyncio.new_event_loop()
    bell = CaptionBell(loop)
    loop.close()
    bell.ring()  # a last engine step while the server shuts down: nothing raised


def test_the_engines_pipeline_rings_when_captions_reach_its_outbox():
    link = EngineLink(["cpu", "cpu"], lambda device: Pipeline([], model="tiny.en", device=device))
    rings = []
    link.ring_on_captions(lambda: rings.append(threading.current_thread().name))
    update = CaptionUpdate("s1", "partial", "and so my fellow", 0.0, 1.5, 1.5, 1.8)
    first, second = (worker.pipeline for worker in link.workers)
    delivered = threading.Thread(target=first._deliver, args=([update],), name="engine-worker")
    delivered.start()
    delivered.join()
    assert rings == ["engine-worker"]
    assert first.drain_captions() == [update] and second.drain_captions() == []
    second._deliver([])  # a step with nothing to say rings nobody
    assert rings == ["engine-worker"]


def test_a_wait_says_when_the_ring_it_heard_came():
    """The pump dates the captions it drains by the ring that woke it (the way back's measure
    from the engine's outbox); a wait that ran out dates nothing."""
    async def scenario() -> tuple[int, int, int, int]:
        bell = CaptionBell(asyncio.get_running_loop())
        before_ns = time.monotonic_ns()
        bell.ring()
        await asyncio.sleep(0.05)
        bell.ring()  # the second ring of the same batch: the first one dates it
        await bell.wait(WAIT_S)
        heard_ns, after_ns = bell.heard_ns, time.monotonic_ns()
        await bell.wait(0.05)  # nothing rang
        return before_ns, heard_ns, after_ns, bell.heard_ns

    before_ns, heard_ns, after_ns, unrung = asyncio.run(scenario())
    assert before_ns <= heard_ns <= before_ns + 40_000_000 < after_ns
    assert unrung == 0
