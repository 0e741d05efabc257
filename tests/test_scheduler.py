"""Scheduler: who gets an update, merging, and stretching when compute is short."""

from captioner.engine.scheduler import Scheduler, SchedulerConfig, StreamView


def test_due_needs_speech_and_interval():
    s = Scheduler(SchedulerConfig(base_interval_s=0.5))
    views = [
        StreamView("Me", 2.0, 1.6, True),         # 0.4 s waiting: not due
        StreamView("Meeting", 2.0, 1.4, True),    # 0.6 s: due
        StreamView("Quiet", 9.0, 1.0, False),     # no speech: never due
    ]
    assert s.due(views) == ["Me", "Meeting"]  # Me rides along (merge: 0.4 >= 0.25)
    assert s.due([StreamView("Me", 2.0, 1.9, True), StreamView("Quiet", 9.0, 1.0, False)]) == []


def test_a_pausing_segment_is_due_at_once():
    s = Scheduler()
    assert s.due([StreamView("Me", 2.0, 1.95, True, pause_pending=True)]) == ["Me"]


def test_interval_stretches_when_steps_are_slow_and_relaxes_after():
    s = Scheduler(SchedulerConfig(base_interval_s=0.5, max_interval_s=4.0, target_busy=0.5))
    for _ in range(20):
        s.record_step(1.0)
    assert s.stretched and abs(s.interval_s - 2.0) < 0.05
    for _ in range(10):
        s.record_step(10.0)
    assert s.interval_s == 4.0
    for _ in range(40):
        s.record_step(0.01)
    assert s.interval_s == 0.5 and not s.stretched


def test_a_full_step_takes_higher_priority_first_then_the_longest_wait():
    """max_batch 2, four due streams: the live one (priority 10) goes first whatever its wait,
    then the replay that waited longest; the others are due again next tick. The batch comes
    back in view order."""
    s = Scheduler(SchedulerConfig(base_interval_s=1.0, max_batch=2))
    views = [
        StreamView("replay-a", 5.0, 3.0, True, priority=0),  # waited 2.0 s
        StreamView("replay-b", 5.0, 3.5, True, priority=0),  # 1.5 s
        StreamView("replay-c", 5.0, 2.5, True, priority=0),  # 2.5 s
        StreamView("live", 5.0, 3.9, True, priority=10),     # 1.1 s
    ]
    assert s.due(views) == ["replay-c", "live"]
    rest = [v for v in views if v.name not in ("replay-c", "live")]
    assert s.due(rest) == ["replay-a", "replay-b"]


def test_a_pausing_segment_goes_before_an_equal_priority_update_and_riders_only_fill_room():
    s = Scheduler(SchedulerConfig(base_interval_s=1.0, max_batch=2))
    views = [
        StreamView("due", 5.0, 3.0, True),                       # 2.0 s waiting
        StreamView("pausing", 5.0, 4.9, True, pause_pending=True),
        StreamView("rider", 5.0, 4.3, True),                     # 0.7 s: would ride along
    ]
    assert s.due(views) == ["due", "pausing"]
    assert Scheduler(SchedulerConfig(base_interval_s=1.0, max_batch=3)).due(views) == ["due", "pausing", "rider"]


def test_riders_come_along_only_while_the_engine_has_spare_compute():
    """Under the load limit (or with no load measured yet) a stream half-way to due rides along;
    from the limit on only due streams are stepped: an early update is one more a second."""
    views = [StreamView("due", 5.0, 3.8, True), StreamView("rider", 5.0, 4.3, True)]  # 1.2 s and 0.7 s waiting
    s = Scheduler(SchedulerConfig(base_interval_s=1.0, max_batch=8, merge_max_load=0.5))
    assert s.due(views) == ["due", "rider"]            # nothing measured yet
    assert s.due(views, load=0.49) == ["due", "rider"]
    assert s.due(views, load=0.5) == ["due"]
    assert s.due(views, load=3.0) == ["due"]
    always = Scheduler(SchedulerConfig(base_interval_s=1.0, max_batch=8, merge_max_load=None))
    assert always.due(views, load=3.0) == ["due", "rider"]


def test_under_load_a_step_that_would_be_mostly_fixed_cost_waits_to_be_fuller():
    """Steps cost 40 ms plus 0.4 ms a row: under load a step of 3 due streams (of 300 speaking)
    waits for 201 (twice fixed / per row), until its most overdue stream is fill_wait_s late;
    never for a closing segment, without load, or where a row costs about what the fixed part
    does (the CPU)."""
    s = Scheduler(SchedulerConfig(base_interval_s=1.0, max_batch=256, fill_wait_s=0.25))
    quiet = [StreamView(f"q{i}", 5.0, 4.5, True) for i in range(297)]     # 0.5 s: not due
    due = [StreamView(f"d{i}", 5.0, 3.9, True) for i in range(3)]          # 1.1 s: due, 0.1 s late
    cost = (0.04, 0.0004)
    assert s.due(due + quiet, load=1.0, step_cost=cost) == []
    late = [StreamView("d0", 5.0, 3.7, True)] + due[1:]                    # 1.3 s: 0.3 s late
    assert s.due(late + quiet, load=1.0, step_cost=cost) == ["d0", "d1", "d2"]
    closing = due[:2] + [StreamView("d2", 5.0, 4.9, True, pause_pending=True)]
    assert s.due(closing + quiet, load=1.0, step_cost=cost) == ["d0", "d1", "d2"]
    assert s.due(due + quiet, load=1.0, step_cost=(0.05, 0.3)) == ["d0", "d1", "d2"]   # CPU-like costs
    assert s.due(due + quiet, load=0.2, step_cost=cost)[:3] == ["d0", "d1", "d2"]      # spare compute: riders too
    assert s.due(due + quiet, load=1.0, step_cost=None) == ["d0", "d1", "d2"]          # nothing fitted yet
    enough = [StreamView(f"d{i}", 5.0, 3.9, True) for i in range(201)]
    assert len(s.due(enough + quiet[:99], load=1.0, step_cost=cost)) == 201
    never = Scheduler(SchedulerConfig(base_interval_s=1.0, max_batch=256, fill_wait_s=0.0))
    assert never.due(due + quiet, load=1.0, step_cost=cost) == ["d0", "d1", "d2"]


def test_fill_rows_and_a_bounded_wait_for_pausing_segments():
    """With ``fill_rows`` a step under load waits for that many rows whatever the fit says (here
    it puts every cost per row, as on the H200); a closing segment waits too, but only while its
    close has been pending less than ``fill_close_wait_s``."""
    cfg = SchedulerConfig(base_interval_s=1.0, max_batch=256, fill_wait_s=0.25, fill_rows=192,
                          fill_close_wait_s=0.15)
    s = Scheduler(cfg)
    quiet = [StreamView(f"q{i}", 5.0, 4.5, True) for i in range(297)]     # 0.5 s: not due
    due = [StreamView(f"d{i}", 5.0, 3.9, True) for i in range(3)]          # 1.1 s: due, 0.1 s late
    all_per_row = (0.0, 0.0011)
    assert s.due(due + quiet, load=1.0, step_cost=all_per_row) == []
    fresh_close = due[:2] + [StreamView("d2", 5.0, 4.9, True, pause_pending=True, paused_s=0.05)]
    assert s.due(fresh_close + quiet, load=1.0, step_cost=all_per_row) == []
    old_close = due[:2] + [StreamView("d2", 5.0, 4.9, True, pause_pending=True, paused_s=0.15)]
    assert s.due(old_close + quiet, load=1.0, step_cost=all_per_row) == ["d0", "d1", "d2"]
    enough = [StreamView(f"d{i}", 5.0, 3.9, True) for i in range(192)]
    assert len(s.due(enough + quiet[:108], load=1.0, step_cost=all_per_row)) == 192
    default = Scheduler(SchedulerConfig(base_interval_s=1.0, max_batch=256, fill_wait_s=0.25))
    assert default.due(due + quiet, load=1.0, step_cost=all_per_row) == ["d0", "d1", "d2"]  # the fit: no wait
    assert default.due(fresh_close + quiet, load=1.0, step_cost=(0.04, 0.0004)) == ["d0", "d1", "d2"]


def test_the_interval_stretches_by_a_whole_round_when_it_takes_several_steps():
    """Five active streams in batches of 2 are three steps a round: steps of 0.3 s need
    0.9 s of every interval, so at target_busy 0.5 the interval stretches to 1.8 s."""
    s = Scheduler(SchedulerConfig(base_interval_s=1.0, max_batch=2, target_busy=0.5))
    s.due([StreamView(f"s{i}", 5.0, 4.5, True) for i in range(5)])
    for _ in range(30):
        s.record_step(0.3)
    assert abs(s.interval_s - 1.8) < 0.01


def test_an_unset_interval_goes_by_the_device_class_and_a_set_one_is_kept():
    from captioner.engine.scheduler import BASE_INTERVAL_BY_DEVICE_S, for_device

    assert for_device(SchedulerConfig(), on_gpu=True).base_interval_s == BASE_INTERVAL_BY_DEVICE_S["cuda"] == 0.5
    assert for_device(SchedulerConfig(), on_gpu=False).base_interval_s == BASE_INTERVAL_BY_DEVICE_S["cpu"] == 1.0
    assert for_device(SchedulerConfig(base_interval_s=1.0), on_gpu=True).base_interval_s == 1.0
    assert Scheduler().interval_s == 1.0  # no device to go by: the CPU's


def test_a_server_updates_every_second_on_any_device():
    from captioner.serve.engine_link import SERVER_INTERVAL_S, server_engine_config

    assert server_engine_config().scheduler.base_interval_s == SERVER_INTERVAL_S == 1.0
    assert for_device_interval(server_engine_config(), on_gpu=True) == 1.0


def test_a_servers_step_takes_a_hundred_due_streams_where_a_desktops_takes_64():
    """A thousand served streams due once a second over ten ticks: about a hundred due a tick."""
    from captioner.serve.engine_link import SERVER_MAX_BATCH, server_engine_config

    views = [StreamView(f"s{k}", 5.0, 3.9, True) for k in range(300)]
    assert len(Scheduler(server_engine_config().scheduler).due(views[:120])) == 120
    assert len(Scheduler(server_engine_config().scheduler).due(views)) == SERVER_MAX_BATCH
    assert len(Scheduler(SchedulerConfig(base_interval_s=1.0)).due(views[:120])) == 64


def for_device_interval(config, on_gpu: bool) -> float:
    from captioner.engine.scheduler import for_device

    return for_device(config.scheduler, on_gpu).base_interval_s
