"""``EngineConfig.warm_up``: an engine that starts warm has each of its recognizers meet every
batch shape up to the scheduler's ``max_batch`` before any stream opens (a server's engines do;
the desktop's do not). The recognizer side, on the real model: tests/models/test_warm_up.py."""

from __future__ import annotations

from scripted import ScriptedRecognizer

from captioner.engine.core import EngineConfig
from captioner.engine.live import LiveCaptioner
from captioner.engine.scheduler import SchedulerConfig
from captioner.engine.simulate import SimClock
from captioner.serve.engine_link import server_engine_config


class WarmCounting(ScriptedRecognizer):
    """A scripted recognizer that records the warm-ups asked of it."""

    def __init__(self, name: str) -> None:
        super().__init__({}, name=name)
        self.warmed: list[int] = []

    def warm_up(self, max_rows: int) -> int:
        self.warmed.append(max_rows)
        return 3


def _live(config: EngineConfig, light: bool = False):
    main, other = WarmCounting("main"), WarmCounting("light")
    clock = SimClock()
    live = LiveCaptioner(recognizer=main, light_recognizer=other if light else None, config=config,
                         clock_ns=clock, timer_ns=clock)
    return live, main, other


def test_a_warm_engine_warms_both_models_to_its_batch_limit():
    live, main, light = _live(EngineConfig(warm_up=True, scheduler=SchedulerConfig(max_batch=48)), light=True)
    assert main.warmed == [48] and light.warmed == [48]
    assert live.engine.warm_up() == 6  # asked again: both once more
    live.close()


def test_the_default_engine_starts_cold():
    live, main, _ = _live(EngineConfig())
    assert main.warmed == []
    live.close()


def test_servers_start_warm():
    assert server_engine_config().warm_up
