"""A served stream's flags: waits that end when any named flag goes up, with timeouts and
cancellation, and no objects held while nobody waits."""

import asyncio
import gc

import pytest

from captioner.serve.stream_flags import END_ASKED, ENDED, GONE, OPENED, StreamFlags


def test_a_wait_ends_when_any_flag_it_names_goes_up_and_not_before():
    async def run():
        flags = StreamFlags()
        waiting = asyncio.ensure_future(flags.wait(END_ASKED | GONE | ENDED))
        flags.raise_flag(OPENED)  # not one it names
        await asyncio.sleep(0.01)
        assert not waiting.done()
        flags.raise_flag(GONE)
        await asyncio.wait_for(waiting, 1.0)
        assert flags.is_up(GONE) and flags.is_up(OPENED) and not flags.is_up(END_ASKED | ENDED)
        await flags.wait(OPENED)  # up already: returns at once
        assert flags.when(GONE).done()

    asyncio.run(run())


def test_two_waits_on_different_flags_end_each_at_its_own():
    async def run():
        flags = StreamFlags()
        opened = asyncio.ensure_future(flags.wait(OPENED))
        ended = asyncio.ensure_future(flags.wait(ENDED))
        await asyncio.sleep(0)
        flags.raise_flag(OPENED)
        await asyncio.sleep(0.01)
        assert opened.done() and not ended.done()
        flags.raise_flag(ENDED)
        await asyncio.wait_for(ended, 1.0)

    asyncio.run(run())


def test_a_wait_times_out_and_a_cancelled_one_is_dropped():
    async def run():
        flags = StreamFlags()
        with pytest.raises(asyncio.TimeoutError):
            await flags.wait(OPENED, 0.05)
        given_up = flags.when(ENDED)
        given_up.cancel()
        flags.raise_flag(OPENED | ENDED)  # skips the timed-out and the cancelled futures
        assert flags._waiters is None

    asyncio.run(run())


def test_a_cancelled_task_gives_up_its_wait():
    async def run():
        flags = StreamFlags()
        task = asyncio.ensure_future(flags.wait(END_ASKED))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        flags.raise_flag(END_ASKED)  # no error setting a cancelled future's result
        assert flags._waiters is None

    asyncio.run(run())


def test_a_thousand_waiting_streams_hold_a_few_objects_each():
    """What each connection's wait leaves for every full collection of the serving process to
    walk: the three-event ``asyncio.wait`` it replaces held some 50 tracked objects."""
    n_streams = 1000

    async def waiter(flags: StreamFlags) -> None:
        await flags.wait(END_ASKED | GONE | ENDED)

    async def run() -> float:
        gc.collect()
        before = len(gc.get_objects())
        streams = [StreamFlags() for _ in range(n_streams)]
        tasks = [asyncio.ensure_future(waiter(flags)) for flags in streams]
        await asyncio.sleep(0.01)
        gc.collect()
        per_stream = (len(gc.get_objects()) - before) / n_streams
        for flags in streams:
            flags.raise_flag(GONE)
        await asyncio.gather(*tasks)
        return per_stream

    per_stream = asyncio.run(run())
    assert per_stream <= 15, per_stream  # 11 here: the flags, the task, its future and their links


def test_a_lease_state_raises_opened_past_opening_and_ended_at_its_end():
    flags = StreamFlags()
    flags.follow_lease("opening")
    assert not flags.is_up(OPENED | ENDED)
    flags.follow_lease("open")
    assert flags.is_up(OPENED) and not flags.is_up(ENDED)
    for state in ("done", "refused", "failed"):
        ended = StreamFlags()
        ended.follow_lease(state)  # refused before it opened: opened too, so no wait hangs
        assert ended.is_up(OPENED) and ended.is_up(ENDED)
