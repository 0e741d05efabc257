"""A live input lost and back, at the worker: its stream stays open and runs on in silence (so
what it showed is committed and its clock keeps pace), the other stream goes on, and the fresh
source's audio lands after the silence, in time order, whatever its rate.

The real worker thread with a scripted recognizer on a simulated capture clock: the recognizer
hears a scripted word only where the audio at that stream time holds speech, so a fresh source
placed at the wrong time loses its words instead of passing.
"""

from __future__ import annotations

import queue
import time

import numpy as np
import pytest
from scripted import ScriptedRecognizer, finals, keys, phrase, render_speech

from captioner.audio.source import RawChunk
from captioner.engine.live import LiveCaptioner
from captioner.engine.simulate import SimClock
from captioner.engine.worker import InputBack, InputLoss, InputLost, OpenStream, Worker
from captioner.events import SAMPLE_RATE_HZ, CaptionUpdate

CHUNK_S = 0.05
BEFORE_S = 3.0  # audio of the first source
AWAY_S = 4.0  # time between the first source's last sample and the fresh source's first
BEFORE = phrase("alpha bravo charlie", 0.5)
AFTER_AT_S = BEFORE_S + AWAY_S  # where the fresh source's sample 0 belongs on the stream clock
AFTER = phrase("delta echo foxtrot", AFTER_AT_S + 0.5)
OTHER = phrase("kilo lima mike", BEFORE_S + 0.5)  # spoken on the other stream while "Me" is away


class Session:
    """A worker fed by the test, on a simulated clock; updates and statuses collected."""

    def __init__(self) -> None:
        self.clock = SimClock()
        self.recognizer = ScriptedRecognizer({"Me": BEFORE + AFTER, "Other": OTHER})
        self.inbox: queue.Queue = queue.Queue()
        self.updates: list = []
        self.statuses: list = []
        self.worker = Worker(
            lambda: LiveCaptioner(recognizer=self.recognizer, clock_ns=self.clock, timer_ns=self.clock),
            self.inbox, self._delivered, self.statuses.append, clock_ns=self.clock, status_period_s=0.02,
        )
        self.other = render_speech(OTHER, 12.0, seed=1)
        self.other_at = 0  # next sample of "Other" to send

    def _delivered(self, items: list) -> None:
        self.updates.extend(item for item in items if type(item) is CaptionUpdate)  # lifecycle events aside

    def start(self) -> None:
        for label in ("Me", "Other"):
            self.inbox.put(OpenStream(label))
        self.worker.start()
        assert self.worker.ready.wait(10) and self.worker.error is None

    def play(self, seconds: float, me: np.ndarray | None = None, me_rate_hz: int = SAMPLE_RATE_HZ,
             me_first: int = 0) -> None:
        """``seconds`` of capture: "Other" always, "Me" when given (its own clock from ``me_first``)."""
        me_chunk = int(round(CHUNK_S * me_rate_hz))
        other_chunk = int(round(CHUNK_S * SAMPLE_RATE_HZ))
        for i in range(int(round(seconds / CHUNK_S))):
            self.clock.advance(CHUNK_S)
            now_ns = self.clock()
            if me is not None:
                at = i * me_chunk
                self.inbox.put(RawChunk("Me", me_rate_hz, me_first + at, now_ns, me[at:at + me_chunk]))
            piece = self.other[self.other_at:self.other_at + other_chunk]
            self.inbox.put(RawChunk("Other", SAMPLE_RATE_HZ, self.other_at, now_ns, piece))
            self.other_at += other_chunk
            self.settle()

    def settle(self, timeout_s: float = 10.0) -> None:
        """Waits until the worker has taken everything sent (and stepped on it)."""
        deadline = time.monotonic() + timeout_s
        while self.inbox.unfinished_tasks and not self.inbox.empty():
            assert time.monotonic() < deadline, "the worker fell behind"
            time.sleep(0.001)
        time.sleep(0.002)

    def stop(self) -> None:
        self.worker.stop_event.set()
        self.worker.join(10)
        assert not self.worker.is_alive() and self.worker.error is None, self.worker.error


@pytest.mark.parametrize("fresh_rate_hz", [SAMPLE_RATE_HZ, 48_000], ids=["same-rate", "other-rate"])
def test_a_lost_input_runs_on_in_silence_and_its_fresh_source_lands_after_it(fresh_rate_hz):
    session = Session()
    session.start()
    try:
        session.play(BEFORE_S, me=render_speech(BEFORE, BEFORE_S))
        session.inbox.put(InputLost("Me", "its device was unplugged"))
        session.play(AWAY_S)  # "Me" delivers nothing; "Other" goes on
        lost_statuses = [s for s in session.statuses if s.lost_inputs]
        during = len(session.updates)
        assert session.worker.lost_inputs == {"Me": "its device was unplugged"}

        session.inbox.put(InputBack("Me"))
        fresh = render_speech([type(w)(w.text, w.start_s - AFTER_AT_S, w.end_s - AFTER_AT_S) for w in AFTER], 3.0)
        if fresh_rate_hz != SAMPLE_RATE_HZ:
            fresh = np.repeat(fresh, fresh_rate_hz // SAMPLE_RATE_HZ)  # a device back at another rate
        session.play(3.0, me=fresh, me_rate_hz=fresh_rate_hz)
        assert session.worker.lost_inputs == {}
        session.play(1.5)
    finally:
        session.stop()

    updates = session.updates
    # Lost: said in the status at once, with why, and the stream stays open.
    assert lost_statuses and lost_statuses[0].lost_inputs == ("Me",) and "Me" in lost_statuses[0].streams
    assert "input 'Me' lost (its device was unplugged); waiting for it to come back" in lost_statuses[0].message
    # What "Me" said before the loss was committed while it was away (its silence closed the
    # segment); "Other" captioned all along.
    assert keys(" ".join(u.text for u in finals(updates[:during], "Me"))) == keys(BEFORE)
    assert keys(" ".join(u.text for u in finals(updates[:during], "Other"))) == keys(OTHER)
    # Back: the fresh source's words are heard where they belong on the stream clock (the
    # recognizer hears nothing where the audio is silent), after everything before the loss.
    me = finals(updates, "Me")
    assert keys(" ".join(u.text for u in me)) == keys(BEFORE) + keys(AFTER)
    after = [u for u in me if u.start_s >= AFTER_AT_S]
    assert after and after[0].start_s == pytest.approx(AFTER[0].start_s, abs=0.05)
    assert all(a.end_s <= b.start_s + 1e-6 for a, b in zip(me, me[1:])), [(u.start_s, u.end_s) for u in me]
    # The time away, on the capture clock; no frame counted as dropped for it.
    loss = session.worker.input_losses["Me"]
    assert loss.count == 1 and loss.lost_s == pytest.approx(AWAY_S, abs=0.06)
    assert "Other" not in session.worker.input_losses
    final_status = session.statuses[-1]
    assert final_status.state == "stopped" and final_status.lost_inputs == () and final_status.dropped_frames == 0


def test_a_fresh_source_that_never_delivers_is_one_loss_not_two():
    session = Session()
    session.start()
    try:
        session.play(1.0, me=render_speech([], 1.0))
        session.inbox.put(InputLost("Me", "no audio for 1.0 s"))
        session.play(1.0)
        session.inbox.put(InputBack("Me"))  # opened, but its first block never comes ...
        session.play(1.0)
        session.inbox.put(InputLost("Me", "no audio for 5.0 s"))  # ... so the watch gives up on it
        session.play(1.0)
        assert session.worker.lost_inputs == {"Me": "no audio for 5.0 s"}
    finally:
        session.stop()
    assert session.worker.input_losses["Me"] == InputLoss(count=1, lost_s=pytest.approx(3.0, abs=0.06))
    # The stream's clock kept pace all along: 1 s of audio, then silence up to the stop.
    assert session.worker.lost_inputs == {}
