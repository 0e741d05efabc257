"""Which streams get a model update this tick, and how often updates can come.

The worker asks :meth:`Scheduler.due` each tick with a view of every active stream. A stream
is due when it has speech waiting and ``interval_s`` of new audio since its last update, or at
once when its speaker paused (an update hears what they said before the pause). When one stream is due, others that are more than
``merge_fraction`` of the way to due ride along, so one batched step serves them all (merging
work). Riders are a use of spare compute (their captions come sooner), not a saving: each
update spent early is one more update a second. At a thousand streams a step is full of due
streams anyway, and riders had raised the updates per stream-second well above one
(benchmarks/results/capacity/HISTORY.md, "Riders only with spare compute"), so they ride only while the
engine's load — the time budget's estimate, ``admission.predict`` — is under ``merge_max_load``. From
that load on, a step has a cost of its own whatever its rows, large against a row's
(benchmarks/results/capacity/HISTORY.md, "Fewer, fuller steps under load"), so a step that would be
mostly that fixed cost waits, up to ``fill_wait_s`` past due, for more streams to come due: fewer,
fuller steps. After each step the worker reports how long it took; the interval stretches so that model
steps take at most ``target_busy`` of the wall time, and shrinks back when compute frees up — a slow
machine gets fewer, larger updates instead of a growing backlog.

A step takes at most ``max_batch`` streams (a bounded batch keeps the device's working memory
and a step's duration bounded). When more are due, streams of higher ``priority`` go first
(live microphones and meetings before file replays), then those that waited longest; the rest
are due again on the next tick. With more active streams than one batch holds, a round of
updates takes several steps, and the interval stretches by the time of the whole round.

Decisions depend only on the stream views and the reported step times, never on a clock read
here, so a replay with a simulated clock is deterministic. Pure Python; the worker thread calls it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

BASE_INTERVAL_BY_DEVICE_S = {"cuda": 0.5, "cpu": 1.0}
"""The base update interval when the configuration leaves it to the engine's device class
(docs/latency.md; the interval runs in benchmarks/results/latency/HISTORY.md). CUDA: 0.5 s: at
1.0 s the GPU preset commits later with the same WER, and a model step there is short, so the
second update a second costs a few per cent of the GPU. CPU: 1.0 s — a tiny.en step takes a
large part of a second on a small CPU, and the scheduler stretches the interval anyway."""


class StreamView(NamedTuple):
    """A stream as the scheduler sees it. A named tuple, not a frozen dataclass: the engine
    makes one per active stream per tick, and a frozen dataclass's ``__init__`` cost several
    times as much."""

    name: str
    audio_end_s: float
    """How much audio of the stream has features ready."""
    last_update_s: float
    """Audio end of the stream's last model update."""
    speech_pending: bool
    """Speech in the buffer that the captions do not cover yet (VAD), or text still open."""
    priority: int = 0
    """Higher is served first when a step cannot take every due stream."""
    pause_pending: bool = False
    """A pause came after speech the last update did not hear: update now (the speaker waits for
    what they said to be committed)."""
    paused_s: float = 0.0
    """The speaker's silence past the pause (0 while they speak)."""
    close_step: bool = False
    """The segment closes at this pause with a model step of its own (due at once)."""
    segment_open: bool = False
    """Text of an open segment is shown or committed in the stream's buffer (its window does not
    start at the silence before the audio's end)."""


@dataclass(slots=True)
class SchedulerConfig:
    base_interval_s: float | None = None
    """Seconds of new audio between a stream's updates while compute allows; ``None``: by the
    engine's device class (:data:`BASE_INTERVAL_BY_DEVICE_S`, see :func:`for_device`). A server
    sized for many streams passes 1.0 (the capacity figures in docs/capacity.md are at 1 s)."""
    max_interval_s: float = 4.0
    target_busy: float = 0.7
    """Largest share of wall time model steps may take before the interval stretches."""
    merge_fraction: float = 0.5
    merge_max_load: float | None = 0.5
    """Riders only while the load the engine reports (1.0: where the interval starts to stretch)
    is under this; ``None``: always. Where no load is known yet (before the first step), riders
    ride."""
    fill_wait_s: float = 0.25
    """Under load (from ``merge_max_load``), how long past due a step may wait for more due
    streams while its batch would be mostly the step's fixed cost; 0: never wait."""
    fill_fixed_ratio: float = 2.0
    """...and the batch it waits for: this many times ``fixed / per update`` rows (a fixed cost of
    a third of the step at 2), at most ``max_batch`` and the streams speaking."""
    fill_rows: int | None = None
    """The batch a step waits for under load instead (``None``: from the fit, above), at most
    ``max_batch`` and the streams speaking. While steps are always about as full, a fit cannot
    tell a step's fixed cost from its cost per row (at a thousand streams and more it put all of
    it per row, so no step ever waited; benchmarks/results/capacity/HISTORY.md, "Fuller steps")."""
    fill_close_wait_s: float = 0.0
    """How long past its pause (``paused_s``) a pausing segment's update may wait for a fuller
    step; 0: it never waits (its speaker waits for the final). At a
    thousand streams nearly every tick has a closing segment due, so at 0 no step ever waits.
    Both off by default: set, they made steps fuller and cut the model's time per update, but a
    tick that holds its step back reads the held hypotheses outside the encoder's shadow, and the
    thread's time did not fall (benchmarks/results/capacity/HISTORY.md, "Hypotheses read while the
    next step encodes")."""
    min_new_audio_s: float = 0.1
    """A closing update still needs this much new audio... unless the segment is closing."""
    max_batch: int = 64
    """Most streams in one model step (the seed's batch of 64; benchmarks/bench_capacity.py
    measures others)."""


def for_device(config: SchedulerConfig, on_gpu: bool) -> SchedulerConfig:
    """``config`` with an unset base interval filled in for the device class."""
    if config.base_interval_s is not None:
        return config
    return replace(config, base_interval_s=BASE_INTERVAL_BY_DEVICE_S["cuda" if on_gpu else "cpu"])


class Scheduler:
    """Update timing for all streams of one worker. Called only by that worker's thread."""

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        # Without a device to go by (a scheduler made on its own), the CPU's interval.
        self.config = for_device(config or SchedulerConfig(), on_gpu=False)
        if self.config.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.config.max_batch}")
        self.interval_s = self.config.base_interval_s
        self._step_s_ema: float | None = None
        self._steps_per_round = 1

    def due(self, views: list[StreamView], load: float | None = None,
            step_cost: tuple[float, float] | None = None) -> list[str]:
        """The streams to update now, in ``views``' order. ``load``: the engine's load estimate
        (``None``: not measured yet), which decides whether riders come along; ``step_cost``: its
        fit of a step, ``(fixed_s, per_update_s)``, which decides whether a step waits to be fuller."""
        cfg = self.config
        waiting = {v.name: v.audio_end_s - v.last_update_s for v in views}
        active = sum(1 for v in views if v.speech_pending or v.pause_pending or v.close_step)
        self._steps_per_round = max(1, -(-active // cfg.max_batch))
        due = [v for v in views if v.pause_pending or v.close_step or (v.speech_pending and waiting[v.name] >= self.interval_s)]
        if not due:
            return []
        if self._fill_first(due, active, waiting, load, step_cost):
            return []
        # Higher priority first, then a pausing segment (its speaker paused: the final is what
        # they wait for), then the longest wait.
        rank = lambda v: (-v.priority, not (v.pause_pending or v.close_step), -waiting[v.name])  # noqa: E731
        chosen = sorted(due, key=rank)[:cfg.max_batch]
        if len(chosen) < cfg.max_batch and self.riders_wanted(load):
            merge_s = max(cfg.merge_fraction * self.interval_s, cfg.min_new_audio_s)
            taken = {v.name for v in due}
            riders = [v for v in views if v.name not in taken and v.speech_pending and waiting[v.name] >= merge_s]
            chosen += sorted(riders, key=rank)[:cfg.max_batch - len(chosen)]
        order = {v.name: i for i, v in enumerate(views)}
        return sorted((v.name for v in chosen), key=order.__getitem__)

    def _fill_first(self, due: list[StreamView], speaking: int, waiting: dict[str, float],
                    load: float | None, step_cost: tuple[float, float] | None) -> bool:
        """Whether to hold a step of ``due`` back for more streams to come due: under load, while
        its batch would be mostly the step's fixed cost (or under ``fill_rows``), no due stream is
        ``fill_wait_s`` late, and no closing segment has waited ``fill_close_wait_s`` past its
        pause (by default none may wait: a final is what a speaker who paused waits for)."""
        cfg = self.config
        if cfg.fill_wait_s <= 0 or step_cost is None or self.riders_wanted(load):
            return False  # never waiting, nothing fitted yet, or spare compute (riders fill steps then)
        fixed_s, per_s = step_cost
        if per_s <= 0:
            return False
        # Where a row costs as much as the step's fixed part (the CPU: a window's encoder), this
        # asks for one row: no step ever waits.
        rows = cfg.fill_rows if cfg.fill_rows is not None else int(cfg.fill_fixed_ratio * fixed_s / per_s) + 1
        if len(due) >= min(cfg.max_batch, speaking, rows):
            return False
        if any((v.pause_pending or v.close_step) and (cfg.fill_close_wait_s <= 0 or v.paused_s >= cfg.fill_close_wait_s)
               for v in due):
            return False
        lateness = [waiting[v.name] for v in due if not (v.pause_pending or v.close_step)]
        return not lateness or max(lateness) < self.interval_s + cfg.fill_wait_s

    def riders_wanted(self, load: float | None) -> bool:
        """Whether streams not yet due may ride along at ``load`` (``None``: not measured yet)."""
        limit = self.config.merge_max_load
        return limit is None or load is None or load < limit

    def record_step(self, step_s: float) -> None:
        """Fold in the duration of one batched step; stretch or relax the interval."""
        cfg = self.config
        alpha = 0.3
        self._step_s_ema = step_s if self._step_s_ema is None else (1 - alpha) * self._step_s_ema + alpha * step_s
        # A round of updates (one per active stream) takes several steps past one batch.
        needed_s = self._step_s_ema * self._steps_per_round / cfg.target_busy
        self.interval_s = min(cfg.max_interval_s, max(cfg.base_interval_s, needed_s))

    @property
    def stretched(self) -> bool:
        return self.interval_s > self.config.base_interval_s + 1e-9
