"""A model process's captions reach the worker's owner as soon as they arrive.

Issue 13: on an H200 serving a thousand connections, a caption spent p50 1.4 / p99 25 ms
between the serving process receiving it from its model process and the worker picking it up,
and on this CPU with two clients p50 22 / max 102 ms: the worker slept on its inbox until the
next chunk or status report, and nothing woke it for what the model process sent. The model
process also worked out a step's checkpoints and status before it sent the step's captions
(2.5 ms at p50 on the H200), and the worker sent its audio, which waits for room in the queue
to a busy model process, before it looked for captions. Once woken, a worker still took in every
item of its inbox (up to 200) and stepped before it passed the captions on, and a send that
waited for room held them too."""

from __future__ import annotations

import queue
import threading
import time

import numpy as np
from scripted import Delivered, finals, keys, render_speech
from test_host_batching import SCRIPTS, ScriptFactory, _plain, _Recorder

from captioner.audio.source import RawChunk, SourceEnd
from captioner.engine.host import HostCore, HostSpec
from captioner.engine.messages import WAKE, CloseStream, HostStatus, OpenStream, Updates
from captioner.engine.supervisor import SupervisedCaptioner
from captioner.engine.worker import Worker
from captioner.events import SAMPLE_RATE_HZ, CaptionUpdate, FramedAudio

SPEECH_S = 9.0
STATUS_PERIOD_S = 120.0  # the worker's only timer: without a wake it sleeps this long


def test_a_model_processs_captions_wake_a_worker_asleep_on_its_inbox():
    inbox: queue.Queue = queue.Queue(maxsize=1000)
    deliver = Delivered()
    worker = Worker(lambda: SupervisedCaptioner(HostSpec("scripted", "cpu", recognizer_factory=ScriptFactory()),
                                                isolation="process", standby=False),
                    inbox, deliver, lambda status: None, status_period_s=STATUS_PERIOD_S)
    worker.start()
    try:
        assert worker.ready.wait(60) and worker.error is None
        for k, (label, words) in enumerate(SCRIPTS.items()):
            inbox.put(OpenStream(label))
            samples = render_speech(words, SPEECH_S, seed=k)
            inbox.put(RawChunk(label, SAMPLE_RATE_HZ, 0, time.monotonic_ns(), samples))
            inbox.put(SourceEnd(label))
        # Everything is in the inbox; the worker takes it, steps once, then sleeps on it. The
        # model process works the audio through after that, and its captions must come out
        # while the worker has nothing else to wake it.
        deadline_s = time.monotonic() + 30
        while time.monotonic() < deadline_s:
            said = deliver.said(SCRIPTS)
            if all(said[label] == keys(" ".join(w.text for w in words)) for label, words in SCRIPTS.items()):
                break
            time.sleep(0.05)
        assert time.monotonic() < deadline_s, f"captions still with the worker: {said}"
    finally:
        worker.stop_event.set()
        worker.wake()
        worker.join(30)
    assert not worker.is_alive()


def test_a_wake_is_one_inbox_item_however_often_it_is_rung():
    inbox: queue.Queue = queue.Queue(maxsize=4)
    worker = Worker(lambda: None, inbox, lambda updates: None, lambda status: None)
    for _ in range(10):
        worker.wake()
    assert inbox.qsize() == 1 and inbox.get_nowait() is WAKE
    worker._apply(None, WAKE)  # taken: the next message rings again
    worker.wake()
    assert inbox.get_nowait() is WAKE
    for _ in range(4):  # a full inbox: the worker is busy with it, and nothing waits to go in
        inbox.put_nowait(object())
    worker._apply(None, WAKE)
    worker.wake()
    assert inbox.qsize() == 4


def test_a_model_process_sends_a_steps_captions_before_its_checkpoints_and_status():
    def run(send_first: bool) -> list[tuple]:
        core = HostCore(HostSpec("scripted", "cpu", recognizer_factory=ScriptFactory()))
        sent: list = []
        if send_first:
            core.send_updates = sent.append
        for k, (label, words) in enumerate(SCRIPTS.items()):
            samples = render_speech(words, SPEECH_S, seed=k)
            core.apply(OpenStream(label))
            core.apply(FramedAudio((label,), (0,), (time.monotonic_ns(),), (samples.shape[0],), samples))
            core.apply(CloseStream(label))
        returned = core.step()
        if send_first:
            assert sent and all(type(m) is Updates for m in sent)
            assert not [m for m in returned if type(m) is Updates]
            assert any(type(m) is HostStatus for m in returned)
            assert {("done", label) for label in SCRIPTS} <= set(_plain(returned))
        return _plain(sent + returned)

    assert run(True) == run(False)


class _ProcessRecorder(_Recorder):
    """A model process's side as the supervisor sees it: what it is sent, and when it is polled."""

    kind = "process"

    def poll(self, hand_out=None):
        self.sent.append((("poll",), 0))
        return super().poll(hand_out)

    def check(self, heartbeat_timeout_s, load_timeout_s):
        return None


def test_a_supervisor_takes_a_model_processs_captions_before_sending_it_audio():
    supervisor = SupervisedCaptioner(HostSpec("scripted", "cpu", recognizer_factory=ScriptFactory()),
                                     isolation="inline")
    supervisor._host.stop()
    host = supervisor._host = _ProcessRecorder()
    stream = supervisor.open_stream("x")
    stream.accept_waveform(SAMPLE_RATE_HZ, np.full(1600, 0.01, np.float32))
    host.sent.clear()
    supervisor.step()
    # The send of a step's audio may wait for room while the process steps: captions first.
    assert [m if isinstance(m, tuple) else type(m) for m, _ in host.sent] == [("poll",), FramedAudio, ("poll",)]


def _speak_and_wait(worker: Worker, live: SupervisedCaptioner, label: str = "a") -> None:
    """``label``'s speech to the model process, on this thread, until its captions wait in the
    serving side's queue (nobody is told: the test says when they "arrive")."""
    live.on_host_message = None
    worker._apply(live, OpenStream(label))
    worker._apply(live, RawChunk(label, SAMPLE_RATE_HZ, 0, time.monotonic_ns(), render_speech(SCRIPTS[label], SPEECH_S)))
    worker._apply(live, SourceEnd(label))
    live.step(hand_out=lambda updates: None)  # the audio goes; nothing has come back yet
    deadline_s = time.monotonic() + 30
    while not any(type(m) is Updates and finals(m.updates, label) for m in list(live._host._incoming.queue)):
        assert time.monotonic() < deadline_s, "the model process sent no captions"
        time.sleep(0.01)


def _worker_on_this_thread(delivered: list, note) -> tuple[Worker, SupervisedCaptioner, queue.Queue]:
    inbox: queue.Queue = queue.Queue(maxsize=1000)

    def deliver(items) -> None:
        updates = [item for item in items if type(item) is CaptionUpdate]  # lifecycle events aside
        if updates:
            delivered.extend(updates)
            note()

    worker = Worker(lambda: SupervisedCaptioner(HostSpec("scripted", "cpu", recognizer_factory=ScriptFactory()),
                                                isolation="process", standby=False),
                    inbox, deliver, lambda status: None, status_period_s=STATUS_PERIOD_S)
    live = worker.captioner = worker._make_captioner()
    worker._attach(live)
    return worker, live, inbox


def test_a_busy_worker_hands_out_a_model_processs_captions_after_the_item_in_hand():
    delivered: list = []
    seen_b_samples: list[int] = []  # how much of b's audio the worker had taken when captions went out
    worker, live, inbox = _worker_on_this_thread(
        delivered, lambda: seen_b_samples.append(live.streams["b"].ring_samples if "b" in live.streams else -1))
    try:
        _speak_and_wait(worker, live)
        inbox.put(OpenStream("b"))
        chunk_samples = SAMPLE_RATE_HZ // 10
        for k in range(30):  # 3 s of b's audio came in before a's captions did
            inbox.put(RawChunk("b", SAMPLE_RATE_HZ, k * chunk_samples, time.monotonic_ns(),
                               np.zeros(chunk_samples, np.float32)))
        worker.wake()  # a's captions "arrive" now, behind b's audio in the inbox
        worker._turn(live, 0.0)
        assert finals(delivered, "a"), "a's captions did not come out"
        # Out after the item in hand (b's opening), not after b's 30 chunks and a step.
        assert seen_b_samples[0] == 0, seen_b_samples
    finally:
        live.close()


def test_a_send_that_waits_for_room_hands_out_what_the_model_process_sent_meanwhile():
    delivered: list = []
    worker, live, inbox = _worker_on_this_thread(delivered, lambda: None)
    host = live._host
    try:
        _speak_and_wait(worker, live)
        worker._apply(live, OpenStream("b"))
        live.step(hand_out=worker._deliver)
        _speak_and_wait(worker, live, "c")
        # The queue to the model process is full: the next send waits for room, which comes
        # only once the captions that arrived meanwhile have gone out.
        delivered.clear()
        full = host._put_chunks
        host._put_chunks = host._sent_chunks + host.queue_limit()

        def deliver(updates) -> None:
            delivered.extend(updates)
            host._put_chunks = full  # room again

        live.hand_out_now = deliver
        sender = threading.Thread(target=live._send, args=(CloseStream("b"),), daemon=True)
        sender.start()
        sender.join(10.0)
        host._put_chunks = full  # a send still waiting gets its room: the test ends either way
        sender.join(10.0)
        assert finals(delivered, "c"), "the captions waited with the send"
    finally:
        live.close()
