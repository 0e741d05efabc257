"""A step that works a backlog through in several ticks hands each tick's captions out as that
tick ends, and dates them when they can first be seen.

Issue 13: a served engine on an H200 worked its thousand streams' audio in steps of several
ticks, each with a model step of a few hundred milliseconds. The first tick's captions waited
for the last, yet were dated when the first was made: every latency measured from that date
(the engine's caption latency, ``bench_serve``'s split at the engine) was short by up to the
rest of the step."""

from __future__ import annotations

import time

import pytest
from scripted import ScriptedRecognizer, finals, keys, render_speech
from test_host_batching import CHUNK, SCRIPTS, ScriptFactory, _plain

from captioner.engine.core import EngineConfig
from captioner.engine.host import HostCore, HostSpec, InlineHost
from captioner.engine.live import LiveCaptioner
from captioner.engine.messages import (
    CloseStream,
    HostReady,
    OpenStream,
    StreamDone,
    Updates,
)
from captioner.engine.scheduler import SchedulerConfig
from captioner.engine.simulate import ChargedRecognizer, SimClock, StepRecord
from captioner.engine.supervisor import SupervisedCaptioner
from captioner.events import SAMPLE_RATE_HZ, FramedAudio

BACKLOG_S = 9.0
STEP_COST_S = 0.2  # charged to the simulated clock by every model step


def _backlogged() -> tuple[LiveCaptioner, SimClock, float, list[StepRecord]]:
    """Three scripted speakers whose 9 s of audio arrive at once (a suspended laptop, a
    lagging engine): one ``step`` works through them in 100 ms ticks."""
    clock = SimClock()
    recognizer = ScriptedRecognizer(dict(SCRIPTS))
    config = EngineConfig(scheduler=SchedulerConfig(base_interval_s=0.5))
    live = LiveCaptioner(recognizer=recognizer, clock_ns=clock, timer_ns=clock, config=config)
    records: list[StepRecord] = []
    live.engine.recognizer = ChargedRecognizer(recognizer, clock, STEP_COST_S, records)
    start_s = clock() / 1e9  # the streams' sample 0: their first 100 ms arrive live...
    audio = {label: render_speech(words, BACKLOG_S, seed=k) for k, (label, words) in enumerate(SCRIPTS.items())}
    first = SAMPLE_RATE_HZ // 10
    clock.advance(0.1)
    for label, samples in audio.items():
        live.open_stream(label)
        live.streams[label].accept_waveform(SAMPLE_RATE_HZ, samples[:first], capture_ns=clock())
    assert live.step() == []
    clock.advance(BACKLOG_S - 0.1)  # ...the rest all at once
    for label, samples in audio.items():
        live.streams[label].accept_waveform(SAMPLE_RATE_HZ, samples[first:], capture_ns=clock())
    records.clear()
    return live, clock, start_s, records


def _fields(updates) -> list[tuple]:
    return [(u.stream, u.kind, u.text, u.segment, u.start_s, u.end_s, u.emitted_audio_s) for u in updates]


def test_a_steps_updates_are_dated_when_the_step_returns_them():
    live, clock, start_s, records = _backlogged()
    updates = live.step()
    returned_s = clock() / 1e9 - start_s
    assert len(records) >= 5  # several ticks with a model step each, 0.2 s apiece
    assert len(finals(updates)) >= 3
    # Made over a second and more of the step's model work, every one is seen at its end.
    assert [u.emitted_wall_s for u in updates] == pytest.approx([returned_s] * len(updates), abs=1e-6)
    newest = finals(updates)[-1]
    assert live.status().caption_latency_s == pytest.approx(returned_s - newest.end_s, abs=1e-6)


def test_with_hand_out_each_ticks_updates_leave_as_the_tick_ends():
    live, clock, start_s, records = _backlogged()
    handed: list[tuple[float, list]] = []
    assert live.step(hand_out=lambda updates: handed.append((clock() / 1e9 - start_s, updates))) == []
    assert len(handed) >= 3 and all(updates for _, updates in handed)
    previous_s = 0.0
    for at_s, updates in handed:
        for u in updates:  # dated by its own tick, after the tick before it
            assert previous_s - 1e-9 <= u.emitted_wall_s <= at_s + 1e-9, (u, previous_s, at_s)
        previous_s = at_s
    assert handed[0][0] < handed[-1][0] - 2 * STEP_COST_S  # the first left well before the last
    # The same captions as the step that returns them all, in the same order.
    again, _, _, _ = _backlogged()
    assert _fields([u for _, updates in handed for u in updates]) == _fields(again.step())


def test_a_model_host_sends_each_ticks_updates_before_the_steps_other_messages():
    """The host of a supervised captioner (a worker process on a GPU) sends a tick's
    :class:`~captioner.engine.messages.Updates` as soon as the tick ends; the checkpoints and ended streams follow
    with the step's return. Together they are what the step returned before."""

    def run(hand_out: bool) -> list[tuple]:
        core = HostCore(HostSpec("scripted", "cpu", recognizer_factory=ScriptFactory()))
        audio = {label: render_speech(words, BACKLOG_S, seed=k) for k, (label, words) in enumerate(SCRIPTS.items())}
        for label, samples in audio.items():
            core.apply(OpenStream(label))
            core.apply(FramedAudio((label,), (0,), (time.monotonic_ns(),), (samples.shape[0],), samples))
            core.apply(CloseStream(label))
        sent: list = []
        returned = core.step(sent.append) if hand_out else core.step()
        if hand_out:
            assert len(sent) >= 3 and all(type(m) is Updates for m in sent)
            assert not [m for m in returned if type(m) is Updates]
        return _plain(sent + returned)

    early, plain = run(True), run(False)
    assert early == plain
    assert {("done", label) for label in SCRIPTS} <= set(early)
    for label, words in SCRIPTS.items():
        said = [w for m in early if m[0] == "update" and m[1] == label and m[2] == "final" for w in keys(m[3])]
        assert said == keys(" ".join(w.text for w in words)), label


def test_a_supervised_captioner_passes_an_inline_hosts_ticks_on_as_they_end():
    captioner = SupervisedCaptioner(HostSpec("scripted", "cpu", recognizer_factory=ScriptFactory()), isolation="inline")
    try:
        for k, (label, words) in enumerate(SCRIPTS.items()):
            stream = captioner.open_stream(label)
            stream.accept_waveform(SAMPLE_RATE_HZ, render_speech(words, BACKLOG_S, seed=k))
            stream.finish()
        handed: list[list] = []
        deadline_s = time.monotonic() + 30
        while captioner.streams and time.monotonic() < deadline_s:
            assert captioner.step(hand_out=handed.append) == []
        assert not captioner.streams
        assert max(len({u.stream for u in updates}) for updates in handed) <= len(SCRIPTS)
        assert len(handed) >= 3
        for label, words in SCRIPTS.items():
            said = keys(" ".join(u.text for updates in handed for u in finals(updates, label)))
            assert said == keys(" ".join(w.text for w in words)), label
    finally:
        captioner.close()


def test_a_backlog_handed_over_in_one_block_keeps_the_streams_clock():
    """A stream's first 9 s arrive as one block (its capture time is its last sample's): the
    slices it is fed in carry their own capture times, so the stream's clock starts when its
    first sample was captured, and no update is dated before the audio it covers existed."""
    clock = SimClock()
    recognizer = ScriptedRecognizer(dict(SCRIPTS))
    live = LiveCaptioner(recognizer=recognizer, clock_ns=clock, timer_ns=clock,
                         config=EngineConfig(scheduler=SchedulerConfig(base_interval_s=0.5)))
    live.engine.recognizer = ChargedRecognizer(recognizer, clock, STEP_COST_S)
    clock.advance(BACKLOG_S)
    for k, (label, words) in enumerate(SCRIPTS.items()):
        live.open_stream(label)
        live.streams[label].accept_waveform(SAMPLE_RATE_HZ, render_speech(words, BACKLOG_S, seed=k),
                                            capture_ns=clock())
    updates = live.step()
    assert len(finals(updates)) >= 3
    for u in updates:
        # The step returned after all 9 s were captured, and after its own model work.
        assert u.emitted_wall_s >= BACKLOG_S, u
        assert u.emitted_wall_s >= u.emitted_audio_s, u


def test_an_inline_hosts_step_made_by_taking_audio_hands_its_captions_out_at_once():
    """With few streams a host steps as it takes a stream's next chunk (``HostCore.apply``).
    On the worker's thread those captions waited for the next ``step`` call, behind every
    message the worker took meanwhile (up to 0.9 s with four streams on this CPU's tiny.en):
    now they go to the latest ``hand_out`` at once."""
    captioner = SupervisedCaptioner(HostSpec("scripted", "cpu", recognizer_factory=ScriptFactory()), isolation="inline")
    try:
        handed: list[list] = []
        audio = {label: render_speech(words, BACKLOG_S, seed=k) for k, (label, words) in enumerate(SCRIPTS.items())}
        for label in SCRIPTS:
            captioner.open_stream(label)
        assert captioner.step(hand_out=handed.append) == []
        during_audio = 0
        for first in range(0, int(BACKLOG_S * SAMPLE_RATE_HZ), 1600):
            before = len(handed)
            for half in (first, first + 800):  # a stream's second chunk sends its first on
                for label, samples in audio.items():
                    captioner.streams[label].accept_waveform(SAMPLE_RATE_HZ, samples[half:half + 800])
            during_audio += len(handed) - before
            assert captioner.step(hand_out=handed.append) == []
        for label in SCRIPTS:
            captioner.streams[label].finish()
        deadline_s = time.monotonic() + 30
        while captioner.streams and time.monotonic() < deadline_s:
            assert captioner.step(hand_out=handed.append) == []
        # Captions of steps made while the worker handed audio over. How many of those steps
        # make captions follows the engine's measured step time (its interval and riders adapt
        # to it): 1 to 6 in twelve runs on this machine, and 1 made it fail at ">= 3" under CI's
        # load. Without the change every caption waited for a step call: none.
        assert during_audio >= 1
        for label, words in SCRIPTS.items():
            said = keys(" ".join(u.text for updates in handed for u in finals(updates, label)))
            assert said == keys(" ".join(w.text for w in words)), label
    finally:
        captioner.close()


def test_an_inline_hosts_captions_made_before_its_first_poll_are_not_overtaken():
    """A restarted inline host is re-fed before the worker polls it: with one stream the
    re-feed is stepped chunk by chunk as it is sent, and with no hand-out yet its captions wait
    in the host. The poll's step may not hand its own out past them (seen in CI: a restarted
    tiny.en host's later words went first, the seam took them for new text, and the words
    before them were shown twice)."""
    label, words = "a", SCRIPTS["a"]  # two sentences, at 1.0 and 5.5 s
    audio = render_speech(words, BACKLOG_S, seed=0)
    host = InlineHost(HostSpec("scripted", "cpu", recognizer_factory=ScriptFactory()))
    host.start()
    assert type(host.poll()[0]) is HostReady
    host.send(OpenStream(label), wait=False)
    tail = int(5.0 * SAMPLE_RATE_HZ)  # the first sentence and its pause, 100 ms a message...
    for first in range(0, tail, CHUNK):
        chunk = audio[first:min(first + CHUNK, tail)]
        host.send(FramedAudio((label,), (first,), (time.monotonic_ns(),), (chunk.shape[0],), chunk), wait=False)
    rest = audio[tail:]  # ...and the rest in one, left for the poll's step
    host.send(FramedAudio((label,), (tail,), (time.monotonic_ns(),), (rest.shape[0],), rest), wait=False)
    host.send(CloseStream(label), wait=False)
    polls: list[list] = []  # the updates of each poll, in the order the worker sees them
    done = False
    deadline_s = time.monotonic() + 30
    while not done and time.monotonic() < deadline_s:
        handed: list = []
        returned = host.poll(handed.append)
        polls.append([u for m in handed + returned if type(m) is Updates for u in m.updates])
        done = StreamDone(label) in returned
    # The first poll's step made the second sentence's captions: they had re-fed ones to overtake.
    assert "rice" in keys(" ".join(u.text for u in polls[0]))
    said = finals([u for updates in polls for u in updates])
    assert keys(" ".join(u.text for u in said)) == keys(" ".join(w.text for w in words))
    assert [u.start_s for u in said] == sorted(u.start_s for u in said)
