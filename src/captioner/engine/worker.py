"""The thread that owns one engine (and so one GPU), and the typed messages it takes.

The worker blocks on ONE inbox: audio chunks straight from the sources (a PortAudio callback
or a replay thread puts them there), the ends of finite sources, and commands from the owner.
One queue keeps their order (a stream is opened before its first audio, a model swap falls
between the audio before and after it), and nothing polls: with nothing to do the worker sleeps
until an item arrives or a status report is due. Each chunk goes to its stream of the public
API's :class:`~captioner.engine.live.LiveCaptioner` (which resamples and frames it), then the
captioner's ``step`` runs the model work that is due; caption updates leave through the
``deliver`` callback.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from captioner.audio.source import RawChunk, SourceEnd
from captioner.engine.live import LiveCaptioner
from captioner.errors import one_line
from captioner.events import CaptionUpdate, PipelineStatus

MAX_ITEMS_PER_STEP = 200
"""Inbox items taken before the captioner steps (about 4 s of 20 ms chunks): a backlog is
worked through in slices, with status reports and commands in between."""


@dataclass(frozen=True, slots=True)
class OpenStream:
    label: str
    language: str | None = None


@dataclass(frozen=True, slots=True)
class CloseStream:
    """Commit what the stream shows and close it (its source was removed)."""

    label: str


@dataclass(frozen=True, slots=True)
class SetLanguage:
    language: str | None
    """A code, or ``None`` for English-only models / detection by multilingual ones."""


@dataclass(frozen=True, slots=True)
class SwapModel:
    model: str
    """A model name ("tiny.en", "base") or a CTranslate2 Whisper folder."""


Command = OpenStream | CloseStream | SetLanguage | SwapModel
InboxItem = RawChunk | SourceEnd | OpenStream | CloseStream | SetLanguage | SwapModel


class Worker(threading.Thread):
    """Owns one :class:`LiveCaptioner` (made on this thread, so it is the thread that works the
    GPU). ``inbox`` carries :data:`InboxItem` values; ``deliver`` gets each step's updates;
    ``publish_status`` a :class:`PipelineStatus` a few times a second.

    ``lost_inputs`` maps a stream to why its source ended early (a device that went away)."""

    def __init__(
        self,
        make_captioner: Callable[[], LiveCaptioner],
        inbox: queue.Queue[InboxItem],
        deliver: Callable[[list[CaptionUpdate]], None],
        publish_status: Callable[[PipelineStatus], None],
        source_drops: Callable[[], int] = lambda: 0,
        name: str = "captioner-worker",
        status_period_s: float = 0.25,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self._make_captioner = make_captioner
        self._inbox = inbox
        self._deliver = deliver
        self._publish_status = publish_status
        self._source_drops = source_drops
        self._status_period_s = status_period_s
        self.stop_event = threading.Event()
        self.ready = threading.Event()
        self.all_ended = threading.Event()
        """Set while every stream the worker opened has ended and been committed."""
        self.error: BaseException | None = None
        self.captioner: LiveCaptioner | None = None
        self.lost_inputs: dict[str, str] = {}
        self._opened = 0

    def run(self) -> None:
        try:
            self.captioner = self._make_captioner()
            self.ready.set()
            self._loop()
        except BaseException as error:  # reported to the owner, who decides what to show
            self.error = error
            self._publish_status(PipelineStatus(time.monotonic(), "", "", "", state="error",
                                                message=one_line(error)))
        finally:
            self.ready.set()

    def _loop(self) -> None:
        live = self.captioner
        assert live is not None
        next_status_s = 0.0
        while True:
            stopping = self.stop_event.is_set()
            wait_s = 0.0 if stopping else max(0.0, next_status_s - time.monotonic())
            for item in self._take(wait_s):
                self._apply(live, item)
            self._emit(live.step())
            now_s = time.monotonic()
            if now_s >= next_status_s:
                self._publish_status(self._status(live))
                next_status_s = now_s + self._status_period_s
            if stopping and self._inbox.empty():
                break
        self._emit(live.close())
        self._publish_status(self._status(live, state="stopped"))

    def _take(self, wait_s: float) -> list:
        """Up to MAX_ITEMS_PER_STEP items: blocks up to ``wait_s`` for the first one."""
        items = []
        try:
            items.append(self._inbox.get(timeout=wait_s) if wait_s > 0 else self._inbox.get_nowait())
        except queue.Empty:
            return items
        while len(items) < MAX_ITEMS_PER_STEP:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        return items

    def _apply(self, live: LiveCaptioner, item) -> None:
        if isinstance(item, RawChunk):
            stream = live.streams.get(item.stream)
            if stream is not None:  # audio of a stream closed meanwhile is dropped on purpose
                stream.accept_waveform(item.rate_hz, item.samples, capture_ns=item.capture_ns,
                                       first_sample=item.first_sample)
        elif isinstance(item, SourceEnd):
            if item.error:
                self.lost_inputs[item.stream] = item.error
            stream = live.streams.get(item.stream)
            if stream is not None:
                stream.finish()
        elif isinstance(item, OpenStream):
            live.open_stream(item.label, item.language)
            self._opened += 1
            self.all_ended.clear()
        elif isinstance(item, CloseStream):
            stream = live.streams.get(item.label)
            if stream is not None:
                stream.finish()
        elif isinstance(item, SetLanguage):
            live.set_language(item.language)
        elif isinstance(item, SwapModel):
            self._emit(live.set_model(item.model))
        else:
            raise TypeError(f"unknown worker message {item!r}")

    def _emit(self, updates: list[CaptionUpdate]) -> None:
        if updates:
            self._deliver(updates)
        live = self.captioner
        if live is not None and self._opened and not live.streams:
            self.all_ended.set()

    def _status(self, live: LiveCaptioner, state: str = "running") -> PipelineStatus:
        message = "; ".join(f"input {label!r} lost ({why})" for label, why in self.lost_inputs.items())
        return live.status(queue_depth=self._inbox.qsize(), dropped_blocks=self._source_drops(),
                           state=state, message=message)
