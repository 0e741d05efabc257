"""The thread that owns one engine (and so one GPU)."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

from captioner.engine.core import Engine
from captioner.engine.recognizer import Recognizer
from captioner.errors import one_line
from captioner.events import AudioBlock, CaptionUpdate, PipelineStatus


@dataclass(frozen=True, slots=True)
class EndOfStream:
    """Put in the block queue after a finite source's last block."""

    stream: str


@dataclass(frozen=True, slots=True)
class Command:
    """A change applied by the worker between steps."""

    kind: str  # "add_stream", "remove_stream", "language", "model", "stop"
    value: object = None


class Worker(threading.Thread):
    """The thread that owns one engine (and so one GPU).

    ``blocks`` is the capture pump's queue of :class:`AudioBlock` lists; ``captions`` receives
    lists of updates; ``publish_status`` is called a few times a second with a PipelineStatus.
    """

    def __init__(
        self,
        make_engine: Callable[[], Engine],
        blocks: "queue.Queue[list[AudioBlock]]",
        captions: Callable[[list[CaptionUpdate]], None],
        publish_status: Callable[[PipelineStatus], None],
        source_stats: Callable[[], tuple[int, int]] = lambda: (0, 0),
        name: str = "captioner-worker",
        status_period_s: float = 0.25,
        make_recognizer: Callable[[str], Recognizer] | None = None,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self._make_engine = make_engine
        self._make_recognizer = make_recognizer
        self._blocks = blocks
        self._captions = captions
        self._publish_status = publish_status
        self._source_stats = source_stats
        self._status_period_s = status_period_s
        self.commands: "queue.Queue[Command]" = queue.Queue()
        self.stop_event = threading.Event()
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.engine: Engine | None = None

    def run(self) -> None:
        try:
            self.engine = self._make_engine()
            self.ready.set()
            self._loop()
        except BaseException as error:  # reported to the owner, who decides what to show
            self.error = error
            self._publish_status(PipelineStatus(time.monotonic(), "", "", "", state="error",
                                                message=one_line(error)))
        finally:
            self.ready.set()

    def _loop(self) -> None:
        engine = self.engine
        assert engine is not None
        next_status = 0.0
        draining = False
        while True:
            self._apply_commands()
            items = self._take_blocks(timeout_s=0.02)
            blocks = [b for b in items if not isinstance(b, EndOfStream)]
            if blocks:
                engine.push(blocks)
            updates = []
            for item in items:
                if isinstance(item, EndOfStream):
                    updates += engine.end_stream(item.stream)
            updates += engine.tick()
            if updates:
                self._captions(updates)
            now = time.monotonic()
            if now >= next_status:
                depth, drops = self._source_stats()
                self._publish_status(engine.status(queue_depth=depth + self._blocks.qsize(), dropped_blocks=drops))
                next_status = now + self._status_period_s
            if self.stop_event.is_set():
                if not draining:
                    draining = True
                    continue  # one more pass takes what the pump delivered last
                break
        final = engine.finish()
        if final:
            self._captions(final)
        self._publish_status(engine.status(state="stopped"))

    def _take_blocks(self, timeout_s: float) -> list[AudioBlock]:
        out: list[AudioBlock] = []
        try:
            out += self._blocks.get(timeout=timeout_s)
        except queue.Empty:
            return out
        while True:
            try:
                out += self._blocks.get_nowait()
            except queue.Empty:
                return out

    def _apply_commands(self) -> None:
        engine = self.engine
        assert engine is not None
        while True:
            try:
                command = self.commands.get_nowait()
            except queue.Empty:
                return
            if command.kind == "add_stream":
                engine.add_stream(str(command.value))
            elif command.kind == "remove_stream":
                updates = engine.remove_stream(str(command.value))
                if updates:
                    self._captions(updates)
            elif command.kind == "language":
                engine.language = None if command.value in (None, "", "auto") else str(command.value)
            elif command.kind == "model" and self._make_recognizer is not None:
                updates = engine.replace_recognizer(self._make_recognizer(str(command.value)))
                if updates:
                    self._captions(updates)
