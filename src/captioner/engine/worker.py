"""The thread that owns one engine (and so one GPU); it takes the messages of
:mod:`captioner.engine.messages`.

The worker blocks on ONE inbox: audio chunks straight from the sources (a PortAudio callback
or a replay thread puts them there), the ends of finite sources, and commands from the owner.
One queue keeps their order (a stream is opened before its first audio, a model swap falls
between the audio before and after it), and nothing polls: with nothing to do the worker sleeps
until an item arrives or a status report is due. Each chunk goes to its stream of the public
API's :class:`~captioner.engine.live.LiveCaptioner` (which resamples and frames it), then the
captioner's ``step`` runs the model work that is due; caption updates leave through the
``deliver`` callback.

A live input whose device stopped (:class:`InputLost`) keeps its stream open: the worker feeds
it silence at the pace of the wall clock, so what it showed is committed when the silence
closes the segment, and its clock keeps running. A fresh source for it (:class:`InputBack`)
counts its samples from 0 again; its chunks are placed after that silence, so the captions and
the transcript stay in time order across the loss.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from captioner.audio.ingest import to_float_mono
from captioner.audio.source import RawChunk, SourceEnd
from captioner.engine.live import LiveCaptioner
from captioner.engine.messages import (
    WAKE,
    CloseStream,
    InputBack,
    InputLost,
    OpenStream,
    SetLanguage,
    StreamDone,
    SwapModel,
    WorkerCommand,
)
from captioner.errors import StreamRefused, one_line
from captioner.events import SAMPLE_RATE_HZ, CaptionUpdate, FramedAudio, PipelineStatus

MAX_ITEMS_PER_STEP = 200
"""Inbox items taken before the captioner steps (about 4 s of 20 ms chunks): a backlog is
worked through in slices, with status reports and commands in between. A :class:`FramedAudio`
counts as one item per stream it carries."""

STEPS_KEPT = 32
"""Recent steps whose longest is :attr:`Worker.away_s`."""

SILENCE_PIECE_S = 1.0
"""Longest piece of silence handed to a lost input's stream at once."""
SILENCE_LAG_S = 0.2
"""A lost input's silence runs this far behind the clock: a fresh source's first block, captured
just before the worker looks, still finds its place after the silence instead of inside it."""


InboxItem = RawChunk | FramedAudio | SourceEnd | WorkerCommand


@dataclass(frozen=True, slots=True)
class InputLoss:
    """What a live input's losses came to: how often it was lost, and for how long in all."""

    count: int = 0
    lost_s: float = 0.0


class _InputClock:
    """One live stream's native sample clock across the sources it has had (worker thread).

    Each fresh source counts from 0; ``offset`` places its chunks after everything the stream
    took before. While the input is lost, :meth:`silence_due` says how much silence brings the
    clock up to the wall clock, counted from the capture time of the last real audio."""

    __slots__ = ("rate_hz", "end_sample", "capture_ns", "offset", "lost_since_ns", "anchor", "waiting")

    def __init__(self) -> None:
        self.rate_hz = SAMPLE_RATE_HZ  # the stream's rate until its first chunk says otherwise
        self.end_sample = 0  # native index just past the last audio (real or silence) taken
        self.capture_ns: int | None = None  # when the last real audio was captured
        self.offset = 0
        self.lost_since_ns: int | None = None
        self.anchor = (0, 0)  # (end_sample, capture_ns) the silence of a loss is counted from
        self.waiting = False  # a fresh source was started; its first chunk is not here yet

    def place(self, chunk: RawChunk) -> int:
        """The stream-clock index of ``chunk``'s first sample (and the clock moves past it)."""
        if self.waiting:  # the first chunk of a fresh source: it goes on where the silence ended
            self.waiting = False
            self.offset = self.end_sample
        first = chunk.first_sample + self.offset
        self.rate_hz = chunk.rate_hz
        self.end_sample = first + chunk.n_samples
        self.capture_ns = chunk.capture_ns
        return first

    def lose(self, now_ns: int) -> None:
        self.lost_since_ns = now_ns
        self.anchor = (self.end_sample, self.capture_ns if self.capture_ns is not None else now_ns)

    def silence_due(self, now_ns: int) -> int:
        """Samples of silence that bring a lost stream's clock up to ``now_ns``."""
        anchor_sample, anchor_ns = self.anchor
        target = anchor_sample + (now_ns - anchor_ns) * self.rate_hz // 1_000_000_000
        return max(0, target - self.end_sample)


class Worker(threading.Thread):
    """Owns one :class:`LiveCaptioner` (made on this thread, so it is the thread that works the
    GPU). ``inbox`` carries :data:`InboxItem` values; ``deliver`` gets each tick's updates,
    followed by the streams' lifecycle events (:data:`~captioner.engine.messages.Lifecycle`);
    ``publish_status`` a :class:`PipelineStatus` a few times a second. ``clock_ns`` is the
    sources' capture clock (a simulated one in tests), which times a lost input's silence.

    ``source_errors`` maps a stream to why its source ended early for good (a damaged file);
    ``lost_inputs`` a stream to why its live device stopped, while it is away; ``input_losses``
    a stream to its losses so far. All three are replaced, never changed in place, so any
    thread may read them."""

    def __init__(
        self,
        make_captioner: Callable[[], LiveCaptioner],
        inbox: queue.Queue[InboxItem],
        deliver: Callable[[list[CaptionUpdate]], None],
        publish_status: Callable[[PipelineStatus], None],
        source_drops: Callable[[], int] = lambda: 0,
        name: str = "captioner-worker",
        status_period_s: float = 0.25,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self._make_captioner = make_captioner
        self._inbox = inbox
        self._send_out = deliver
        self._publish_status = publish_status
        self._source_drops = source_drops
        self._status_period_s = status_period_s
        self._clock_ns = clock_ns  # the capture clock: how long a lost input has been away
        self.stop_event = threading.Event()
        self.ready = threading.Event()
        self.all_ended = threading.Event()
        """Set while every stream the worker opened has ended and been committed."""
        self.error: BaseException | None = None
        self.captioner: LiveCaptioner | None = None
        self.source_errors: dict[str, str] = {}
        self.lost_inputs: dict[str, str] = {}
        self.input_losses: dict[str, InputLoss] = {}
        self._clocks: dict[str, _InputClock] = {}
        self._opened = 0
        self._dropped_frames_seen = 0
        self._wake_pending = False  # a WAKE is in the inbox: more would only lengthen it
        self._host_spoke = False  # a model process sent something since the worker last looked
        self._steps_s: deque[float] = deque(maxlen=STEPS_KEPT)
        self.away_s = 0.0
        """The longest of the worker's recent steps: how long its inbox normally waits for it (a
        model on the worker's own thread takes seconds a step on a CPU). Any thread may read it."""
        self._take_waiting: Callable[[], None] = lambda: None

    def run(self) -> None:
        try:
            self.captioner = self._make_captioner()
            self._attach(self.captioner)
            self.ready.set()
            self._loop()
        except BaseException as error:  # reported to the owner, who decides what to show
            self.error = error
            self._publish_status(PipelineStatus(time.monotonic(), "", "", "", state="error",
                                                message=one_line(error)))
        finally:
            self.ready.set()

    def _attach(self, captioner) -> None:
        """A captioner whose model may run in another process says when that process has sent
        something (``on_host_message``) and takes it when asked (``take_waiting``)."""
        if hasattr(captioner, "on_host_message"):
            captioner.on_host_message = self.wake
            captioner.hand_out_now = self._deliver
            self._take_waiting = captioner.take_waiting

    def _loop(self) -> None:
        live = self.captioner
        assert live is not None
        next_status_s = 0.0
        while True:
            stopping = self.stop_event.is_set()
            self._turn(live, 0.0 if stopping else max(0.0, next_status_s - time.monotonic()))
            now_s = time.monotonic()
            if now_s >= next_status_s:
                self._publish_status(self._status(live))
                next_status_s = now_s + self._status_period_s
            if stopping and self._inbox.empty():
                break
        for label in list(self.lost_inputs):
            self._end_loss(label)  # the time away counts up to the stop
        self._emit(live.close())
        self._publish_status(self._status(live, state="stopped"))

    def _turn(self, live: LiveCaptioner, wait_s: float) -> None:
        """What the inbox holds (waiting up to ``wait_s`` for it), then a step."""
        for item in self._take(wait_s):
            self._apply(live, item)
            if self._host_spoke:  # its captions go now, not after the rest of these items
                self._host_spoke = False
                self._take_waiting()
        self._fill_lost(live)
        # Each tick's captions leave as it ends: a backlog's later ticks do not hold them.
        started_s = time.monotonic()
        live.step(hand_out=self._deliver)
        self._deliver([])  # streams opened or done with no update of this step
        self._steps_s.append(time.monotonic() - started_s)
        self.away_s = max(self._steps_s)
        self._tidy()

    def wake(self) -> None:
        """Any thread: the worker steps soon even if no audio comes, so that what its
        captioner has waiting (a model process's captions) is handed out now rather than when
        the next chunk or the next status report wakes it; a worker busy with its inbox takes
        it after the item in hand."""
        self._host_spoke = True
        if self._wake_pending:
            return
        self._wake_pending = True
        try:
            self._inbox.put_nowait(WAKE)
        except queue.Full:  # a full inbox: the worker is busy taking it, and steps anyway
            self._wake_pending = False

    def _take(self, wait_s: float) -> list:
        """Up to MAX_ITEMS_PER_STEP items: blocks up to ``wait_s`` for the first one."""
        items = []
        try:
            item = self._inbox.get(timeout=wait_s) if wait_s > 0 else self._inbox.get_nowait()
        except queue.Empty:
            return items
        taken = 0
        while True:
            items.append(item)
            taken += len(item.streams) if type(item) is FramedAudio else 1
            if taken >= MAX_ITEMS_PER_STEP:
                break
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
        return items

    def _apply(self, live: LiveCaptioner, item) -> None:
        if item is WAKE:
            self._wake_pending = False  # what comes after this one wakes the worker again
        elif isinstance(item, RawChunk):
            stream = live.streams.get(item.stream)
            clock = self._clocks.get(item.stream)
            if stream is None or clock is None:  # audio of a stream closed meanwhile is dropped on purpose
                return
            if clock.lost_since_ns is not None and not clock.waiting:
                return  # a lost source's last blocks: its successor's clock starts after the loss
            if clock.waiting:
                # Audio flows again: the input is back. The silence runs up to this chunk's
                # first sample, so the time away is exactly the time between the two sources.
                start_ns = item.capture_ns - item.n_samples * 1_000_000_000 // item.rate_hz
                if clock.lost_since_ns is not None:
                    self._fill(stream, clock, start_ns)
                self._end_loss(item.stream, start_ns)
            first = clock.place(item)
            # A source's chunk is [n, channels] by contract: mixed down here, it is never read
            # by the public call's layout rule, which refuses a chunk of 8 frames or fewer.
            samples = item.samples if item.samples.ndim == 1 else to_float_mono(item.samples)
            stream.accept_waveform(item.rate_hz, samples, capture_ns=item.capture_ns, first_sample=first)
        elif type(item) is FramedAudio:
            # A server's connections: no device behind them to lose, so no input clock to keep.
            live.accept_framed(item)
        elif isinstance(item, SourceEnd):
            if item.error:
                self.source_errors = {**self.source_errors, item.stream: item.error}
            stream = live.streams.get(item.stream)
            if stream is not None:
                stream.finish()
        elif isinstance(item, InputLost):
            self._lose(item)
        elif isinstance(item, InputBack):
            clock = self._clocks.get(item.label)
            if clock is not None:
                clock.waiting = True
        elif isinstance(item, OpenStream):
            try:
                live.open_stream(item.label, item.language, priority=item.priority, source=item.source)
            except StreamRefused:
                # At capacity: this stream only is refused (its audio that follows is dropped,
                # as for any stream that is not open); the running ones go on. The captioner
                # has the Refused event for the outbox.
                return
            self._clocks[item.label] = _InputClock()
            self._opened += 1
            self.all_ended.clear()
        elif isinstance(item, CloseStream):
            stream = live.streams.get(item.label)
            if stream is not None:
                stream.finish()
            if item.label in self.lost_inputs:
                self._end_loss(item.label)
        elif isinstance(item, SetLanguage):
            live.set_language(item.language)
        elif isinstance(item, SwapModel):
            self._emit(live.set_model(item.model))
        else:
            raise TypeError(f"unknown worker message {item!r}")

    # -- lost inputs ------------------------------------------------------------------------------
    def _lose(self, item: InputLost) -> None:
        clock = self._clocks.get(item.label)
        if clock is None:
            return
        if item.label not in self.lost_inputs:
            clock.lose(self._clock_ns())
            before = self.input_losses.get(item.label, InputLoss())
            self.input_losses = {**self.input_losses, item.label: replace(before, count=before.count + 1)}
        clock.waiting = False  # a fresh source that never delivered is lost too: wait for the next
        self.lost_inputs = {**self.lost_inputs, item.label: item.reason}

    def _end_loss(self, label: str, audio_again_ns: int | None = None) -> None:
        """The input is back (its audio again from ``audio_again_ns``) or its stream closes (now):
        the time without audio, from the last real audio on, is added up."""
        clock = self._clocks.get(label)
        if clock is not None and clock.lost_since_ns is not None:
            until_ns = self._clock_ns() if audio_again_ns is None else audio_again_ns
            away_s = max(0, until_ns - clock.anchor[1]) / 1e9
            clock.lost_since_ns = None
            before = self.input_losses.get(label, InputLoss())
            self.input_losses = {**self.input_losses, label: replace(before, lost_s=before.lost_s + away_s)}
        self.lost_inputs = {k: v for k, v in self.lost_inputs.items() if k != label}

    def _fill_lost(self, live: LiveCaptioner) -> None:
        """Silence up to now for every lost input's stream: its open text is committed when the
        silence closes the segment, and its clock keeps pace with the wall clock."""
        if not self.lost_inputs:
            return
        until_ns = self._clock_ns() - int(SILENCE_LAG_S * 1e9)
        for label in self.lost_inputs:
            stream, clock = live.streams.get(label), self._clocks.get(label)
            if stream is not None and clock is not None and clock.lost_since_ns is not None and not clock.waiting:
                self._fill(stream, clock, until_ns)

    @staticmethod
    def _fill(stream, clock: _InputClock, until_ns: int) -> None:
        due = clock.silence_due(until_ns)
        piece = max(1, int(SILENCE_PIECE_S * clock.rate_hz))
        while due > 0:
            n = min(due, piece)
            stream.accept_waveform(clock.rate_hz, np.zeros(n, np.float32), capture_ns=until_ns,
                                   first_sample=clock.end_sample)
            clock.end_sample += n
            due -= n

    def _deliver(self, updates: list[CaptionUpdate]) -> None:
        """Updates on to the outbox with the lifecycle events the captioner has for them: a
        stream opened (or refused) before them, since its first update may be among them, and
        a stream done after them, since its last one may be."""
        live = self.captioner
        events = live.take_lifecycle() if live is not None else []
        if updates or events:
            done = [e for e in events if type(e) is StreamDone]
            self._send_out([*(e for e in events if type(e) is not StreamDone), *updates, *done])

    def _emit(self, updates: list[CaptionUpdate]) -> None:
        self._deliver(updates)
        self._tidy()

    def _tidy(self) -> None:
        """After a step: ended streams' clocks dropped, ``all_ended`` set when none is open."""
        live = self.captioner
        if live is not None and len(self._clocks) > len(live.streams):
            # A stream that has ended keeps no clock (a server opens and ends streams for days).
            self._clocks = {label: c for label, c in self._clocks.items() if label in live.streams}
        if live is not None and self._opened and not live.streams:
            self.all_ended.set()

    def _status(self, live: LiveCaptioner, state: str = "running") -> PipelineStatus:
        lost = self.lost_inputs
        notes = [f"input {label!r} lost ({why}); waiting for it to come back" for label, why in lost.items()]
        notes += [f"input {label!r} lost ({why})" for label, why in self.source_errors.items()]
        status = live.status(queue_depth=self._inbox.qsize(), dropped_blocks=self._source_drops(),
                             state=state, message="; ".join(notes))
        # The engine sums the gaps of the streams still open: one that leaves (its source
        # ended, or every stream at the stop) takes its count along. A drop stays a drop.
        self._dropped_frames_seen = max(self._dropped_frames_seen, status.dropped_frames)
        return replace(status, dropped_frames=self._dropped_frames_seen,
                       lost_inputs=tuple(label for label in status.streams if label in lost))
