"""The captioning protocol between ``captioner serve`` and its clients (docs/protocol.md).

Pure values and checks, no I/O: the server, the clients and the tests share them, so both ends
agree on one set of names, limits and close codes.

A client connects to ``/v1/listen?label=..&language=..&sample_rate=..&source=..`` (with
``Authorization: Bearer TOKEN`` when the server has a token), sends binary messages of
little-endian int16 mono PCM at ``sample_rate`` and, when its audio ends, the text message
``{"type": "end"}``. The server sends text messages, one JSON object each: ``ready`` once the
stream is admitted, ``caption`` updates, ``status`` every second; after ``end`` the remaining
finals, then a close with code 1000.
"""

from __future__ import annotations

import hmac
import json
import math
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import parse_qsl, urlsplit

from captioner.errors import one_line
from captioner.events import CaptionUpdate
from captioner.languages import WHISPER_LANGUAGES

PATH = "/v1/listen"
"""The one WebSocket endpoint."""
HEALTH_PATH = "/healthz"
"""Plain HTTP, no token: 200 while the process serves HTTP (liveness)."""
READY_PATH = "/readyz"
"""Plain HTTP, no token: 200 while the engine can take a new stream, else 503 and why (readiness)."""

MIN_SAMPLE_RATE_HZ = 8_000
MAX_SAMPLE_RATE_HZ = 48_000
DEFAULT_SAMPLE_RATE_HZ = 16_000
MAX_MESSAGE_BYTES = 1 << 20
"""A message over 1 MiB (about 33 s of 16 kHz audio) is refused with close code 1009."""
MAX_LABEL_CHARS = 64
STATUS_PERIOD_S = 1.0
"""The server sends a ``status`` message this often to every connection."""
MAX_AHEAD_S = 10.0
"""How far a client's audio may run ahead of the wall clock (counted from its first audio)
before the connection is closed with 1008: a live source cannot do that, and a client that
does would take a real-time stream's share of the GPU for a file upload. It bounds one message
too: a message of more than this much audio (320,000 bytes at 16 kHz) is refused as it arrives."""
IDLE_TIMEOUT_S = 60.0
"""A connection that sends no audio for this long is closed with 1001 (``serve --idle-timeout-s``)."""
MAX_CONNECTIONS_PER_CLIENT = 16
"""Connections one client address may hold at once (``serve --max-connections-per-client``)."""
DRAIN_S = 10.0
"""How long a stopping server may take to caption every stream's audio to its end before it
closes them all with 1001 (``serve --drain-s``). A service manager's own stop timeout must be
longer (systemd's default is 90 s)."""

# Close codes (RFC 6455 section 7.4.1, the IANA registry); docs/protocol.md lists when each is used.
CLOSE_NORMAL = 1000
"""After ``end``: every final was sent."""
CLOSE_GOING_AWAY = 1001
"""The server is shutting down (each stream's audio was captioned to its end and sent first),
or the connection sent no audio for :data:`IDLE_TIMEOUT_S`."""
CLOSE_UNSUPPORTED = 1003
"""A text message other than ``{"type": "end"}`` where audio was expected."""
CLOSE_BAD_PAYLOAD = 1007
"""A binary message that is not whole int16 samples (an odd number of bytes)."""
CLOSE_POLICY = 1008
"""An unknown or bad query parameter, audio much faster than real time, a client that does not read."""
CLOSE_TOO_BIG = 1009
"""A message over :data:`MAX_MESSAGE_BYTES`."""
CLOSE_INTERNAL = 1011
"""The engine failed under the stream (or a client did not answer pings: websockets' keepalive)."""
CLOSE_TRY_LATER = 1013
"""The server is at capacity (no room for another stream), its engine is being restarted, or the
client holds as many connections as one client may: try later or another server."""

RETRYABLE_CLOSE_CODES = frozenset({CLOSE_GOING_AWAY, CLOSE_INTERNAL, CLOSE_TRY_LATER, 1006, 1012})
"""Codes after which a client may connect again (1006: the connection broke without a close;
1012: service restart). Every other code means the client's request itself was refused."""

KNOWN_PARAMETERS = ("label", "language", "sample_rate", "source")

CLIENT_SOURCES = ("microphone", "meeting", "file")
"""What a client may say its audio is (``source=``): a microphone (one person: under the
server's ``--speakers auto`` its lines carry no speaker), a meeting's audio (a monitor of an
output) or a recording. A stream whose client does not say is :data:`DEFAULT_SOURCE`."""
DEFAULT_SOURCE = "remote"
"""A stream whose client did not say what its audio is: ``--speakers auto`` labels its speakers."""


class ProtocolError(ValueError):
    """A client broke the protocol: ``code`` is the close code, the message its one-line reason."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(frozen=True, slots=True)
class StreamParams:
    """What a client asked for in its query string."""

    label: str = "Me"
    language: str | None = None
    """A language code, or ``None`` (the server's default: English for English-only models,
    detection per segment for multilingual ones)."""
    sample_rate_hz: int = DEFAULT_SAMPLE_RATE_HZ
    source: str = DEFAULT_SOURCE
    """What the audio is (one of :data:`CLIENT_SOURCES`, else :data:`DEFAULT_SOURCE`): whether
    the server's ``--speakers auto`` labels the stream's speakers."""


def parse_path(path: str) -> StreamParams:
    """The request path (``/v1/listen?...``) as :class:`StreamParams`; raises
    :class:`ProtocolError` (1008) for another path, an unknown or repeated parameter, a label
    that is empty, too long or not printable, a sample rate that is not a whole number of Hz
    in 8000..48000, or a source other than :data:`CLIENT_SOURCES`."""
    parts = urlsplit(path)
    if parts.path != PATH:
        raise ProtocolError(CLOSE_POLICY, f"unknown path {parts.path!r}: connect to {PATH}")
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    seen: dict[str, str] = {}
    for name, value in pairs:
        if name not in KNOWN_PARAMETERS:
            raise ProtocolError(CLOSE_POLICY, f"unknown parameter {name!r}: the parameters are "
                                              + ", ".join(KNOWN_PARAMETERS))
        if name in seen:
            raise ProtocolError(CLOSE_POLICY, f"parameter {name!r} given twice")
        seen[name] = value
    label = seen.get("label", "Me").strip()
    if not label or len(label) > MAX_LABEL_CHARS or not label.isprintable():
        raise ProtocolError(CLOSE_POLICY, f"label must be 1 to {MAX_LABEL_CHARS} printable characters")
    language = seen.get("language", "").strip().lower() or None
    if language == "auto":
        language = None
    if language is not None and not (language.isascii() and language.isalpha() and len(language) <= 8):
        raise ProtocolError(CLOSE_POLICY, f"language must be a code such as 'en' or 'de', or 'auto', not {language!r}")
    # A code no Whisper model has is refused here, before the engine: the model's tokenizer would
    # fail on it inside the engine, for every stream there (the link checks what the model has).
    if language is not None and language not in WHISPER_LANGUAGES:
        raise ProtocolError(CLOSE_POLICY, f"unknown language {language!r}: use a Whisper language code "
                                          "such as 'en' or 'de', or 'auto'")
    return StreamParams(label, language, parse_sample_rate(seen.get("sample_rate")), parse_source(seen.get("source")))


def parse_source(text: str | None) -> str:
    """``source=``: one of :data:`CLIENT_SOURCES` (:data:`DEFAULT_SOURCE` when not given or empty);
    anything else is refused (1008) before the stream reaches the engine."""
    source = (text or "").strip().lower()
    if not source:
        return DEFAULT_SOURCE
    if source not in CLIENT_SOURCES:
        raise ProtocolError(CLOSE_POLICY, f"source must be one of {', '.join(CLIENT_SOURCES)} (or not given), "
                                          f"not {source[:32]!r}")
    return source


def parse_sample_rate(text: str | None) -> int:
    if text is None or text == "":
        return DEFAULT_SAMPLE_RATE_HZ
    try:
        rate = float(text)
    except ValueError:
        rate = math.nan
    if not math.isfinite(rate) or not rate.is_integer():
        raise ProtocolError(CLOSE_POLICY, f"sample_rate must be a whole number of Hz, not {text!r}")
    if not MIN_SAMPLE_RATE_HZ <= rate <= MAX_SAMPLE_RATE_HZ:
        raise ProtocolError(CLOSE_POLICY, f"sample_rate {int(rate)} Hz is outside "
                                          f"{MIN_SAMPLE_RATE_HZ}..{MAX_SAMPLE_RATE_HZ} Hz")
    return int(rate)


def listen_path(label: str = "Me", language: str | None = None, sample_rate_hz: int = DEFAULT_SAMPLE_RATE_HZ,
                source: str | None = None) -> str:
    """The request path a client connects to (the inverse of :func:`parse_path`); ``source``
    (one of :data:`CLIENT_SOURCES`) only where the client knows what its audio is."""
    from urllib.parse import urlencode

    query = {"label": label, "sample_rate": str(int(sample_rate_hz))}
    if language:
        query["language"] = language
    if source:
        query["source"] = source
    return f"{PATH}?{urlencode(query)}"


def check_audio(message: bytes | str) -> int:
    """A client message where audio is expected: its sample count; raises :class:`ProtocolError`
    for text that is not ``end`` (1003) or bytes that are not whole int16 samples (1007).
    Returns -1 for the ``end`` message."""
    if isinstance(message, str):
        if is_end(message):
            return -1
        raise ProtocolError(CLOSE_UNSUPPORTED, 'text message where audio was expected: the only text '
                                               'message a client sends is {"type": "end"}')
    if len(message) % 2:
        raise ProtocolError(CLOSE_BAD_PAYLOAD, f"binary message of {len(message)} bytes: audio is whole "
                                               "little-endian int16 samples (an even number of bytes)")
    return len(message) // 2


def is_end(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, dict) and value.get("type") == "end" and len(value) == 1


END_MESSAGE = json.dumps({"type": "end"})


class Pace:
    """Whether a client's audio keeps to real time: it may run at most ``max_ahead_s`` ahead of
    the wall clock, counted from its first audio message (a reconnecting client may send what it
    held during the break, a burst; a file uploaded at full speed is refused)."""

    __slots__ = ("max_ahead_s", "_first_s", "audio_s")

    def __init__(self, max_ahead_s: float = MAX_AHEAD_S) -> None:
        self.max_ahead_s = max_ahead_s
        self._first_s: float | None = None
        self.audio_s = 0.0

    def add(self, seconds: float, now_s: float) -> None:
        """Counts ``seconds`` of audio received at ``now_s``; raises :class:`ProtocolError` (1008)
        once the audio is more than ``max_ahead_s`` ahead of the clock."""
        if self._first_s is None:
            self._first_s = now_s
        self.audio_s += seconds
        ahead_s = self.audio_s - (now_s - self._first_s)
        if ahead_s > self.max_ahead_s:
            raise ProtocolError(CLOSE_POLICY, f"audio arrives faster than real time ({ahead_s:.0f} s ahead "
                                              f"of the clock, {self.max_ahead_s:g} s allowed): send it as it is captured")


# -- authorization ---------------------------------------------------------------------------------

def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header, else ``None``."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def token_matches(header: str | None, token: str) -> bool:
    """Whether the header carries ``token``; compared in constant time (``hmac.compare_digest``),
    so the time a wrong guess takes says nothing about how much of it was right."""
    given = bearer_token(header)
    return hmac.compare_digest((given or "").encode(), token.encode()) and given is not None


# -- server messages -------------------------------------------------------------------------------

def ready_message(label: str, model: str, sample_rate_hz: int, language: str | None) -> str:
    return json.dumps({"type": "ready", "stream": label, "model": model, "sample_rate": sample_rate_hz,
                       "language": language or "auto"})


def caption_fields(update: CaptionUpdate) -> tuple:
    """A caption update's values apart from its stream, in ``CaptionUpdate``'s order: what the
    hub hands a front-end for each caption. Making and pickling them is a tenth of making the
    message's JSON, which the front-ends do (:func:`caption_message`), in parallel and off the
    interpreter the engines' threads share: a step's burst of hundreds of captions no longer waits
    for the hub to encode each one (docs/serve.md). ``speaker`` last, as in ``CaptionUpdate``."""
    return (update.kind, update.text, update.start_s, update.end_s, update.emitted_audio_s, update.emitted_wall_s,
            update.segment, update.language, update.words, update.speaker)


def caption_message(label: str, fields: tuple) -> str:
    """A caption update of the stream the client named ``label`` (``fields``: :func:`caption_fields`):
    the fields of ``transcribe --format jsonl`` (``CaptionUpdate.to_json_dict``) with
    ``"type": "caption"`` in front; ``"speaker"`` only where the line has one, so a client that
    predates the field reads what it always read."""
    return json.dumps({"type": "caption", **CaptionUpdate(label, *fields).to_json_dict()})


def status_message(fields: dict) -> str:
    return json.dumps({"type": "status", **fields})


def parse_server_message(text: str) -> dict:
    """A server message as a dict with a ``type``; raises ``ValueError`` for anything else."""
    value = json.loads(text)
    if not isinstance(value, dict) or value.get("type") not in ("ready", "caption", "status"):
        raise ValueError(f"not a server message: {text[:80]!r}")
    return value


# -- helpers both servers use (the single-process one and each front-end) ----------------------------
def close_reason(text: str) -> str:
    """A close reason fits 123 bytes of UTF-8 (RFC 6455): cut at a character boundary."""
    raw = one_line(text).encode("utf-8")[:123]
    return raw.decode("utf-8", errors="ignore")


def closed_by_server(closed) -> ProtocolError | None:
    """Why a connection's reading ended (``closed``: websockets' ``ConnectionClosed``) when this
    server closed it first: a message over the size limit (1009), a keepalive ping the client did
    not answer (1011), an idle connection, a client that does not read. ``None`` when the client
    closed it, or it broke without a close frame."""
    return _by_server(closed.sent, closed.rcvd, closed.rcvd_then_sent)


def ended_by_server(ws) -> ProtocolError | None:
    """The same for a connection whose messages ended without an error: websockets ends the
    iteration quietly at a normal close (1000 or 1001), whoever began it. ``None`` where ``ws``
    does not say (the Ray Serve app's adapter)."""
    state = getattr(ws, "protocol", None)  # websockets' sans-I/O side of the connection
    if state is None or not hasattr(state, "close_sent"):
        return None
    return _by_server(state.close_sent, state.close_rcvd, state.close_rcvd_then_sent)


def _by_server(sent, rcvd, rcvd_then_sent) -> ProtocolError | None:
    if sent is not None and (rcvd is None or not rcvd_then_sent):
        return ProtocolError(sent.code, sent.reason)
    return None


def health_response(connection, path: str, not_ready: str):
    """``/healthz``: 200 (the process serves HTTP). ``/readyz``: 200 while the engine takes
    streams, else 503 and why, on one line (``not_ready``)."""
    if path == HEALTH_PATH:
        return connection.respond(HTTPStatus.OK, "ok\n")
    if not_ready:
        return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, f"not ready: {one_line(not_ready)}\n")
    return connection.respond(HTTPStatus.OK, "ready\n")


def peer(connection) -> str:
    """``host:port`` of a connection's far end, for the log (``?`` when unknown)."""
    address = getattr(connection, "remote_address", None)
    return f"{address[0]}:{address[1]}" if address else "?"


async def send_outbox(ws, outbox) -> None:
    """Send a connection's queued text messages in order until ``None`` is queued or the
    connection closes (one task per connection, on the server's loop)."""
    from websockets.exceptions import ConnectionClosed  # noqa: PLC0415 - only servers need websockets

    try:
        while True:
            message = await outbox.get()
            if message is None:
                return
            await ws.send(message)
    except ConnectionClosed:
        return
