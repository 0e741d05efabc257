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


def test_closing_segment_is_due_at_once():
    s = Scheduler()
    assert s.due([StreamView("Me", 2.0, 1.95, True, close_pending=True)]) == ["Me"]


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
