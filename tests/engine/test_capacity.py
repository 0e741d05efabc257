"""Capacity without a fixed cap (issue 12): streams are admitted by measured memory and step
time, served by priority, and moved to a light model under load.

Driven through the public API. The model is the scripted recognizer; where a step must cost
time, :class:`~captioner.engine.simulate.ChargedRecognizer` charges it to the simulated clock as
a modelled device would take it (a fixed cost plus a cost per window), and the engine times its
steps on that same clock, so admission fits exactly what the device "measured".
"""

from __future__ import annotations

import numpy as np
import pytest
from scripted import (
    ScriptedRecognizer,
    feed,
    finals,
    finish_all,
    keys,
    phrase,
    render_speech,
)

from captioner.engine.admission import (
    AdmissionConfig,
    CpuCost,
    Priority,
    StepCost,
    predict,
)
from captioner.engine.core import EngineConfig
from captioner.engine.live import LiveCaptioner
from captioner.engine.policy.config import PolicyConfig
from captioner.engine.scheduler import SchedulerConfig
from captioner.engine.simulate import ChargedRecognizer, SimClock
from captioner.errors import StreamRefused
from captioner.gpu.features import bank_bytes


def committed(updates, stream: str) -> list[str]:
    return keys(" ".join(u.text for u in finals(updates, stream)))


def one_line_refusal(call, match: str) -> str:
    with pytest.raises(StreamRefused, match=match) as info:
        call()
    message = str(info.value)
    assert message and "\n" not in message
    return message


def charged(recognizer, clock: SimClock, fixed_s: float, per_window_s: float) -> ChargedRecognizer:
    return ChargedRecognizer(recognizer, clock, lambda n: fixed_s + per_window_s * n)


# -- no fixed cap ---------------------------------------------------------------------------------
def test_256_streams_opened_through_the_public_api_all_produce_their_captions():
    """256 concurrent streams (4 banks of 64 feature rings) each get exactly their own words."""
    n = 256
    script = {f"s{i:03d}": phrase(f"stream {i} says hello world", 0.5 + 0.01 * (i % 50)) for i in range(n)}
    recognizer = ScriptedRecognizer(script)
    clock = SimClock()
    live = LiveCaptioner(recognizer=recognizer, clock_ns=clock, timer_ns=clock)
    for label in script:
        live.open_stream(label)
    status = live.status()
    assert len(status.streams) == n and dict(status.extra)["stream_slots"] == n
    audio = {label: render_speech(words, 3.8, seed=i % 7) for i, (label, words) in enumerate(script.items())}
    updates = feed(live, clock, audio, chunk_s=0.1)
    updates += finish_all(live, clock)
    for label, words in script.items():
        assert committed(updates, label) == keys(words), label
    # Steps were batched, at most max_batch streams each.
    sizes = [len(call) for call in recognizer.calls]
    assert max(sizes) == SchedulerConfig().max_batch and len(recognizer.calls) < n
    assert live.status().streams_refused == 0


# -- refusal by step time -------------------------------------------------------------------------
def _speaking_captioner(n_live: int, fixed_s: float, per_window_s: float, config: EngineConfig | None = None):
    """A captioner with ``n_live`` streams that have spoken (so steps were timed), on a device
    modelled as ``fixed_s + per_window_s × batch`` per step."""
    words = phrase("one two three four five six", 0.5)
    # The running streams speak again 3.5 s later (a second round of the same audio).
    again = words + phrase("one two three four five six", 4.0)
    script = {f"L{i}": again for i in range(n_live)} | {f"X{i}": words for i in range(8)}
    recognizer = ScriptedRecognizer(script)
    clock = SimClock()
    config = config or EngineConfig()
    config.admission.time_budget = "on"  # on the CPU too, as on a GPU
    live = LiveCaptioner(recognizer=recognizer, clock_ns=clock, timer_ns=clock, config=config)
    live.engine.recognizer = charged(recognizer, clock, fixed_s, per_window_s)
    for i in range(n_live):
        live.open_stream(f"L{i}")
    audio = render_speech(words, 3.5)
    updates = feed(live, clock, {f"L{i}": audio for i in range(n_live)})
    return live, clock, audio, updates, words


def test_a_stream_past_the_update_interval_limit_is_refused_and_the_running_ones_go_on():
    """Steps cost 0.05 s + 0.1 s per window: 4 streams predict a 1.45 s interval (limit 1.5 s
    at the 1 s base), so the 4th is admitted and the 5th refused with one line; the running
    streams keep all their words and their update interval stays within the limit."""
    live, clock, audio, updates, words = _speaking_captioner(3, 0.05, 0.1)
    fixed_s, per_s = live.engine._costs["main"].fit()
    assert per_s > 0 and fixed_s + 3 * per_s == pytest.approx(0.35, rel=1e-6)  # the 3-stream steps, exactly
    live.open_stream("X0")
    message = one_line_refusal(lambda: live.open_stream("X1"), "update interval")
    assert "X1" in message and "1.50 s limit" in message
    assert list(live.streams) == ["L0", "L1", "L2", "X0"]
    assert live.status().streams_refused == 1
    updates += feed(live, clock, {label: audio for label in live.streams})
    updates += finish_all(live, clock)
    for label in ("L0", "L1", "L2", "X0"):
        assert committed(updates, label) == keys(words) * (2 if label.startswith("L") else 1), label
    assert live.engine.measured_interval_p99_s() is None  # the streams closed: nothing left to measure
    intervals = sorted(live.engine._intervals_s)
    # The running streams were not slowed past the limit: their updates came every base
    # interval (1 s), or sooner for one that rode along; a stream's pause gets an update of its
    # own at once, served before the others, which may put one more step (at most 0.45 s here)
    # into another stream's interval.
    assert intervals and intervals[len(intervals) // 2] <= 1.5 and intervals[-1] <= 1.5 + 0.05 + 4 * 0.1


def test_the_threads_host_work_counts_against_the_interval_too():
    """The same three streams and device as above, with the engine thread's host work per
    stream (taking audio in, features, VAD) measured at 0.1 s a stream-second: with four streams
    the thread would work 0.45 s on the model and 0.4 s on the host each second, past the 70 %
    busy target, stretching the interval to about 1.66 s; so the 4th is refused where it was
    admitted on the model's time alone."""
    live, *_ = _speaking_captioner(3, 0.05, 0.1)
    live.engine.host_cost.per_audio_s = 0.1
    message = one_line_refusal(lambda: live.open_stream("X0"), "update interval")
    assert "X0" in message and "1.50 s limit" in message
    assert list(live.streams) == ["L0", "L1", "L2"]
    assert dict(live.status().extra)["host_s_per_stream_audio_s"] == 0.1


@pytest.mark.parametrize("behind_s", [0.0, 2.5])
def test_an_engine_already_behind_its_audio_takes_no_new_stream(behind_s):
    """Three streams whose steps are cheap (a new one fits the prediction and the measured
    interval), handed their audio ``behind_s`` after it was captured, as a server's backed-up
    inbox hands it over: on time, a fourth is admitted; 2.5 s behind (over the 1.5 s limit, for
    the median update of the last 2 s), it is refused in one line that says so, and the running
    streams go on."""
    live, clock, audio, updates, words = _speaking_captioner(3, 0.005, 0.01)
    chunk = int(0.05 * 16000)
    for at in range(0, audio.shape[0], chunk):
        clock.advance(0.05)
        for label in list(live.streams):
            live.streams[label].accept_waveform(16000, audio[at:at + chunk], capture_ns=clock() - int(behind_s * 1e9))
        updates += live.step()
    lag_s = live.engine.measured_lag_s()
    assert lag_s is not None and (lag_s > 1.5) is (behind_s > 1.5), lag_s
    if behind_s > 1.5:
        message = one_line_refusal(lambda: live.open_stream("X0"), "behind the audio")
        assert "X0" in message and "1.50 s limit" in message
        assert list(live.streams) == ["L0", "L1", "L2"]
    else:
        live.open_stream("X0")
        assert list(live.streams) == ["L0", "L1", "L2", "X0"]
    updates += finish_all(live, clock)
    for label in ("L0", "L1", "L2"):
        assert committed(updates, label) == keys(words) * 2, label


def test_the_host_cost_is_measured_per_second_of_audio_whatever_the_clock():
    cost = CpuCost(window_audio_s=20.0, alpha=0.3)
    cost.record(0.0, 0.0)
    cost.record(1.0, 10.0)
    assert cost.per_audio_s == 0.0  # not a window of audio yet
    cost.record(2.0, 20.0)
    assert cost.per_audio_s == pytest.approx(0.1)
    cost.record(2.5, 40.0)
    assert cost.per_audio_s == pytest.approx(0.7 * 0.1 + 0.3 * 0.025)
    # 1,000 streams at 0.4 ms a stream-second: 0.4 s of each base second is not the model's.
    step = StepCost()
    step.record(100, 0.08)
    assert predict([(step, 1000)], 1.0, 0.7, 256, host_per_audio_s=0.4e-3).busy_s == pytest.approx(0.8 + 0.4)
    # ...and an engine measures it from what its streams did (a simulated clock: the same).
    live, clock, audio, updates, words = _speaking_captioner(3, 0.05, 0.1)
    feed(live, clock, {label: audio for label in live.streams})
    engine = live.engine
    assert engine.audio_pushed_s >= 20.0 and engine.host_s["ingest"] > 0
    assert 0.0 < engine.host_cost.per_audio_s <= sum(engine.host_s.values()) / engine.audio_pushed_s * 3


@pytest.mark.parametrize(("per_window_s", "riders"), [(0.01, True), (0.15, False)])
def test_streams_ride_along_only_while_the_engine_has_spare_compute(per_window_s, riders):
    """The engine hands the scheduler its load: three streams at 0.01 s a window (load 0.05) let
    streams not yet due ride along; at 0.15 s a window (load 0.71) only due streams are stepped.
    Either way every stream's words are committed whole."""
    live, clock, audio, updates, words = _speaking_captioner(3, 0.005, per_window_s)
    load = live.engine.load_estimate(all_main=True).load
    assert (load < SchedulerConfig().merge_max_load) is riders
    assert live.engine.scheduler.riders_wanted(load) is riders
    updates += feed(live, clock, {label: audio for label in live.streams})
    updates += finish_all(live, clock)
    for label in ("L0", "L1", "L2"):
        assert committed(updates, label) == keys(words) * 2, label


def test_under_load_fuller_steps_cost_less_model_time_and_keep_the_interval():
    """160 streams whose speech starts at 20 different moments, on a device modelled as 40 ms a
    step plus 2 ms a window (load 0.6): with fill_wait_s steps wait to be fuller, so there are
    fewer of them, the model time for the same audio falls, the longest interval grows by at most
    the wait and a step, and every stream's words are committed whole."""
    n = 160
    script = {f"s{i:03d}": phrase("fuller steps under load", 0.4 + 0.05 * (i % 20)) for i in range(n)}
    audio = {label: render_speech(words, 4.5, seed=i % 5) for i, (label, words) in enumerate(script.items())}
    outcome = {}
    for wait_s in (0.0, 0.25):
        recognizer = ScriptedRecognizer(script)
        clock = SimClock()
        config = EngineConfig(scheduler=SchedulerConfig(base_interval_s=1.0, max_batch=256, fill_wait_s=wait_s))
        live = LiveCaptioner(recognizer=recognizer, clock_ns=clock, timer_ns=clock, config=config)
        records = []
        live.engine.recognizer = ChargedRecognizer(recognizer, clock, lambda rows: 0.04 + 0.002 * rows, records)
        for label in script:
            live.open_stream(label)
        updates = feed(live, clock, audio, chunk_s=0.05)
        assert live.engine.load_estimate(all_main=True).load >= SchedulerConfig().merge_max_load
        updates += finish_all(live, clock)
        for label, words in script.items():
            assert committed(updates, label) == keys(words), (wait_s, label)
        intervals = list(live.engine._intervals_s)
        outcome[wait_s] = (len(records), sum(r.charged_s for r in records), max(intervals))
    (steps_now, model_now, worst_now_s), (steps_fuller, model_fuller, worst_s) = outcome[0.0], outcome[0.25]
    assert steps_fuller < steps_now and model_fuller < model_now
    # The simulated clock charges steps on top of the audio's own time, so intervals run long
    # either way; waiting adds at most the wait and one step to the longest.
    assert worst_s <= worst_now_s + 0.25 + (0.04 + 0.002 * n)


def test_a_replay_is_refused_before_a_live_stream_the_reserve_is_for_live_streams():
    """The 4th stream (1.45 s predicted) fits the live limit (1.5 s) but not the replay limit
    (1.5 s less 20 % of the 0.5 s headroom = 1.4 s)."""
    live, *_ = _speaking_captioner(3, 0.05, 0.1)
    one_line_refusal(lambda: live.open_stream("X0", priority="replay"), "1.40 s limit kept for replays")
    live.open_stream("X0", priority="live")
    assert live.streams["X0"].priority == Priority.LIVE


def test_on_the_cpu_the_time_budget_is_off_unless_asked_for():
    """The default budget is for GPU engines: a CPU engine admits the 5th stream that the same
    measured steps refuse when the budget is on (the scheduler stretches its interval instead)."""
    live, *_ = _speaking_captioner(3, 0.05, 0.1)
    live.engine.admission.time_budget_on = False  # what "gpu" resolves to on the CPU
    for label in ("X0", "X1", "X2"):
        live.open_stream(label)
    assert EngineConfig().admission.time_budget == "gpu"
    assert LiveCaptioner(recognizer=ScriptedRecognizer({}), clock_ns=SimClock()).engine.admission.time_budget_on is False


def test_the_interval_measured_on_running_streams_refuses_new_ones_once_over_the_limit():
    """Steps of 2 s whatever the batch: the prediction for one more stream is over the limit,
    and so is what the running streams measured — either way a new stream is refused, and the
    message says which figure."""
    live, *_ = _speaking_captioner(2, 2.0, 0.0)
    p99 = live.engine.measured_interval_p99_s()
    if p99 is not None:
        assert p99 > 1.5
    one_line_refusal(lambda: live.open_stream("X0"), "update interval")


def test_streams_opened_faster_than_they_can_be_measured_are_refused_for_now():
    """With the time budget on, at most 32 streams (or a tenth of those running) are admitted
    per 2 s of the engine's clock: a burst of 40 gets 32 in and 8 a one-line "for now" refusal
    (nothing running changes); 2 s later the rest get in; with 500 running, 50 per window. A
    stream re-opened after a restart (``readmit``) is never counted nor refused by time."""
    clock = SimClock()
    config = EngineConfig()
    config.admission.time_budget = "on"
    live = LiveCaptioner(recognizer=ScriptedRecognizer({}), clock_ns=clock, timer_ns=clock, config=config)
    refused = []
    for i in range(40):
        try:
            live.open_stream(f"a{i}")
        except StreamRefused as error:
            refused.append(str(error))
    assert len(live.streams) == 32 and len(refused) == 8
    assert all("refused for now" in r and "\n" not in r for r in refused)
    assert live.status().streams_refused == 8
    live.open_stream("restarted", readmit=True)  # a restart's re-open: admitted, not counted
    clock.advance(2.0)
    for i in range(32, 40):
        live.open_stream(f"a{i}")
    # Grow to 500 running streams, a window at a time, then one window admits a tenth of them.
    n = 0
    while len(live.streams) < 500:
        clock.advance(2.0)
        for _ in range(min(500 - len(live.streams), max(32, len(live.streams) // 10))):
            live.open_stream(f"b{n}")
            n += 1
    clock.advance(2.0)
    for i in range(50):
        live.open_stream(f"c{i}")
    one_line_refusal(lambda: live.open_stream("c50"), "for now")
    live.engine.admission.time_budget_on = False  # a CPU engine: no time rules, no growth limit
    live.open_stream("c51")


def test_bad_priorities_are_one_line_value_errors():
    live = LiveCaptioner(recognizer=ScriptedRecognizer({}), clock_ns=SimClock())
    for bad in ("urgent", 1.5, None):
        with pytest.raises(ValueError, match="priority") as info:
            live.open_stream("A", priority=bad)
        assert "\n" not in str(info.value)
    assert live.open_stream("A", priority=3).priority == 3


# -- refusal by memory ----------------------------------------------------------------------------
def _budget_config(blocks: float, block_streams: int = 4) -> EngineConfig:
    config = EngineConfig(block_streams=block_streams)
    block = bank_bytes(block_streams, 80, 40, config.ring_frames, 100)
    config.admission = AdmissionConfig(vram_budget_bytes=int(blocks * block))
    return config


def test_the_memory_floor_with_a_small_budget_refuses_a_new_bank_not_a_free_slot():
    """A budget of 3.2 banks of 4 rings: two banks fit above the 15 % floor, a third would
    leave 6 %. The 9th stream is refused before anything is allocated; once a stream closes,
    its slot takes a new stream without a new bank."""
    config = _budget_config(3.2)
    clock = SimClock()
    live = LiveCaptioner(recognizer=ScriptedRecognizer({}), clock_ns=clock, timer_ns=clock, config=config)
    for i in range(8):
        live.open_stream(f"s{i}")
    pool_before = live.engine.features.bytes_allocated
    message = one_line_refusal(lambda: live.open_stream("s8"), "GPU memory")
    assert "15% kept for the 8 streams running" in message
    assert live.engine.features.bytes_allocated == pool_before and live.engine.features.capacity == 8
    live.streams["s3"].finish()
    live.step()
    assert "s3" not in live.streams
    live.open_stream("s8")
    assert live.engine.features.capacity == 8
    assert live.status().streams_refused == 1


@pytest.mark.gpu
def test_the_memory_floor_on_the_gpu_budget_and_measured():
    """On CUDA: the same budget refusal with the rings in VRAM, and the floor measured on the
    device itself (a floor of 100 % refuses the first bank)."""
    from captioner.gpu.backend import cuda_usable, get_backend

    if not cuda_usable():
        pytest.skip("no usable CUDA device")
    backend = get_backend("cuda")
    backend.use()

    class HostCopy:
        """The scripted listener reads NumPy; the rings are CuPy arrays."""

        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            return getattr(self._inner, name)

        def decode(self, requests):
            from dataclasses import replace

            return self._inner.decode([replace(r, log_mel=backend.asnumpy(r.log_mel)) for r in requests])

    clock = SimClock()
    live = LiveCaptioner(recognizer=HostCopy(ScriptedRecognizer({})), backend=backend, clock_ns=clock,
                         timer_ns=clock, config=_budget_config(3.2))
    for i in range(8):
        live.open_stream(f"s{i}")
    one_line_refusal(lambda: live.open_stream("s8"), "GPU memory")
    config = EngineConfig()
    config.admission = AdmissionConfig(min_free_vram_fraction=1.0)
    measured = LiveCaptioner(recognizer=HostCopy(ScriptedRecognizer({})), backend=backend, clock_ns=clock,
                             timer_ns=clock, config=config)
    one_line_refusal(lambda: measured.open_stream("a"), "GPU memory")
    assert measured.engine.features.capacity == 0


# -- priorities -----------------------------------------------------------------------------------
def test_live_streams_are_served_before_replays_when_a_step_cannot_take_both():
    """One window per step: the live stream, opened after the replay, gets its updates first;
    both are captioned whole."""
    words = phrase("priority matters here today", 0.5)
    recognizer = ScriptedRecognizer({"replay": words, "live": words})
    clock = SimClock()
    config = EngineConfig(scheduler=SchedulerConfig(max_batch=1))
    live = LiveCaptioner(recognizer=recognizer, clock_ns=clock, timer_ns=clock, config=config)
    live.open_stream("replay", priority="replay")
    live.open_stream("live")
    audio = render_speech(words, 3.0)
    updates = feed(live, clock, {"replay": audio, "live": audio})
    updates += finish_all(live, clock)
    order = [call[0].stream for call in recognizer.calls]
    assert order[0] == "live" and all(len(call) == 1 for call in recognizer.calls)
    first_final = {s: min(u.emitted_wall_s for u in finals(updates, s)) for s in ("live", "replay")}
    assert first_final["live"] <= first_final["replay"]
    assert committed(updates, "live") == committed(updates, "replay") == keys(words)


# -- the light model under load -------------------------------------------------------------------
def test_new_segments_of_english_streams_go_to_the_light_model_under_load_and_come_back():
    """base costs 0.08 s per window, the light model 0.02 s. Two streams (load 0.23) stay on
    base; with six (load 0.69 ≥ 0.6) the new segments of English streams go to the light model
    — not the German one, which it cannot hear — and status shows it; back at two (0.23 < 0.4)
    new segments are on base again. Every stream is captioned whole throughout."""
    words = phrase("light model switch test", 0.5)
    # Each round ends in a silence that closes the segment (a shorter pause keeps it, and its model).
    round_s = 3.0 + PolicyConfig().long_pause_s
    three_times = words + phrase("light model switch test", 0.5 + round_s) + \
        phrase("light model switch test", 0.5 + 2 * round_s)
    script = {f"en{i}": words for i in range(5)} | {"de0": words} | {"en0": three_times, "en1": three_times}
    base = ScriptedRecognizer(script, name="base", is_multilingual=True)
    light = ScriptedRecognizer(script, name="tiny.en")
    clock = SimClock()
    live = LiveCaptioner(recognizer=base, light_recognizer=light, clock_ns=clock, timer_ns=clock)
    live.engine.recognizer = charged(base, clock, 0.0, 0.08)
    live.engine.light_recognizer = charged(light, clock, 0.0, 0.02)
    audio = render_speech(words, round_s)

    def speak(labels):
        before_base, before_light = len(base.requests), len(light.requests)
        updates = feed(live, clock, {label: audio for label in labels})
        return updates, {r.stream for r in base.requests[before_base:]}, {r.stream for r in light.requests[before_light:]}

    for label in ("en0", "en1"):
        live.open_stream(label, language="en")
    updates, on_base, on_light = speak(["en0", "en1"])
    assert on_base == {"en0", "en1"} and on_light == set() and live.status().light_model == ""

    for label in ("en2", "en3", "en4"):
        live.open_stream(label, language="en")
    live.open_stream("de0", language="de")
    more, on_base, on_light = speak(list(live.streams))
    updates += more
    assert on_light == {"en0", "en1", "en2", "en3", "en4"} and on_base == {"de0"}
    assert live.status().light_model == "tiny.en"
    assert dict(live.status().extra)["light_steps"] > 0

    for label in ("en2", "en3", "en4", "de0"):
        live.streams[label].finish()
    more, on_base, on_light = speak(["en0", "en1"])
    updates += more
    assert on_base == {"en0", "en1"} and on_light == set()
    assert live.status().light_model == ""
    updates += finish_all(live, clock)
    for label in script:
        assert committed(updates, label) == keys(words) * (3 if label in ("en0", "en1") else 1), label


def test_a_light_model_with_other_mel_bands_is_refused():
    with pytest.raises(ValueError, match="mel bands"):
        LiveCaptioner(recognizer=ScriptedRecognizer({}), light_recognizer=ScriptedRecognizer({}, n_mels=128),
                      clock_ns=SimClock())


# -- the cost fit ---------------------------------------------------------------------------------
def test_the_step_cost_fit_recovers_fixed_and_per_update_costs():
    cost = StepCost()
    rng = np.random.default_rng(0)
    for batch in rng.integers(1, 65, 200):
        cost.record(int(batch), 0.013 + 0.0065 * int(batch))
    fixed_s, per_s = cost.fit()
    assert fixed_s == pytest.approx(0.013, rel=1e-6) and per_s == pytest.approx(0.0065, rel=1e-6)
    # 1,500 streams in batches of 64 at 1 s: 24 steps.
    estimate = predict([(cost, 1500)], 1.0, 0.7, 64)
    assert estimate.busy_s == pytest.approx(24 * 0.013 + 1500 * 0.0065)
    assert estimate.interval_s == pytest.approx(max(1.0, estimate.busy_s / 0.7) + 0.013 + 64 * 0.0065)


# -- real models ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_four_tiny_en_streams_on_the_cpu_all_produce_captions(speech_clips, tiny_en_cpu):
    """Four recordings as four concurrent streams of one tiny.en captioner on the CPU, replayed
    on a simulated clock that charges every model step its measured time: every stream commits
    most of its reference words, the steps were batched, and status carries admission's figures."""
    from captioner.engine.simulate import replay

    clips = sorted((c for c in speech_clips.values() if c.language == "en" and c.duration_s <= 12),
                   key=lambda c: c.duration_s)[:4]
    if len(clips) < 4:
        pytest.skip("needs four English recordings of at most 12 s")
    backend, recognizer = tiny_en_cpu
    result = replay(lambda clock, timer: LiveCaptioner(recognizer=recognizer, backend=backend, clock_ns=clock,
                                                        timer_ns=timer),
                    {c.id: str(c.wav) for c in clips}, compute="measured")
    for c in clips:
        said = keys(" ".join(u.text for u in finals(result.updates, c.id)))
        reference = keys(c.reference)
        heard = sum(1 for w in set(reference) if w in said)
        assert heard >= 0.6 * len(set(reference)), (c.id, said, reference)
    busiest = max(result.statuses, key=lambda s: s.batch_size)
    assert busiest.batch_size >= 2
    assert any(s.admitted_load is not None and len(s.streams) == 4 for s in result.statuses)
    assert all(s.streams_refused == 0 for s in result.statuses)


# -- the feature pool -----------------------------------------------------------------------------
def _pool_reads_agree(backend) -> None:
    """Streams spread over three banks: the batched read of many streams' frames equals each
    stream's own window, in the order asked for, and a freed slot is reused before a new bank."""
    from captioner.gpu.features import FeaturePool

    pool = FeaturePool(backend, n_mels=80, ring_frames=256, block_streams=4)
    slots = [pool.acquire() for _ in range(10)]
    assert pool.capacity == 12 and len(pool.banks) == 3
    rng = np.random.default_rng(3)
    audio = (0.1 * rng.standard_normal((10, 160 * 40))).astype(np.float32)
    pool.push_batch(slots, audio)
    order = [9, 0, 5, 4, 1]
    firsts = [3, 10, 0, 20, 7]
    got = backend.asnumpy(pool.log_mel_frames([slots[i] for i in order], firsts, 12))
    for row, (i, first) in enumerate(zip(order, firsts)):
        want = backend.asnumpy(pool.log_mel_window(slots[i], first, 12))
        np.testing.assert_array_equal(got[row], want)
    pool.release(slots[5])
    assert pool.acquire() == slots[5] and pool.capacity == 12 and pool.frames_ready(slots[5]) == 0


def test_the_feature_pool_reads_many_streams_at_once_as_each_alone():
    from captioner.gpu.backend import cpu_backend

    _pool_reads_agree(cpu_backend())


@pytest.mark.gpu
def test_the_feature_pool_on_the_gpu_and_70_streams_captioned_across_two_banks():
    from captioner.gpu.backend import cuda_usable, get_backend

    if not cuda_usable():
        pytest.skip("no usable CUDA device")
    from dataclasses import replace

    backend = get_backend("cuda")
    backend.use()
    _pool_reads_agree(backend)

    class HostCopy(ScriptedRecognizer):
        """The scripted listener reads NumPy; the rings are CuPy arrays."""

        def decode(self, requests):
            return super().decode([replace(r, log_mel=backend.asnumpy(r.log_mel)) for r in requests])

    script = {f"s{i:02d}": phrase(f"gpu stream {i} speaks", 0.5 + 0.02 * i) for i in range(70)}
    clock = SimClock()
    # The 70 open at once: the pool's banks are the subject here, not admission's growth limit
    # (at most 32 new streams in 2 s on a GPU, which refused the 33rd on an H100).
    config = EngineConfig()
    config.admission.time_budget = "off"
    live = LiveCaptioner(recognizer=HostCopy(script), backend=backend, clock_ns=clock, timer_ns=clock, config=config)
    for label in script:
        live.open_stream(label)
    audio = {label: render_speech(words, 4.0, seed=i % 5) for i, (label, words) in enumerate(script.items())}
    updates = feed(live, clock, audio, chunk_s=0.1)
    updates += finish_all(live, clock)
    for label, words in script.items():
        assert committed(updates, label) == keys(words), label
