"""The messages between a captioner and its owner: one vocabulary for the worker's inbox and a
model host's pipe.

Commands go to the engine's side: the worker thread's inbox (from the pipeline) and a model
host (from the supervisor, in process or over a pipe to its child) take the same ones. Audio
travels beside them, already framed (:class:`~captioner.events.FramedAudio`; a device's raw
chunks, :class:`~captioner.audio.source.RawChunk`, only in the worker's inbox). Events come back
from a host; a stream's life (opened, refused, done) comes as events in order with its
updates, so nothing needs to compare status snapshots to find it.

All are frozen dataclasses with slots, and a ``match`` on the class says which one came. They
pickle as their class and field values (:class:`Message`): a thousand served streams' host sends
thousands of them a second, and a frozen dataclass's own pickling took four times as long.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from captioner.events import CaptionUpdate, PipelineStatus


class Message:
    """Pickled as ``(class, field values)``: rebuilt by one constructor call instead of a
    ``__setstate__`` that sets each slot through ``object.__setattr__``."""

    __slots__ = ()

    def __reduce__(self):
        return type(self), tuple(getattr(self, name) for name in self.__match_args__)


# -- commands ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OpenStream(Message):
    """Open stream ``label`` (refused at capacity: :class:`Refused` comes back)."""

    label: str
    language: str | None = None
    priority: int | str = "live"
    """How the stream ranks when compute is short (``"live"``, ``"replay"`` or an int:
    :class:`~captioner.engine.admission.Priority`); the pipeline takes it from the source."""
    source: str | None = None
    """What the stream is (``microphone``, ``meeting``, ``file``, ``remote``; ``None``: not
    said): whether ``speakers="auto"`` labels its speakers."""
    base_sample: int = 0
    """A host's stream clock starts at this 16 kHz index of the owner's (a re-fed stream
    starts at its checkpoint); its updates come back on the owner's clock."""
    segment_base: int = 0
    """Added to the segments of its updates (a re-fed stream's go on after the last one seen)."""
    readmit: bool = False
    """A stream the engine held before (a restart's re-feed): admitted as it was."""
    history: tuple[str, ...] = ()
    """The texts of words committed before, that prompt its first windows (``()``: a new stream)."""


@dataclass(frozen=True, slots=True)
class CloseStream(Message):
    """The stream's audio has ended: caption what was sent, commit what it shows, and close it
    (:class:`StreamDone` comes back once it is)."""

    label: str


@dataclass(frozen=True, slots=True)
class SetLanguage(Message):
    language: str | None
    """A code, or ``None`` for English-only models / detection by multilingual ones."""


@dataclass(frozen=True, slots=True)
class SwapModel(Message):
    model: str
    """A model name ("tiny.en", "base") or a CTranslate2 Whisper folder."""


@dataclass(frozen=True, slots=True)
class InputLost(Message):
    """The live source of stream ``label`` stopped delivering (``reason``: one line). The
    stream stays open, filled with silence, until a fresh source delivers after :class:`InputBack`."""

    label: str
    reason: str


@dataclass(frozen=True, slots=True)
class InputBack(Message):
    """A fresh source for stream ``label`` was started: the chunks of that label that follow
    in the inbox count their samples from 0 again. The input is back with the first of them."""

    label: str


@dataclass(frozen=True, slots=True)
class Wake(Message):
    """Nothing to apply: the captioner has something for the worker's next step to pick up
    (a model process sent its captions) while the worker may be asleep on this inbox."""


WAKE = Wake()


@dataclass(frozen=True, slots=True)
class CloseHost(Message):
    """Commit what every stream shows, send it back, then :class:`HostClosed`, and exit."""


WorkerCommand = OpenStream | CloseStream | SetLanguage | SwapModel | InputLost | InputBack | Wake
"""What the worker's inbox takes beside audio."""
HostCommand = OpenStream | CloseStream | SetLanguage | SwapModel | CloseHost
"""What a model's host takes beside :class:`~captioner.events.FramedAudio`."""

# -- events ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadProgress(Message):
    """How the model's loading goes (``fraction`` from 0 to 1)."""

    message: str
    fraction: float


@dataclass(frozen=True, slots=True)
class HostReady(Message):
    info: Any
    """The loaded host's :class:`~captioner.engine.host.HostInfo`."""


@dataclass(frozen=True, slots=True)
class Updates(Message):
    """Caption updates, times and segments on the owner's clock."""

    updates: list[CaptionUpdate]


@dataclass(frozen=True, slots=True)
class Checkpoint(Message):
    """Stream ``label`` has nothing open: a fresh engine fed its audio from 16 kHz index
    ``sample`` on, prompted by ``history``, would caption it as this one will (``history`` is
    ``None`` when no word was committed since its last checkpoint: the one sent then holds)."""

    label: str
    sample: int
    history: tuple[str, ...] | None


@dataclass(frozen=True, slots=True)
class StreamOpened(Message):
    """The engine took the stream."""

    label: str


@dataclass(frozen=True, slots=True)
class Refused(Message):
    """The engine refused the stream at capacity (``reason``: one line)."""

    label: str
    reason: str


@dataclass(frozen=True, slots=True)
class StreamDone(Message):
    """The stream is closed: every update of it came before this."""

    label: str


@dataclass(frozen=True, slots=True)
class HostStatus(Message):
    """The host's status, also its heartbeat."""

    status: PipelineStatus


@dataclass(frozen=True, slots=True)
class Notices(Message):
    notices: list
    """:class:`~captioner.engine.language_check.LanguageNotice` s since the last ones."""


@dataclass(frozen=True, slots=True)
class HostFailed(Message):
    """The host failed and takes no more messages; ``user_error``: the caller's mistake (an
    unknown model, a bad setting), not the host's."""

    reason: str
    user_error: bool = False


@dataclass(frozen=True, slots=True)
class HostClosed(Message):
    """The host committed its streams (after :class:`CloseHost`) and exits."""


Event = LoadProgress | HostReady | Updates | Checkpoint | StreamOpened | Refused | StreamDone | HostStatus | \
    Notices | HostFailed | HostClosed

Lifecycle = StreamOpened | Refused | StreamDone
"""A stream's life as the engine tells it, in order with its updates (a worker's outbox carries
both)."""
LIFECYCLE_KEPT = 4096
"""Lifecycle events a captioner keeps until they are taken (one whose caller never takes them
keeps only the latest)."""


class LifecycleLog:
    """A captioner's lifecycle events until its caller takes them (the latest
    :data:`LIFECYCLE_KEPT`). Used by the thread that drives the captioner."""

    def __init__(self) -> None:
        self._events: deque[Lifecycle] = deque(maxlen=LIFECYCLE_KEPT)

    def add(self, event: Lifecycle) -> None:
        self._events.append(event)

    def take(self) -> list[Lifecycle]:
        events = list(self._events)
        self._events.clear()
        return events
