"""The local channel between the hub (the ``captioner serve`` process holding the engines) and
each of its front-end processes (``--frontends K``): one Unix socket pair per front-end, carrying
length-prefixed pickled frames, each a batch of messages (docs/serve.md, "Front-end processes").

Both ends are asyncio code of the same package version on the same machine, started by the hub
itself, so pickle is safe here: nothing from the network is ever unpickled (a client's audio is
bytes inside a frame, its text a string).

Frames, front-end -> hub, one every :data:`FLUSH_S` (5 ms by default) while there is something to say:
``(events, audio_index, audio_f32)``. ``audio_f32`` is the float32 samples of every connection
that has whole 16 kHz frames since the last frame, concatenated (converted from int16 in one
NumPy call, then resampled and framed per connection: :mod:`captioner.serve.gather`);
``audio_index`` says whose they are, in order: ``(sid, first_sample, n_samples, capture_ns)``,
``first_sample`` on the connection's 16 kHz clock (0 at its first audio) and ``n_samples`` whole
frames.
``events`` (in order):

- ``("open", sid, label, language, rate_hz, peer, source)``: a connection passed its handshake
  checks (``source``: what the client said its audio is, ``protocol.StreamParams.source``)
- ``("end", sid)``: the client sent ``end`` (its last audio is in this frame or an earlier one)
- ``("gone", sid, code, reason)``: the connection is over without ``end``: the client left
  (``code`` None) or the front-end closed it for breaking the protocol (its code and reason)
- ``("log", line)``, ``("refused",)``: a log line, a connection refused before any stream
- ``("late", [ms, ...])``, ``("back", [ms, ...])``: every second, how late the front-end's loop
  woke, and how long each caption took from its engine's outbox to that loop
- ``("listening", port)`` / ``("failed", message)``: the front-end's start

Frames, hub -> front-end: a list of events, in order:

- ``("admit", sid, worker_index)`` / ``("refuse", sid, code, reason)``: the answer to ``open``
- ``("ready", sid, text)``: the engine lists the stream: the ``ready`` message, sent first
- ``("caption", sid, fields, rung_ns)``: a caption update's values (``protocol.caption_fields``);
  the front-end makes the message (``protocol.caption_message`` with the connection's label).
  ``rung_ns``: when its engine rang the hub for it (``time.monotonic_ns``, one clock for every
  process of the machine; 0: not rung), for the way back's measure
- ``("close", sid, code, reason)``: after what was sent before it, close the connection so
- ``("status", {worker_index: text})``: once a second, the ``status`` message for each device
- ``("stopping",)``: take no new connection (1001); ``("exit",)``: close what is left (1001), end

Hub first frame to a front-end: ``(sys_path, config)`` (its ``config`` holds the token, so it
travels here, not on the command line).
"""

from __future__ import annotations

import asyncio
import pickle
import struct

FLUSH_S = 0.005
"""How often a front-end sends its batch by default (``serve --frontend-flush-ms``): at most this
long added to a stream's audio on its way in. The hub's cost is per frame and per stream in it: a
client sending 100 ms messages is one push a 100 ms whatever this period. A longer period was
most of what the server added to a caption, and a shorter one cost the serving process no more
CPU (docs/serve.md, "The way in and the way back, shortened")."""
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
