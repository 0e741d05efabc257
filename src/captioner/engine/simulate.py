"""Replays audio through the engine on a simulated clock, in one thread.

The sources are real-time :class:`~captioner.audio.file_source.FileSource` replays whose clock
is a :class:`SimClock`; the engine reads the same clock. Each loop advances the clock by one
tick, hands the engine whatever audio is due, and lets it run a step. What a model step costs
on the clock is chosen:

- ``compute="free"`` (or a number of seconds per step): the clock does not depend on the
  machine, so the captions are the same on every run — the mode for tests;
- ``compute="measured"``: the clock advances by the step's real duration, so audio keeps
  arriving while the model works, as in a live session, but idle waiting costs no wall time —
  the mode for latency measurements faster than real time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from captioner.events import NS_PER_S, CaptionUpdate



class SimClock:
    def __init__(self, start_ns: int = 1_000 * NS_PER_S) -> None:
        self.now_ns = int(start_ns)

    def __call__(self) -> int:
        return self.now_ns

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        self.now_ns += max(0, int(round(seconds * NS_PER_S)))


@dataclass
class ReplayResult:
    updates: list[CaptionUpdate] = field(default_factory=list)
    steps: int = 0
    step_s: list[float] = field(default_factory=list)
    """Real duration of every model step (whatever the clock mode)."""
    audio_s: float = 0.0
    statuses: list = field(default_factory=list)


class _ChargedRecognizer:
    """The engine's recognizer, with each step's cost charged to the simulated clock while the
    step runs (so the engine dates its updates after the work, as in a live session)."""

    def __init__(self, inner, clock: SimClock, compute) -> None:
        self._inner = inner
        self._clock = clock
        self._compute = compute

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def decode(self, requests):
        t0 = time.perf_counter()
        out = self._inner.decode(requests)
        cost_s = time.perf_counter() - t0 if self._compute == "measured" else float(self._compute)
        self._clock.advance(cost_s)
        return out


def replay(
    make_engine: Callable[[SimClock, Callable[[], int]], object],
    make_sources: Callable[[SimClock], list],
    compute: str | float = "free",
    tick_s: float = 0.01,
    tail_s: float = 1.0,
) -> ReplayResult:
    """Run sources (made on the sim clock) through an engine (made on the same clock) to the
    end (plus ``tail_s`` of clock), then finish: pending text is committed."""
    clock = SimClock()
    engine = make_engine(clock, time.perf_counter_ns if compute == "measured" else clock)
    if compute != "free":
        engine.recognizer = _ChargedRecognizer(engine.recognizer, clock, compute)
    sources = make_sources(clock)
    for source in sources:
        engine.add_stream(source.stream)
        source.start()
    result = ReplayResult()
    tail_left = tail_s
    next_status_ns = clock() + NS_PER_S
    while True:
        clock.advance(tick_s)
        blocks = []
        for source in sources:
            blocks += source.read(0.0)
        if blocks:
            engine.push(blocks)
            result.audio_s = max(result.audio_s, max(b.end_s for b in blocks))
        t0 = time.perf_counter()
        steps_before = engine.steps
        updates = engine.tick()
        spent_s = time.perf_counter() - t0
        if engine.steps != steps_before:
            result.steps += 1
            result.step_s.append(spent_s)
        result.updates += updates
        if clock() >= next_status_ns:
            result.statuses.append(engine.status())
            next_status_ns = clock() + NS_PER_S
        if all(s.exhausted for s in sources):
            tail_left -= tick_s
            if tail_left <= 0:
                break
    result.updates += engine.finish()
    for source in sources:
        source.stop()
    return result
