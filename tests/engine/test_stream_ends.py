"""Streams that end together get their last updates in one model step (up to ``max_batch``
rows a step), not one step each, and lose no word: a server whose clients leave together, or
a captioner closed with all its streams, made a one-row step per stream (benchmarks/
bench_host_arrival.py: 264 steps for the ends of 600 streams, now 2)."""

from __future__ import annotations

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

from captioner.engine.core import EngineConfig
from captioner.engine.live import LiveCaptioner
from captioner.engine.scheduler import SchedulerConfig
from captioner.engine.simulate import SimClock

AUDIO_S = 3.6  # the phrases end at about 3.1 s: their text is still open when the streams end


def _speaking(n: int, max_batch: int = 64):
    """``n`` streams whose speech runs to the end of their audio (the segment still open when
    they end), fed all of it; the captioner, its clock, the recognizer and the updates so far."""
    script = {f"s{i:03d}": phrase(f"stream {i} keeps talking to the very end", 0.2 + 0.003 * (i % 30)) for i in range(n)}
    recognizer = ScriptedRecognizer(script)
    clock = SimClock()
    live = LiveCaptioner(recognizer=recognizer, clock_ns=clock, timer_ns=clock,
                         config=EngineConfig(scheduler=SchedulerConfig(max_batch=max_batch)))
    for label in script:
        live.open_stream(label)
    audio = {label: render_speech(words, AUDIO_S, seed=i % 5) for i, (label, words) in enumerate(script.items())}
    updates = feed(live, clock, audio, chunk_s=0.1)
    return live, clock, recognizer, script, updates


def _words_complete(updates, script) -> None:
    for label, words in script.items():
        assert keys(" ".join(u.text for u in finals(updates, label))) == keys(words), label


@pytest.mark.parametrize("n, max_batch, steps", [(40, 64, 1), (150, 64, 3)])
def test_streams_that_end_together_share_their_last_model_steps(n, max_batch, steps):
    live, clock, recognizer, script, updates = _speaking(n, max_batch)
    before = len(recognizer.calls)
    updates += finish_all(live, clock)
    last_calls = recognizer.calls[before:]
    assert [len(call) for call in last_calls] == [max_batch] * (steps - 1) + [n - max_batch * (steps - 1)]
    assert sorted(r.stream for call in last_calls for r in call) == sorted(script)
    _words_complete(updates, script)
    assert not live.streams


def test_closing_the_captioner_commits_every_stream_in_one_step():
    live, clock, recognizer, script, updates = _speaking(30)
    before = len(recognizer.calls)
    updates += live.close()
    assert [len(call) for call in recognizer.calls[before:]] == [30]
    _words_complete(updates, script)


def test_a_stream_that_ends_alone_still_gets_its_last_update():
    live, clock, recognizer, script, updates = _speaking(3)
    first = live.streams["s000"]
    first.finish()
    before = len(recognizer.calls)
    updates += live.step()
    assert first.done and [[r.stream for r in call] for call in recognizer.calls[before:]] == [["s000"]]
    updates += finish_all(live, clock)
    _words_complete(updates, script)
