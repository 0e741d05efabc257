"""The local channel between the hub (the ``captioner serve`` process holding the engines) and
each of its front-end processes (``--frontends K``): one Unix socket pair per front-end, carrying
length-prefixed pickled frames, each a batch of messages (docs/serve.md, "Front-end processes").

Both ends are asyncio code of the same package version on the same machine, started by the hub
itself, so pickle is safe here: nothing from the network is ever unpickled (a client's audio is
bytes inside a frame, its text a string).

Frames, front-end -> hub, one every :data:`FLUSH_S` (5 ms by default) while there is something to
say: a :class:`FrontendFrame`: every connection's audio that has whole 16 kHz frames since the
last frame, then its events, in order. Frames, hub -> front-end: a list of events, in order.
The events are typed (:class:`~captioner.engine.messages.Message` s, as the engine's own commands
and events, :mod:`captioner.engine.messages`); those of this channel are defined below, each
with what it says. ``sid`` is a connection's number in its front-end.

The hub's first frame to a front-end is its configuration, a dict (it holds the token, so it
travels here, not on the command line).
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from dataclasses import dataclass

from captioner.engine.messages import Message

FLUSH_S = 0.005
"""How often a front-end sends its batch by default (``serve --frontend-flush-ms``): at most this
long added to a stream's audio on its way in. The hub's cost is per frame and per stream in it: a
client sending 100 ms messages is one push a 100 ms whatever this period. A longer period was
most of what the server added to a caption, and a shorter one cost the serving process no more
CPU (benchmarks/results/serve/HISTORY.md, "The way in and the way back, shortened")."""
FLUSH_BYTES = 1 << 20
"""...or sooner, once this much audio is waiting."""
STREAM_LIMIT_BYTES = 64 << 20
"""The asyncio stream buffer: a whole frame fits."""

_HEADER = struct.Struct("!I")


def encode(obj) -> bytes:
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader):
    """The next frame, or ``None`` at the end of the channel (the other process is gone)."""
    try:
        header = await reader.readexactly(_HEADER.size)
        (size,) = _HEADER.unpack(header)
        return pickle.loads(await reader.readexactly(size))
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


async def open_channel(sock) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Loop thread: asyncio streams over one end of a socket pair."""
    return await asyncio.open_unix_connection(sock=sock, limit=STREAM_LIMIT_BYTES)


# -- front-end -> hub --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FrontendFrame(Message):
    """One batch. ``audio_f32``: the float32 samples of every connection that has whole 16 kHz
    frames since the last frame, concatenated (converted from int16 in one NumPy call, then
    resampled and framed per connection: :mod:`captioner.serve.gather`); ``audio_index`` says whose
    they are, in order: ``(sid, first_sample, n_samples, capture_ns)``, ``first_sample`` on the
    connection's 16 kHz clock (0 at its first audio) and ``n_samples`` whole frames. The hub
    takes the audio before the events (a connection's last audio comes before its end)."""

    events: list
    audio_index: list
    audio_f32: bytes


@dataclass(frozen=True, slots=True)
class ClientOpened(Message):
    """A connection passed its handshake checks (``source``: what the client said its audio is,
    ``protocol.StreamParams.source``)."""

    sid: int
    label: str
    language: str | None
    rate_hz: int
    peer: str
    source: str | None


@dataclass(frozen=True, slots=True)
class ClientEnded(Message):
    """The client sent ``end`` (its last audio is in this frame or an earlier one)."""

    sid: int


@dataclass(frozen=True, slots=True)
class ClientGone(Message):
    """The connection is over without ``end``: the client left (``code`` None) or the front-end
    closed it for breaking the protocol (its code and reason)."""

    sid: int
    code: int | None
    reason: str


@dataclass(frozen=True, slots=True)
class ClientRefused(Message):
    """A connection refused before any stream (a wrong token, a bad path): counted."""


@dataclass(frozen=True, slots=True)
class FrontendLog(Message):
    line: str


@dataclass(frozen=True, slots=True)
class LoopLate(Message):
    """Every second: how late the front-end's loop woke (ms, each time it was late)."""

    late_ms: list


@dataclass(frozen=True, slots=True)
class CaptionsBack(Message):
    """Every second: how long each caption took from its engine's outbox to the front-end's loop (ms)."""

    back_ms: list


@dataclass(frozen=True, slots=True)
class Listening(Message):
    """The front-end's start: it listens on ``port``..."""

    port: int


@dataclass(frozen=True, slots=True)
class StartFailed(Message):
    """...or it cannot (``reason``: one line)."""

    reason: str


# -- hub -> front-end --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Admit(Message):
    """The answer to :class:`ClientOpened`: its stream runs on engine ``worker_index``..."""

    sid: int
    worker_index: int


@dataclass(frozen=True, slots=True)
class CloseClient(Message):
    """...or close the connection so (also a refusal of :class:`ClientOpened`), after what was
    sent before this."""

    sid: int
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class StreamReady(Message):
    """The engine lists the stream: ``text`` is the ``ready`` message, sent before any other."""

    sid: int
    text: str


@dataclass(frozen=True, slots=True)
class Caption(Message):
    """A caption update's values (``protocol.caption_fields``, in order); the front-end makes the message
    (``protocol.caption_message`` with the connection's label). ``rung_ns``: when its engine rang
    the hub for it (``time.monotonic_ns``, one clock for every process of the machine; 0: not
    rung), for the way back's measure."""

    sid: int
    fields: tuple
    rung_ns: int


@dataclass(frozen=True, slots=True)
class StatusTexts(Message):
    """Once a second, the ``status`` message for each device: ``{worker_index: text}``."""

    texts: dict


@dataclass(frozen=True, slots=True)
class Readiness(Message):
    """Why the engines take no new stream now (``""`` while they do), for ``/readyz``."""

    not_ready: str


@dataclass(frozen=True, slots=True)
class StopListening(Message):
    """The drain: take no new connection (1001); the hub ends the streams."""


@dataclass(frozen=True, slots=True)
class Exit(Message):
    """Close what is left (1001) and end."""
