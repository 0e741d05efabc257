"""The one thread that writes committed caption lines to transcripts, off the thread that made
them.

A pipeline's (local or a server's client) hands each batch on to its outbox only once its lines
are written, so a crash never costs a line that was shown and the engine never waits on the
disk; a server keeps one transcript per connection, written beside the send. A writer is any
object with ``write(update)`` and ``close()`` (the app's fsync'ing ``TranscriptWriter``); one
with ``paused`` and ``retry()`` is retried every :data:`RETRY_S` while the disk refuses lines.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Hashable

from captioner.events import CaptionUpdate

RETRY_S = 2.0
"""How often the held lines of a paused transcript (a full disk) are tried again."""


class TranscriptThread(threading.Thread):
    """Writes each batch's committed lines into the transcript of its ``key``, made by
    ``writer_for(key, title)`` at the key's first line, then hands the batch to ``then`` (when
    given). A writer that fails is not written to again (a failed disk keeps failing) and the
    batches still go on; :attr:`error` keeps the first failure."""

    def __init__(self, name: str, writer_for: Callable[[Hashable, str], object],
                 then: Callable[[list], None] | None = None) -> None:
        super().__init__(name=name, daemon=True)
        self._writer_for = writer_for
        self._then = then
        self._items: queue.Queue = queue.Queue()
        self._writers: dict[Hashable, object] = {}
        self._failed: set[Hashable] = set()
        self.error: BaseException | None = None

    # -- any thread ------------------------------------------------------------------------------
    def put(self, batch: list, key: Hashable = None, title: str = "") -> None:
        """``batch`` (updates, and anything else ``then`` takes) for ``key``'s transcript."""
        self._items.put((key, title, batch))

    def end(self, key: Hashable) -> None:
        """``key`` is over: its transcript is closed (none was made if it committed no line)."""
        self._items.put((key, "", None))

    def idle(self) -> bool:
        """Every batch put so far is written and handed on."""
        return self._items.unfinished_tasks == 0

    def close(self, timeout_s: float) -> None:
        """Writes what was put, closes every transcript, and ends the thread."""
        self._items.put(None)
        if self.is_alive():
            self.join(timeout_s)

    # -- the thread ------------------------------------------------------------------------------
    def run(self) -> None:
        closing = False
        while True:
            paused = [w for w in self._writers.values() if getattr(w, "paused", None)]
            try:
                # Once told to close, what was put meanwhile (a racing producer) is still done.
                item = self._items.get_nowait() if closing else self._items.get(timeout=RETRY_S if paused else None)
            except queue.Empty:
                if closing:
                    break
                for writer in paused:
                    writer.retry()
                continue
            try:
                if item is None:
                    closing = True
                else:
                    self._take(*item)
            finally:
                self._items.task_done()
        for key in list(self._writers):
            self._close(key)

    def _take(self, key: Hashable, title: str, batch: list | None) -> None:
        if batch is None:
            self._close(key)
            return
        for update in batch:
            if type(update) is CaptionUpdate and update.kind == "final" and update.text.strip():
                self._write(key, title, update)
        if self._then is not None:
            self._then(batch)

    def _write(self, key: Hashable, title: str, update: CaptionUpdate) -> None:
        if key in self._failed:
            return
        try:
            writer = self._writers.get(key)
            if writer is None:
                writer = self._writers[key] = self._writer_for(key, title)
            writer.write(update)
        except Exception as error:
            self._failed.add(key)
            self.error = self.error or error

    def _close(self, key: Hashable) -> None:
        self._failed.discard(key)
        writer = self._writers.pop(key, None)
        if writer is not None:
            try:
                writer.close()
            except Exception as error:
                self.error = self.error or error
