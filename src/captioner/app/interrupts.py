"""Ctrl-C and SIGTERM for the commands that run until they are stopped (`listen`, `serve`,
`transcribe --realtime`).

While a command waits for its threads, a signal only sets a flag that its loop reads: an
exception raised by a handler lands wherever the main thread is, inside
``threading.Condition.wait``'s own lock handling too, where CPython then fails with "release
unlocked lock" — a traceback and exit 1 instead of the kept transcript and 130. Outside that
wait (loading, stopping), SIGTERM raises ``KeyboardInterrupt`` as Ctrl-C does.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def sigterm_as_interrupt() -> None:
    """SIGTERM ends the command as Ctrl-C does (from the main thread only; elsewhere nothing)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_interrupt)


@contextlib.contextmanager
def stop_requests() -> Iterator[threading.Event]:
    """An event set by Ctrl-C or SIGTERM while the block runs; the handlers before it come back
    after it, so a second Ctrl-C while the command stops interrupts as before. Off the main
    thread (where handlers cannot be set) the event is only ever set by the caller."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {sig: signal.signal(sig, lambda signum, frame: stop.set()) for sig in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
