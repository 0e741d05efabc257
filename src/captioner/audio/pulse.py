"""What a PulseAudio (or PipeWire, through pipewire-pulse) server offers, asked through libpulse
(pulsectl).

PortAudio sees a PulseAudio server only as one ALSA device named ``pulse`` (and ``default``),
behind which every source hides, monitors of the output sinks included (the audio a meeting
plays). Listing those sources needs the server itself. Each question opens its own short-lived
connection (to ``PULSE_SERVER`` when set, as libpulse does; never starting a daemon), bounded by
a timeout: no server, no libpulse or no answer in time simply means an empty list or ``None``.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from captioner.audio.pulse_deadline import DeadlinePoll

SERVER_TIMEOUT_S = 3.0
CLIENT_NAME = "captioner"
PULSE_PREFIX = "pulse:"
"""``--device pulse:NAME`` opens the server's source ``NAME``."""

_Answer = TypeVar("_Answer")


@dataclass(frozen=True)
class PulseSource:
    """One source of the server; ``name`` is what ``PULSE_SOURCE`` / ``pulse:NAME`` take."""

    name: str
    channels: int
    rate_hz: int
    is_monitor: bool


HANG_UP_GRACE_S = 0.5
"""How long past its deadline an exchange gets to see its hang-up and end."""
UNANSWERED_HOLD_S = 2.0
"""After a server let a question run to its deadline, further questions to that server get
``None`` at once for this long: a frozen server costs the asking thread (the inputs' health
checks, every stream's) one timeout, not one per question."""
MAX_STUCK_EXCHANGES = 4
"""Exchanges still running past their deadline and grace (libpulse not polling at all: the
hang-up is never seen) at which nothing more is asked: no more threads and sockets for a
libpulse that does not return."""

_stuck_lock = threading.Lock()
_unanswered_s: dict[str, float] = {}
"""Per server address (``PULSE_SERVER``, "" for the default), when its last question ran to its
deadline (monotonic s); dropped once it answers."""
_stuck_exchanges: list[threading.Thread] = []
"""Exchanges still running past their deadline and grace; cleared as they finish."""


def _ask_server(question: Callable[[Any], _Answer], timeout_s: float) -> _Answer | None:
    """``question(pulse)`` on a fresh connection, or ``None`` when the server gives no answer.

    The exchange runs on a daemon thread, with libpulse's poll bounded by ``timeout_s``
    (:mod:`.pulse_deadline`): pulsectl's own connect timeout always waits the whole timeout, even
    once connected, and its queries have none, so a server that accepts and then stalls would
    block them for good. At the deadline the connection is hung up and the exchange ends, and
    the server's next questions get ``None`` at once for :data:`UNANSWERED_HOLD_S`, whether it
    ended or not; past :data:`MAX_STUCK_EXCHANGES` that did not, nothing more is asked.
    """
    now_s = time.monotonic()
    server = os.environ.get("PULSE_SERVER", "")
    with _stuck_lock:
        _stuck_exchanges[:] = [t for t in _stuck_exchanges if t.is_alive()]
        if len(_stuck_exchanges) >= MAX_STUCK_EXCHANGES:
            return None
        if now_s - _unanswered_s.get(server, float("-inf")) < UNANSWERED_HOLD_S:
            return None
    answers: list[_Answer] = []
    poll = DeadlinePoll(now_s + timeout_s)

    def exchange() -> None:
        try:
            import pulsectl  # lazily: importing it fails where libpulse0 is not installed

            client = pulsectl.Pulse(CLIENT_NAME, connect=False)
        except Exception:
            return
        try:
            client.set_poll_func(poll)
            # autospawn=False: asking what the server offers must never start a server.
            client.connect(autospawn=False)
            answers.append(question(client))
        except Exception:  # PulseError, a vanished server, a source removed mid-listing...
            pass
        finally:
            client.close()

    worker = threading.Thread(target=exchange, name="captioner-pulse-query", daemon=True)
    worker.start()
    worker.join(timeout_s + HANG_UP_GRACE_S)
    with _stuck_lock:
        if worker.is_alive():
            _stuck_exchanges.append(worker)
        if poll.hung_up or worker.is_alive():
            _unanswered_s[server] = time.monotonic()
        elif answers:
            _unanswered_s.pop(server, None)
    return answers[0] if answers else None


@functools.cache
def _source_list_query() -> Callable[[Any], list[Any]]:
    """``Pulse.source_list`` built on an info class that copies the sample spec in time.

    pulsectl keeps a source's ``sample_spec`` as a view into the struct libpulse passes to its
    callback, and libpulse reuses that memory once the callback returns: read afterwards, the
    first source shows the next one's rate and the last one garbage. ``_init_from_struct`` is
    pulsectl's hook for subclasses and runs inside the callback, while the struct is valid.
    """
    import pulsectl
    from pulsectl import _pulsectl

    class SourceInfo(pulsectl.PulseSourceInfo):
        def _init_from_struct(self, struct: Any) -> None:
            self.rate_hz = int(struct.sample_spec.rate)
            self.n_channels = int(struct.sample_spec.channels)

    return pulsectl.Pulse._pulse_get_list(
        _pulsectl.PA_SOURCE_INFO_CB_T, _pulsectl.pa.context_get_source_info_list, SourceInfo,
    )


def _sources(client: Any) -> list[PulseSource]:
    return [
        PulseSource(info.name, info.n_channels, info.rate_hz, info.monitor_of_sink_name is not None)
        for info in _source_list_query()(client)
    ]


def list_sources(timeout_s: float = SERVER_TIMEOUT_S) -> list[PulseSource]:
    """The server's sources (empty when there is no server, no libpulse or no answer in time)."""
    return _ask_server(_sources, timeout_s) or []


def default_source(timeout_s: float = SERVER_TIMEOUT_S) -> str | None:
    """Name of the server's default source, or ``None``."""
    return _ask_server(lambda client: client.server_info().default_source_name or None, timeout_s)


def _default_sink_monitor(client: Any) -> str | None:
    sink_name = client.server_info().default_sink_name
    if not sink_name:
        return None
    return client.get_sink_by_name(sink_name).monitor_source_name or None


def default_monitor(timeout_s: float = SERVER_TIMEOUT_S) -> str | None:
    """The monitor source of the default sink: what the machine is playing right now."""
    return _ask_server(_default_sink_monitor, timeout_s)
