"""Replays audio through the engine on a simulated clock, in one thread.

Audio goes in through the public API (:class:`~captioner.engine.live.LiveCaptioner`) as a live
session's would, but on a :class:`SimClock` that the engine reads too: each loop advances the
clock by one tick, hands every stream the audio that became due, and steps the captioner. What a model step costs
on the clock is chosen:

- ``compute="free"`` (or a number of seconds per step): the clock does not depend on the
  machine, so the captions are the same on every run — the mode for tests;
- ``compute="measured"``: the clock advances by the step's real duration, so audio keeps
  arriving while the model works, as in a live session, but idle waiting costs no wall time —
  the mode for latency measurements faster than real time;
- a function of the batch size (``compute=lambda n: 0.05 + 0.01 * n``): a modelled device, so
  that tests of admission and scheduling under load see steps that grow with the batch.

:class:`ChargedRecognizer` is the piece that charges a step to the clock; the capacity benchmark
(benchmarks/bench_capacity.py) wraps the engine's models in it too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from captioner.engine.live import LiveCaptioner
from captioner.events import NS_PER_S, SAMPLE_RATE_HZ, CaptionUpdate


class SimClock:
    def __init__(self, start_ns: int = 1_000 * NS_PER_S) -> None:
        self.now_ns = int(start_ns)

    def __call__(self) -> int:
        return self.now_ns

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        self.now_ns += max(0, int(round(seconds * NS_PER_S)))


Compute = str | float | Callable[[int], float]
"""``"free"``, ``"measured"``, seconds per step, or seconds for a batch of ``n`` windows."""


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One batched model call as :class:`ChargedRecognizer` saw it."""

    model: str
    batch: int
    wall_s: float
    """Real duration of the call."""
    cpu_s: float
    """CPU time of the whole process during the call (every thread: ONNX Runtime's too)."""
    charged_s: float
    """What the simulated clock advanced by."""


@dataclass
class ReplayResult:
    updates: list[CaptionUpdate] = field(default_factory=list)
    steps: int = 0
    step_s: list[float] = field(default_factory=list)
    """Real duration of every model step (whatever the clock mode)."""
    audio_s: float = 0.0
    statuses: list = field(default_factory=list)


class ChargedRecognizer:
    """A recognizer with each step's cost charged to the simulated clock while the step runs
    (so the engine dates its updates after the work, as in a live session). ``records`` keeps
    every call when given a list. Called by the engine's thread."""

    def __init__(self, inner, clock: SimClock, compute: Compute, records: list[StepRecord] | None = None) -> None:
        self._inner = inner
        self._clock = clock
        self._compute = compute
        self.records = records

    def __getattr__(self, name):
        value = getattr(self._inner, name)
        if name == "decode_pending":
            # Charged like decode; the reading it puts off is charged where it is done (inside a
            # later step, or as the engine's host work).
            return lambda requests, **kwargs: self._charged(value, requests, kwargs)
        return value

    def decode(self, requests, **kwargs):
        return self._charged(self._inner.decode, requests, kwargs)

    def _charged(self, run, requests, kwargs):
        t0 = time.perf_counter()
        c0 = time.process_time()
        out = run(requests, **kwargs)  # e.g. while_encoding: its host work is charged too
        wall_s = time.perf_counter() - t0
        if self._compute == "measured":
            cost_s = wall_s
        elif callable(self._compute):
            cost_s = float(self._compute(len(requests)))
        else:
            cost_s = float(self._compute)
        self._clock.advance(cost_s)
        if self.records is not None:
            self.records.append(StepRecord(self._inner.name, len(requests), wall_s, time.process_time() - c0, cost_s))
        return out



def replay(
    make_captioner: Callable[[SimClock, Callable[[], int]], LiveCaptioner],
    audio: dict[str, object],
    compute: Compute = "free",
    tick_s: float = 0.01,
    on_updates: Callable[[list[CaptionUpdate]], None] | None = None,
) -> ReplayResult:
    """Replay ``audio`` (stream label -> a file path or 16 kHz float32 samples) through a
    captioner made on the simulated clock (``make_captioner(clock, timer_ns)``), as a live
    session would see it: every tick the clock advances by ``tick_s``, each stream gets the
    audio that became due and the captioner steps. At the end every stream is finished, so
    what is pending is committed. ``on_updates`` (optional) gets each step's updates as they
    are made (``captioner transcribe --realtime --clock simulated`` prints them)."""
    from captioner.audio.file_source import read_audio_16k

    clock = SimClock()
    live = make_captioner(clock, time.perf_counter_ns if compute == "measured" else clock)
    if compute != "free":
        live.engine.recognizer = ChargedRecognizer(live.engine.recognizer, clock, compute)
        if live.engine.light_recognizer is not None:
            live.engine.light_recognizer = ChargedRecognizer(live.engine.light_recognizer, clock, compute)
    samples = {label: (np.asarray(a, dtype=np.float32) if isinstance(a, np.ndarray) else read_audio_16k(a))
               for label, a in audio.items()}
    streams = {label: live.open_stream(label) for label in samples}
    result = ReplayResult()
    start_ns = clock()
    fed = dict.fromkeys(samples, 0)
    next_status_ns = start_ns + NS_PER_S
    while any(fed[label] < samples[label].shape[0] for label in samples):
        clock.advance(tick_s)
        due = (clock() - start_ns) * SAMPLE_RATE_HZ // NS_PER_S
        for label, stream in streams.items():
            end = min(due, samples[label].shape[0])
            if end > fed[label]:
                stream.accept_waveform(SAMPLE_RATE_HZ, samples[label][fed[label]:end], capture_ns=clock())
                fed[label] = end
        result.audio_s = max(fed.values()) / SAMPLE_RATE_HZ
        _take(result, _timed_step(live, result), on_updates)
        if clock() >= next_status_ns:
            result.statuses.append(live.status())
            next_status_ns = clock() + NS_PER_S
    for stream in streams.values():
        stream.finish()
    _take(result, _timed_step(live, result), on_updates)
    result.statuses.append(live.status())
    live.close()
    return result


def _take(result: ReplayResult, updates: list[CaptionUpdate], on_updates) -> None:
    result.updates += updates
    if on_updates is not None and updates:
        on_updates(updates)


def _timed_step(live: LiveCaptioner, result: ReplayResult) -> list[CaptionUpdate]:
    """``live.step()``, recording the real duration of every step that ran the model."""
    t0 = time.perf_counter()
    steps_before = live.engine.steps
    updates = live.step()
    if live.engine.steps != steps_before:
        result.steps += live.engine.steps - steps_before
        result.step_s.append(time.perf_counter() - t0)
    return updates
