"""A served engine that failed is replaced by a fresh one, off the server's loop.

The pipeline restarts its own model when a step fails (docs/reliability.md, "Hot restart"); what
it cannot survive is its worker thread ending (an error outside a model step, or the model failing
again and again on the CPU). Left so, every new connection was refused as if the server were full,
with the failing error's text, until someone restarted the process. Now the link sees the error
(:meth:`~captioner.serve.engine_link.EngineLink.poll`), ends the engine's streams (1011), refuses
new ones with :class:`EngineDown` (1013: try again shortly), and a :class:`Restarter` lets the
failed pipeline go and starts a fresh one from the same ``make_pipeline``, again and again with a
growing pause until one starts. The link's poll then puts it in the failed one's place.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from captioner.errors import StreamRefused, one_line

RESTART_FIRST_S = 1.0
"""Pause after a fresh engine failed to start, doubled after each failure..."""
RESTART_MAX_S = 60.0
"""...up to this."""
LET_GO_S = 10.0
"""How long the failed engine's model may take to stop (its processes, its standby) before the
fresh one starts anyway."""


class EngineDown(StreamRefused):
    """A new stream refused because its engine failed and is being restarted (1013, like a full
    server: the client tries again)."""


def down_reason(restart_error: str) -> str:
    """What a refused client and ``/readyz`` are told: that the engine failed, never why (the
    failure may have been another client's doing; the log says why)."""
    if restart_error:
        return "the engine failed and could not be restarted yet; try again later"
    return "the engine failed and is being restarted; try again in a few seconds"


class Restarter(threading.Thread):
    """Replaces ``worker``'s failed pipeline: lets it go, then ``worker.make_pipeline(device)``
    and ``start`` until one starts, and hands it over as ``worker.replacement`` (``(pipeline,
    seconds it took)``) for the link's loop to adopt. ``note``: a line for the server's log.
    ``stopped``: set when the link stops (a pipeline started then is stopped, not handed over)."""

    def __init__(self, worker, note: Callable[[str], None], stopped: threading.Event) -> None:
        super().__init__(name=f"captioner-engine-restart-{worker.index}", daemon=True)
        self.worker = worker
        self.note = note
        self.stopped = stopped

    def run(self) -> None:
        worker = self.worker
        started_s = time.monotonic()
        let_go(worker.pipeline)
        pause_s = RESTART_FIRST_S
        while not self.stopped.is_set():
            try:
                fresh = worker.make_pipeline(worker.device)
                fresh.start()
            except Exception as error:
                worker.restart_error = one_line(error)
                self.note(f"engine {worker.name} could not be restarted: {worker.restart_error}; "
                          f"trying again in {pause_s:g} s")
                self.stopped.wait(pause_s)
                pause_s = min(2 * pause_s, RESTART_MAX_S)
                continue
            if self.stopped.is_set():
                fresh.stop(10.0)
                return
            worker.replacement = (fresh, time.monotonic() - started_s)
            return


def let_go(pipeline) -> None:
    """The failed pipeline's threads and model (its worker is gone: nothing else stops them, and
    a model process would keep its GPU memory), within :data:`LET_GO_S`."""

    def stop() -> None:
        try:
            pipeline.stop(LET_GO_S)
            captioner = pipeline.captioner
            if captioner is not None:
                captioner.close()
        except Exception:  # it failed already: what is left of it is not worth a second error
            pass

    stopping = threading.Thread(target=stop, name="captioner-engine-let-go", daemon=True)
    stopping.start()
    stopping.join(LET_GO_S)
