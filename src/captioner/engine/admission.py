"""Admission: whether one more stream fits, decided by measurement rather than a fixed cap.

Two budgets bound the streams of one engine (one GPU, or the CPU):

* **Memory.** A stream's feature rings live in pools that grow in banks
  (:class:`~captioner.gpu.features.FeaturePool`); a new stream that needs a new bank is refused
  when the free device memory, less that bank's cost counted before allocating it, would fall
  under ``min_free_vram_fraction`` (15 %) of the total. Memory is measured through the back-end;
  ``vram_budget_bytes`` instead makes the engine act as if its device had that much memory, of
  which it uses what its pools hold (tests, and an operator sharing a GPU).
* **Time.** Every batched model step is timed; :class:`StepCost` fits the step time as a fixed
  cost plus a cost per stream-update (exponentially weighted least squares, so it follows a
  warming or throttling device). From that fit, :func:`predict` estimates the update interval
  the open streams would see with one more, and a stream is refused when it would pass the
  limit (default 1.5 × the scheduler's base interval), or when the interval measured on the
  running streams already does, or when the engine is already that far behind the audio it is
  given (the median lag of its updates in the last :data:`LAG_WINDOW_S`): a stream's cost grows
  as its speech goes on, so streams admitted while young can outgrow the prediction, and the
  lag is what shows it first.

Priorities: live streams (a microphone, a meeting) come before file replays. The scheduler serves
them first when a step cannot take every due stream, and admission keeps ``live_reserve`` of
the interval headroom for them: a replay is refused earlier than a live stream.

A refusal is a :class:`~captioner.errors.StreamRefused` with one line that says which budget
ran out; nothing already running changes. Pure logic: the engine hands in what it measured.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass

from captioner.errors import StreamRefused
from captioner.events import MIN_FREE_VRAM_FRACTION


class Priority(enum.IntEnum):
    """How a stream ranks when compute is short: higher first. Any int works; these are the two
    the app uses."""

    REPLAY = 0
    """A file replayed through the live path: it can wait."""
    LIVE = 10
    """A microphone or a meeting: people are reading along."""


def parse_priority(priority: int | str | Priority) -> int:
    """``"live"``, ``"replay"``, a :class:`Priority` or any int -> an int; a one-line
    ``ValueError`` otherwise."""
    if isinstance(priority, str):
        try:
            return int(Priority[priority.strip().upper()])
        except KeyError:
            raise ValueError(f"unknown stream priority {priority!r}: use 'live', 'replay' or an integer") from None
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"a stream priority is 'live', 'replay' or an integer, got {priority!r}")
    return int(priority)


@dataclass(slots=True)
class AdmissionConfig:
    min_free_vram_fraction: float = MIN_FREE_VRAM_FRACTION
    """New streams are refused while free device memory would fall under this share."""
    vram_budget_bytes: int | None = None
    """Act as if the device had this much memory, used only by the engine's pools (``None``:
    measure the device)."""
    gpu_memory_bytes: int | None = None
    """The GPU memory this engine's process may use (``--gpu-memory``): its own memory, as NVML
    counts it, is held under this with the same floor free, beside the device's
    (:mod:`captioner.engine.memory_budget`). ``None``: no budget of its own."""
    time_budget: str = "gpu"
    """Where the step-time budget refuses streams: ``"gpu"`` (the default: on an engine whose
    features run on a GPU), ``"on"`` or ``"off"``. A CPU engine is slow for the 1 s base
    interval whatever its stream count (a tiny.en step of one window takes a large part of a
    second on a small CPU), so the 1.5 × limit would refuse its second stream; there the
    scheduler stretches the interval instead (docs/capacity.md)."""
    max_interval_factor: float = 1.5
    """Limit on the update interval (p99) of running streams, in base intervals."""
    max_interval_s: float | None = None
    """The limit in seconds (overrides the factor)."""
    live_reserve: float = 0.2
    """Share of the headroom between the base interval and the limit kept for live streams."""
    light_on_load: float = 0.6
    """Load (:attr:`LoadEstimate.load`, counting every stream on the main model) from which
    new segments of English streams go to the light model, when the engine has one; under the
    load where a single batch would reach the interval limit (about 0.7 at the defaults)."""
    light_off_load: float = 0.4
    """...and under which they go back (the gap keeps it from flapping)."""
    growth_streams: int = 32
    """Streams admitted within one ``growth_window_s`` however few are running (where the time
    budget is on)."""
    growth_fraction: float = 0.1
    """...or this share of the streams running before them, when that is more. A new stream's
    cost is known only once it has spoken and been stepped; streams opened faster than that
    (a thousand clients reconnecting at once) would all be admitted on the old measurement and
    then slow every stream down together: a thousand clients opened at once were all admitted
    and none was captioned in time (docs/capacity.md, "Admission", Growth)."""
    growth_window_s: float = 2.0
    """The window of the growth limit, seconds of the engine's clock."""


class StepCost:
    """Step time as ``fixed_s + per_update_s × batch``, fitted from measured steps.

    Exponentially weighted least squares: each step's weight decays by ``1 - alpha`` per later
    step, so about the last ``1 / alpha`` steps count. With one batch size seen so far the
    intercept cannot be told apart, and the whole time is charged per update (which
    over-estimates larger batches: the safe side)."""

    def __init__(self, alpha: float = 0.05) -> None:
        self.alpha = alpha
        self.steps = 0
        self._w = self._x = self._y = self._xx = self._xy = 0.0
        self.step_s_ema: float | None = None

    def record(self, batch: int, step_s: float) -> None:
        if batch < 1 or not math.isfinite(step_s) or step_s < 0:
            return
        keep = 1.0 - self.alpha
        self._w = keep * self._w + 1.0
        self._x = keep * self._x + batch
        self._y = keep * self._y + step_s
        self._xx = keep * self._xx + batch * batch
        self._xy = keep * self._xy + batch * step_s
        self.step_s_ema = step_s if self.step_s_ema is None else keep * self.step_s_ema + self.alpha * step_s
        self.steps += 1

    @property
    def measured(self) -> bool:
        return self.steps > 0

    def fit(self) -> tuple[float, float]:
        """``(fixed_s, per_update_s)``; ``(0, 0)`` before any step."""
        if not self._w:
            return 0.0, 0.0
        mean_x, mean_y = self._x / self._w, self._y / self._w
        var_x = self._xx / self._w - mean_x * mean_x
        if var_x > 1e-9 * max(1.0, mean_x * mean_x):
            per = (self._xy / self._w - mean_x * mean_y) / var_x
            fixed = mean_y - per * mean_x
            if per > 0 and fixed >= 0:
                return fixed, per
            if per > 0:  # a negative intercept is noise: pass the line through zero instead
                return 0.0, (self._xy / self._w) / (self._xx / self._w)
        return 0.0, mean_y / mean_x

    def step_s(self, batch: int) -> float:
        fixed, per = self.fit()
        return fixed + per * batch if batch > 0 else 0.0


class CpuCost:
    """The engine thread's work outside model steps (taking audio in, features, the VAD,
    scheduling), in seconds per second of one stream's audio: measured against the audio pushed,
    not the clock, so a simulated clock reads it as a real one does. Sampled every
    ``window_audio_s`` of audio (all streams' together), exponentially weighted.

    At many served streams this work was a large share of the thread's time, and a time budget
    that counted only the model steps let them all in while the thread had no time left: the
    engine fell behind, served and in-process (docs/capacity.md, "Admission", Time)."""

    def __init__(self, window_audio_s: float = 20.0, alpha: float = 0.3) -> None:
        self.window_audio_s = window_audio_s
        self.alpha = alpha
        self.per_audio_s = 0.0
        """Host seconds per second of one stream's audio (0 until the first window)."""
        self._start: tuple[float, float] | None = None  # (host s, audio s) at the window's start

    def record(self, host_total_s: float, audio_total_s: float) -> None:
        """The running totals: host seconds spent, stream-seconds of audio pushed."""
        if self._start is None or audio_total_s < self._start[1]:
            self._start = (host_total_s, audio_total_s)
            return
        audio_s = audio_total_s - self._start[1]
        if audio_s < self.window_audio_s:
            return
        sample = max(0.0, host_total_s - self._start[0]) / audio_s
        first = self.per_audio_s == 0.0
        self.per_audio_s = sample if first else (1.0 - self.alpha) * self.per_audio_s + self.alpha * sample
        self._start = (host_total_s, audio_total_s)


@dataclass(frozen=True, slots=True)
class LoadEstimate:
    """What the time budget says for a number of streams."""

    streams: int
    busy_s: float
    """Model time one round of updates (one per stream) takes, and with ``host_per_audio_s``
    given, the host work of one base interval of every stream's audio."""
    load: float
    """``busy_s`` over the scheduler's busy budget for one base interval (1.0: the scheduler
    starts stretching the interval)."""
    interval_s: float
    """Predicted update interval, counting a wait for one step in progress."""


def predict(costs: list[tuple[StepCost, int]], base_interval_s: float, target_busy: float,
            max_batch: int, host_per_audio_s: float = 0.0) -> LoadEstimate:
    """The update interval the streams would see. ``costs``: for each model, its cost fit and
    how many streams it serves. Every stream counts as speaking (a refusal must hold when the
    quiet ones start talking). ``host_per_audio_s`` (:class:`CpuCost`): the thread's work per
    second of a stream's audio besides the model, which the same thread must also find time for."""
    busy_s = 0.0
    longest_step_s = 0.0
    streams = 0
    for cost, n in costs:
        if n <= 0:
            continue
        streams += n
        fixed, per = cost.fit()
        busy_s += math.ceil(n / max_batch) * fixed + n * per
        longest_step_s = max(longest_step_s, cost.step_s(min(n, max_batch)))
    busy_s += streams * host_per_audio_s * base_interval_s
    # The scheduler stretches the interval until steps take at most target_busy of the time.
    interval_s = max(base_interval_s, busy_s / target_busy) + longest_step_s
    return LoadEstimate(streams, busy_s, busy_s / (target_busy * base_interval_s), interval_s)


@dataclass(frozen=True, slots=True)
class Memory:
    """Device memory as the engine sees it for one decision."""

    free_bytes: int
    total_bytes: int


TIME_BUDGETS = ("gpu", "on", "off")

LAG_WINDOW_S = 2.0
"""The window of engine clock over which the lag of the updates is taken (its median): long
enough that one slow step does not refuse anything, short enough to see an engine falling behind
within a few seconds, as a served engine's lag did while streams were still being admitted
(docs/capacity.md, "Admission", Lag)."""


class Admission:
    """Decides on new streams; counts refusals. Called by the engine's thread."""

    def __init__(self, config: AdmissionConfig | None = None, on_gpu: bool = False) -> None:
        self.config = config or AdmissionConfig()
        if self.config.time_budget not in TIME_BUDGETS:
            raise ValueError(f"time_budget must be one of {', '.join(TIME_BUDGETS)}, got {self.config.time_budget!r}")
        self.time_budget_on = self.config.time_budget == "on" or (self.config.time_budget == "gpu" and on_gpu)
        self.refusals = 0
        self.last_refusal = ""
        self.light_active = False
        self._admitted_at_s: deque[float] = deque()  # engine-clock times of recent admissions

    def interval_limit_s(self, base_interval_s: float) -> float:
        cfg = self.config
        return cfg.max_interval_s if cfg.max_interval_s is not None else cfg.max_interval_factor * base_interval_s

    def check_memory(self, name: str, memory: Memory | None, new_block_bytes: int, running: int,
                     of_what: str = "") -> None:
        """Refuse ``name`` if allocating ``new_block_bytes`` would leave under the floor free.
        ``of_what`` names the budget in the refusal (" this engine may use"; "": the device)."""
        if memory is None or memory.total_bytes <= 0:
            return  # the CPU with no budget: host memory is the operating system's business
        floor = self.config.min_free_vram_fraction
        free_after = memory.free_bytes - new_block_bytes
        if free_after < floor * memory.total_bytes:
            self._refuse(
                f"stream {name!r} refused: GPU memory would be {100 * max(0, free_after) / memory.total_bytes:.0f}% "
                f"free ({max(0, free_after) / 2**20:.0f} MiB of the {memory.total_bytes / 2**20:.0f} MiB{of_what}), "
                f"under the {100 * floor:.0f}% kept for the {running} streams running")

    def check_time(self, name: str, priority: int, with_new: LoadEstimate, measured_p99_s: float | None,
                   base_interval_s: float, measured_lag_s: float | None = None) -> None:
        """Refuse ``name`` if the update interval would pass its limit (less the live reserve
        for a replay), predicted from the step-cost fit or already measured, or if the engine is
        already behind its audio by more than that limit (``measured_lag_s``)."""
        if not self.time_budget_on:
            return
        limit_s = self.interval_limit_s(base_interval_s)
        if measured_p99_s is not None and measured_p99_s > limit_s:
            self._refuse(f"stream {name!r} refused: the running streams' update interval is already "
                         f"{measured_p99_s:.2f} s at p99, over the {limit_s:.2f} s limit")
        if measured_lag_s is not None and measured_lag_s > limit_s:
            self._refuse(f"stream {name!r} refused: the engine is {measured_lag_s:.2f} s behind the audio it is "
                         f"given (median of the last {LAG_WINDOW_S:g} s), over the {limit_s:.2f} s limit")
        if priority < Priority.LIVE:
            limit_s = base_interval_s + (limit_s - base_interval_s) * (1.0 - self.config.live_reserve)
        if with_new.interval_s > limit_s:
            self._refuse(f"stream {name!r} refused: with it the update interval would be about "
                         f"{with_new.interval_s:.2f} s, over the {limit_s:.2f} s limit"
                         + (" kept for replays (live streams may use the rest)" if priority < Priority.LIVE else ""))

    def check_growth(self, name: str, now_s: float, running: int) -> None:
        """Refuse ``name`` for now if more streams were admitted in the last
        ``growth_window_s`` than the growth limit allows (see :class:`AdmissionConfig`)."""
        if not self.time_budget_on:
            return
        cfg = self.config
        recent = self._admitted_at_s
        while recent and recent[0] <= now_s - cfg.growth_window_s:
            recent.popleft()
        allowed = max(cfg.growth_streams, int(cfg.growth_fraction * (running - len(recent))))
        if len(recent) >= allowed:
            self._refuse(f"stream {name!r} refused for now: {len(recent)} streams were admitted in the last "
                         f"{cfg.growth_window_s:g} s, and new ones are admitted as their cost is measured "
                         "(try again in a few seconds)")

    def admitted(self, now_s: float) -> None:
        """A stream was admitted at ``now_s`` (the growth limit counts it)."""
        self._admitted_at_s.append(now_s)

    def light_wanted(self, load: float | None) -> bool:
        """Whether new segments of English streams go to the light model: on from
        ``light_on_load``, off again under ``light_off_load``."""
        if load is not None:
            if load >= self.config.light_on_load:
                self.light_active = True
            elif load < self.config.light_off_load:
                self.light_active = False
        return self.light_active

    def _refuse(self, message: str) -> None:
        self.refusals += 1
        self.last_refusal = message
        raise StreamRefused(message)
