"""The worker's audio reaches the model's host in batches (issue 13: a thousand served streams
sent ten thousand chunks a second, each pickled, written, read and unpickled on its own), and a
host with many streams spaces its steps. Neither may change a caption or a checkpoint."""

from __future__ import annotations

import time

import numpy as np
import pytest
from scripted import ScriptedRecognizer, keys, phrase, render_speech

from captioner.engine.host import (
    BACKLOG_STEP_S,
    MAX_QUEUED,
    QUEUED_PER_STREAM,
    STEP_SPACING_MAX_S,
    HostCore,
    HostSpec,
    ProcessHost,
)
from captioner.engine.messages import (
    Checkpoint,
    CloseStream,
    HostReady,
    OpenStream,
    Refused,
    StreamDone,
    StreamOpened,
    Updates,
)
from captioner.engine.supervisor import SupervisedCaptioner
from captioner.events import SAMPLE_RATE_HZ, FramedAudio
from captioner.gpu.backend import cpu_backend

DURATION_S = 9.0
CHUNK = 1600  # 100 ms, as a served client sends
SCRIPTS = {
    "a": phrase("the birch canoe slid on the smooth planks", 1.0) + phrase("rice is often served", 5.5),
    "b": phrase("glue the sheet to the dark blue background", 1.6),
    "c": phrase("it is easy to tell the depth of a well", 2.2) + phrase("the juice of lemons", 6.4),
}


class ScriptFactory:
    def __call__(self):
        return cpu_backend(), ScriptedRecognizer(dict(SCRIPTS))


def _core() -> HostCore:
    core = HostCore(HostSpec("scripted", "cpu", recognizer_factory=ScriptFactory()))
    for label in SCRIPTS:
        core.apply(OpenStream(label))
    return core


def _audio() -> dict[str, np.ndarray]:
    return {label: render_speech(words, DURATION_S, seed=k) for k, (label, words) in enumerate(SCRIPTS.items())}


def _run(core: HostCore, batched: bool) -> list[tuple]:
    """Round by round (100 ms of every stream), a message per chunk or one per round; the
    host steps after each round; the streams end; what came back, wall-clock fields left out."""
    audio = _audio()
    out = []
    for first in range(0, int(DURATION_S * SAMPLE_RATE_HZ), CHUNK):
        now_ns = time.monotonic_ns()
        pieces = [(label, first, now_ns, samples[first:first + CHUNK]) for label, samples in audio.items()]
        if batched:
            labels, firsts, stamps, chunks = zip(*pieces)
            out += core.apply(FramedAudio(labels, firsts, stamps, tuple(c.shape[0] for c in chunks),
                               np.concatenate(chunks)))
        else:
            for label, first, stamp, chunk in pieces:
                out += core.apply(FramedAudio((label,), (first,), (stamp,), (chunk.shape[0],), chunk))
        out += core.step()
    for label in SCRIPTS:
        out += core.apply(CloseStream(label))
    for _ in range(50):
        out += core.step()
    return _plain(out)


def _plain(messages: list) -> list[tuple]:
    kept = []
    for message in messages:
        match message:
            case Updates(updates=updates):
                kept += [("update", u.stream, u.kind, u.text, u.start_s, u.end_s, u.segment) for u in updates]
            case Checkpoint():
                kept.append(("checkpoint", message.label, message.sample, message.history))
            case StreamDone(label=label):
                kept.append(("done", label))
    return kept


def test_a_batch_of_chunks_captions_and_checkpoints_as_the_chunks_one_by_one():
    one_by_one = _run(_core(), batched=False)
    batched = _run(_core(), batched=True)
    assert batched == one_by_one
    finals = {}
    for message in batched:
        if message[0] == "update" and message[2] == "final":
            finals.setdefault(message[1], []).extend(keys(message[3]))
    assert finals == {label: keys(words) for label, words in SCRIPTS.items()}
    assert any(m[0] == "checkpoint" for m in batched)  # the pauses were seen
    assert sorted(m[1] for m in batched if m[0] == "done") == sorted(SCRIPTS)


def test_with_few_streams_a_streams_second_chunk_steps_the_first():
    """A desktop's one or two streams: a backlog (a re-feed after a restart, a file handed over
    at once) is stepped chunk by chunk, so its pauses and checkpoints fall as they would live."""
    core = _core()
    chunk = np.zeros(CHUNK, np.float32)
    now_ns = time.monotonic_ns()
    core.apply(FramedAudio(("a", "b"), (0, 0), (now_ns, now_ns), (CHUNK, CHUNK), np.concatenate([chunk, chunk])))
    core.apply(FramedAudio(("c",), (0,), (now_ns,), (CHUNK,), chunk))
    assert {v.name: v.audio_end_s for v in core.live.engine.views()} == {"a": 0.0, "b": 0.0, "c": 0.0}
    core.apply(FramedAudio(("b",), (CHUNK,), (now_ns,), (CHUNK,), chunk))
    views = {v.name: v.audio_end_s for v in core.live.engine.views()}
    # The chunks before b's second were stepped (features lag the audio by a frame).
    assert sorted(views) == ["a", "b", "c"] and all(0.08 <= end_s <= 0.1 for end_s in views.values())


def test_a_streams_chunks_wait_for_the_next_step_together():
    """Chunks of one stream that come together (a network's jitter: two of a client's messages in
    one front-end frame; a step that ran long) wait for the step with every other stream's: a
    second chunk does not step the first (on an H200 that made 20 model steps a second of 25
    rows, and the engine fell behind), and the step feeds each 100 ms where it lies."""
    core = _core()
    for k in range(300):  # quiet company: the step spacing of a busy server (100 ms)
        core.apply(OpenStream(f"quiet{k}"))
    core.step()
    chunk = np.zeros(CHUNK, np.float32)
    now_ns = time.monotonic_ns()
    core.apply(FramedAudio(("a", "b"), (0, 0), (now_ns, now_ns), (CHUNK, CHUNK), np.concatenate([chunk, chunk])))
    core.apply(FramedAudio(("b", "c"), (CHUNK, 0), (now_ns, now_ns), (CHUNK, CHUNK), np.concatenate([chunk, chunk])))
    core.apply(FramedAudio(("b",), (2 * CHUNK,), (now_ns,), (CHUNK,), chunk))
    assert {v.name: v.audio_end_s for v in core.live.engine.views(names=set("abc"))} == {"a": 0.0, "b": 0.0, "c": 0.0}
    time.sleep(core.step_wait_s())
    core.step()
    ends = {v.name: v.audio_end_s for v in core.live.engine.views(names=set("abc"))}
    # All of it in one step (features lag the audio by a frame).
    assert 0.28 <= ends["b"] <= 0.3 and all(0.08 <= ends[label] <= 0.1 for label in "ac")


def test_opens_and_finishes_leave_the_waiting_audio_for_the_next_step():
    """A refused retry storm or streams ending by the dozen must not step the engine once per
    message: an open (taken or refused) and a finish leave the audio waiting for the next step,
    and a finished stream's own waiting audio is still captioned before its end."""
    from captioner.engine.admission import AdmissionConfig
    from captioner.engine.core import EngineConfig

    spec = HostSpec("scripted", "cpu", recognizer_factory=ScriptFactory(),
                    config=EngineConfig(admission=AdmissionConfig(time_budget="on", growth_streams=3)))
    core = HostCore(spec)
    for label in ("a", "b"):
        core.apply(OpenStream(label))
    speech = _audio()["a"][:int(4.5 * SAMPLE_RATE_HZ)]  # a's first phrase, from 1.0 s
    core.apply(FramedAudio(("a",), (0,), (time.monotonic_ns(),), (speech.shape[0],), speech))
    assert core.apply(OpenStream("c")) == [StreamOpened("c")]
    refused = core.apply(OpenStream("d"))
    assert [type(m) for m in refused] == [Refused]
    assert core.apply(CloseStream("b")) == []
    assert core.apply(CloseStream("a")) == []
    assert core.has_unstepped  # a's audio still waits for the next step
    assert {v.name: v.audio_end_s for v in core.live.engine.views()}["a"] == 0.0
    out = []
    for _ in range(80):
        out += core.step()
    plain = _plain(out)
    finals = [word for m in plain if m[0] == "update" and m[1] == "a" and m[2] == "final" for word in keys(m[3])]
    assert finals == keys("the birch canoe slid on the smooth planks")
    assert ("done", "a") in plain and ("done", "b") in plain


def test_a_busy_hosts_step_feeds_two_waiting_chunks_in_one_tick():
    """A stream with two chunks waiting (a network's jitter) is fed both in one engine tick on a
    busy host: a second tick for the few such streams was a model step of a few rows."""
    core = _core()
    for k in range(300):
        core.apply(OpenStream(f"quiet{k}"))
    core.step()
    chunk = np.zeros(CHUNK, np.float32)
    now_ns = time.monotonic_ns()
    for at in (0, CHUNK):
        core.apply(FramedAudio(("a",), (at,), (now_ns,), (CHUNK,), chunk))
    ticks = []
    tick = core.live.engine.tick
    core.live.engine.tick = lambda: (ticks.append(1), tick())[1]
    time.sleep(core.step_wait_s())
    core.step()
    assert len(ticks) == 1
    assert {v.name: v.audio_end_s for v in core.live.engine.views(names={"a"})}["a"] >= 0.18


def test_chunks_that_come_together_lose_nothing_and_make_no_extra_steps():
    """With many streams, two of every stream's chunks at once between steps: no step until the
    spacing has passed, and the words come out whole, each stream's in order, before its end."""
    core = _core()
    for k in range(300):  # quiet company: the step spacing of a busy server (100 ms)
        core.apply(OpenStream(f"quiet{k}"))
    audio = _audio()
    out = core.step()
    steps = core.live.engine.steps

    last = int(DURATION_S * SAMPLE_RATE_HZ) - 2 * CHUNK
    for first in range(0, last + 1, 2 * CHUNK):
        for at in (first, first + CHUNK):
            labels = tuple(SCRIPTS)
            pieces = [audio[label][at:at + CHUNK] for label in labels]
            now_ns = time.monotonic_ns()
            out += core.apply(FramedAudio(labels, (at,) * 3, (now_ns,) * 3, tuple(p.shape[0] for p in pieces),
                               np.concatenate(pieces)))
        assert not core.step_due()  # the spacing has not passed: both chunks wait
        time.sleep(core.step_wait_s())
        out += core.step()
    for label in SCRIPTS:
        out += core.apply(CloseStream(label))
    for _ in range(60):
        out += core.step()
    finals: dict[str, list[str]] = {}
    for message in _plain(out):
        if message[0] == "update" and message[2] == "final":
            finals.setdefault(message[1], []).extend(keys(message[3]))
    assert finals == {label: keys(words) for label, words in SCRIPTS.items()}
    assert core.live.streams.keys().isdisjoint(SCRIPTS)
    assert steps < core.live.engine.steps


def test_a_backlog_is_stepped_a_second_at_a_time():
    """A backlog handed over at once (a re-feed after a restart) is stepped as it comes, every
    ``BACKLOG_STEP_S`` of the stream, not held for one step at the end (its captions and the
    host's heartbeat would wait for all of it)."""
    core = _core()
    for k in range(300):
        core.apply(OpenStream(f"quiet{k}"))
    core.step()
    speech = _audio()["a"]
    for k in range(35):  # 3.5 s of a's audio, back to back
        at = k * CHUNK
        core.apply(FramedAudio(("a",), (at,), (time.monotonic_ns(),), (CHUNK,), speech[at:at + CHUNK]))
    end_s = {v.name: v.audio_end_s for v in core.live.engine.views(names={"a"})}["a"]
    # Stepped along the way (at 1, 2 and 3 s); what came since waits for the next step.
    assert 3.5 - BACKLOG_STEP_S - 0.1 <= end_s <= 3.4


def test_a_host_with_many_streams_spaces_its_steps_and_one_with_few_does_not():
    core = _core()
    core.step()
    assert core.step_wait_s() < 0.002  # three streams: 1.2 ms at most
    for k in range(1000):
        core.apply(OpenStream(f"quiet{k}"))
    core.step()
    wait_s = core.step_wait_s()
    assert 0.0 < wait_s <= STEP_SPACING_MAX_S
    time.sleep(wait_s)
    assert core.step_wait_s() == 0.0


class _Recorder:
    """A host that keeps what it is sent (the supervisor's side of the batching)."""

    kind = "inline"
    failed = None

    def __init__(self) -> None:
        self.sent: list[tuple] = []

    def send(self, message, wait=True, chunks=1):
        self.sent.append((message, chunks))

        self.replies: list[tuple] = []

    def poll(self, hand_out=None):
        out, self.replies = self.replies, []
        return out


def test_the_supervisor_sends_a_steps_chunks_as_one_batch_each_stream_once_in_order(monkeypatch):
    supervisor = SupervisedCaptioner(HostSpec("scripted", "cpu", recognizer_factory=ScriptFactory()),
                                     isolation="inline")
    recorder = _Recorder()
    supervisor._host.stop()
    supervisor._host = recorder
    streams = {label: supervisor.open_stream(label) for label in ("x", "y")}
    chunk = np.full(CHUNK, 0.01, np.float32)
    for label in ("x", "y"):
        streams[label].accept_waveform(SAMPLE_RATE_HZ, chunk)
    streams["x"].accept_waveform(SAMPLE_RATE_HZ, chunk * 2)  # x again: the batch before goes first
    streams["y"].finish()  # a message goes after the audio framed before it
    supervisor.step()
    assert [(m, n) for m, n in recorder.sent if type(m) is not FramedAudio] == \
        [(OpenStream("x"), 1), (OpenStream("y"), 1), (CloseStream("y"), 1)]
    assert [(type(m), n) for m, n in recorder.sent] == \
        [(OpenStream, 1), (OpenStream, 1), (FramedAudio, 2), (FramedAudio, 1), (CloseStream, 1)]
    first = recorder.sent[2][0]
    assert first.streams == ("x", "y") and first.firsts == (0, 0) and first.lengths == (CHUNK, CHUNK)
    np.testing.assert_array_equal(first.samples, np.concatenate([chunk, chunk]))
    second = recorder.sent[3][0]
    assert second.streams == ("x",) and second.firsts == (CHUNK,)
    np.testing.assert_array_equal(second.samples, chunk * 2)
    # Each chunk is also kept for a re-feed, whatever message carried it.
    assert streams["x"].ring_samples == 2 * CHUNK and streams["y"].ring_samples == CHUNK
    assert recorder.streams_open == 2  # told with the audio: a process host's queue bound follows


def test_a_process_hosts_queue_bound_grows_with_its_streams():
    # A served engine's worker must not wait on a child busy with one model step while a
    # thousand connections' chunks queue: the bound is per open stream, not one stream's 10 s.
    host = ProcessHost(HostSpec("scripted", "cpu", recognizer_factory=ScriptFactory()))
    assert host.queue_limit() == MAX_QUEUED
    host.streams_open = 1000
    assert host.queue_limit() == MAX_QUEUED + 1000 * QUEUED_PER_STREAM >= 10 * 1000  # a second of 100 ms chunks


class QuietFactory:
    """A picklable recognizer factory for a process host: the scripted listener, no words."""

    def __call__(self):
        return cpu_backend(), ScriptedRecognizer({})


@pytest.mark.parametrize("isolation", ["process", "none"])
def test_a_stream_the_hosts_engine_refuses_is_never_listed(tmp_path, isolation):
    """A stream is listed in the status (for a server: its client is told "ready") only once the
    engine in the model's process took it; one its admission refuses is reported refused and
    never listed. (On the H200, 771 of 1,000 clients were told "ready" and then got nothing.)
    A refused source's stream is one of the pipeline's source errors, so `listen` and the app
    say it, each in the admission's words."""
    import soundfile as sf

    from captioner.audio.file_source import FileSource
    from captioner.engine.admission import AdmissionConfig
    from captioner.engine.core import EngineConfig
    from captioner.engine.pipeline import Pipeline

    path = tmp_path / "quiet.wav"
    sf.write(path, np.zeros(4 * SAMPLE_RATE_HZ, np.float32), SAMPLE_RATE_HZ)
    config = EngineConfig(admission=AdmissionConfig(time_budget="on", growth_streams=2, growth_fraction=0.0,
                                                    growth_window_s=600.0))
    pipeline = Pipeline([], isolation=isolation, recognizer_factory=QuietFactory(), config=config)
    pipeline.start()
    listed: set[str] = set()
    refused: dict[str, str] = {}

    def take_refusals() -> None:  # the Refused events of the pipeline's outbox
        refused.update((e.label, e.reason) for e in pipeline.drain() if type(e) is Refused)

    try:
        for k in range(4):
            pipeline.add_source(FileSource(path, stream=f"s{k}", realtime=True))
        deadline = time.monotonic() + 60
        while len(refused) < 2 and time.monotonic() < deadline:
            take_refusals()
            status = pipeline.latest_status()
            listed |= set(status.streams) if status is not None else set()
            time.sleep(0.01)
        for _ in range(30):  # a few more status reports
            status = pipeline.latest_status()
            listed |= set(status.streams) if status is not None else set()
            time.sleep(0.02)
        said = pipeline.latest_status().message
        errors = pipeline.source_errors
    finally:
        pipeline.stop()
    take_refusals()
    assert set(refused) == {"s2", "s3"}
    assert listed == {"s0", "s1"}
    assert errors == refused
    assert all(f"stream {label!r} refused for now" in why for label, why in errors.items())
    assert all(why in said for why in errors.values())


def test_a_stream_is_listed_once_the_host_took_it_and_never_when_refused():
    supervisor = SupervisedCaptioner(HostSpec("scripted", "cpu", recognizer_factory=ScriptFactory()),
                                     isolation="inline")
    recorder = _Recorder()
    supervisor._host.stop()
    supervisor._host = recorder
    supervisor.open_stream("taken")
    supervisor.open_stream("turned-away")
    assert supervisor.status().streams == ()  # the host has not answered yet
    recorder.replies = [StreamOpened("taken"), Refused("turned-away", "at capacity")]
    supervisor.step()
    assert supervisor.status().streams == ("taken",)
    assert {e.label: e.reason for e in supervisor.take_lifecycle() if type(e) is Refused} == {"turned-away": "at capacity"}
    recorder.replies = [StreamDone("taken")]
    supervisor.step()
    assert supervisor.status().streams == ()


def test_a_model_process_outlives_a_stop_signal_until_its_parent_closes_it():
    """A service manager stops a unit by signalling every process in it (systemd's default): the
    model's process must stay for the server's drain, which captions through it, and end only
    when its parent closes it."""
    import os
    import signal

    host = ProcessHost(HostSpec("scripted", "cpu", recognizer_factory=QuietFactory()))
    host.start()
    try:
        deadline_s = time.monotonic() + 60
        while not any(type(m) is HostReady for m in host.poll()) and time.monotonic() < deadline_s:
            time.sleep(0.05)
        pid = host.process.pid
        for stop in (signal.SIGTERM, signal.SIGINT):
            os.kill(pid, stop)
        time.sleep(0.5)
        assert host.process.poll() is None  # still there
        host.send(OpenStream("a"), wait=False)
        deadline_s = time.monotonic() + 10
        opened = []
        while not opened and time.monotonic() < deadline_s:
            opened = [m for m in host.poll() if type(m) is StreamOpened]
            time.sleep(0.02)
        assert opened == [StreamOpened("a")]  # and still answering
    finally:
        host.stop()
    assert host.process.poll() is not None
