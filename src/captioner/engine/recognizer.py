"""What the engine needs of a model, and what it hands one: a window of log-mel frames per due
stream in, one :class:`~captioner.engine.policy.words.Hypothesis` per window out.

Whisper fills this slot today (:mod:`captioner.engine.whisper`); a frame-synchronous streaming
model, or a scripted recognizer in tests, fits the same protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from captioner.engine.policy.words import Hypothesis


@dataclass(frozen=True, slots=True)
class WindowRequest:
    """One stream's share of a batched model step."""

    stream: str
    log_mel: object
    """Raw log10-mel frames ``[n_mels, n_frames]`` (``n_frames`` ≤ 3000), NumPy or CuPy."""
    start_s: float
    """Stream time of the first frame."""
    prompt: str
    """Committed text that precedes the window."""
    language: str | None
    alignment: bool = False
    """The stream's policy reads attention (AlignAtt): give its words ``attend_s`` and times
    from the alignment heads when the model has them."""
    prefix: tuple[int, ...] = ()
    """Tokens the window's text is forced to begin with: the stream's committed words at the
    buffer's start, from this recognizer's last hypothesis of the same window start
    (``Hypothesis.tokens``); a recognizer without token access ignores them."""


class Recognizer(Protocol):
    """What the engine needs of a model (Whisper today; another model fits the same slot).
    The members a model may add are :class:`Capabilities`; read them with
    :func:`capabilities_of`, never by probing the model."""

    name: str
    provider: str
    device_name: str
    n_mels: int

    def decode(self, requests: list[WindowRequest]) -> list[Hypothesis]:
        """One batched step: a hypothesis per request, times on each stream's clock."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a recognizer may have beyond :class:`Recognizer`, each under the member name it
    has on the model; one that does not declare a member has not got it (so a model that does
    not say it is multilingual is English-only, everywhere)."""

    is_multilingual: bool = False
    check_language: Callable[[str | None], str | None] | None = None
    """A language code, or ``None`` (detect), as the model takes it; a one-line ``UserError``
    when it does not."""
    warm_up: Callable[[int], int] | None = None
    """Runs the model once at each batch shape up to the given rows; returns the calls made."""
    decode_pending: Callable | None = None
    """``decode`` whose hypotheses are read later: the step's host work overlaps the model."""
    takes_host_work: bool = False
    """``decode`` takes ``while_encoding=``, a callable run while the encoder is busy (the
    model says so by having ``overlaps_host_work``)."""
    overlaps_host_work: bool = False
    """That callable runs while the device works (not before the model call)."""
    reads_rings: bool = False
    """The model reads its windows from the feature rings itself (``RingWindow`` requests)."""
    clock_starts_at: Callable[[str, float], None] | None = None
    """Told the stream time a re-fed stream's clock starts at (a model that answers by stream
    time: the tests' scripted listener)."""
    decode_chooser: object | None = None
    """From how many rows the device decodes (``models/decode_choice.py``)."""
    buffer_bytes: Callable[[], dict[str, float]] | None = None
    """The model's own device buffers by kind (``runtime.buffer_bytes``)."""


def capabilities_of(recognizer) -> Capabilities:
    """The :class:`Capabilities` ``recognizer`` declares (none for ``None``)."""
    if recognizer is None:
        return Capabilities()
    runtime = getattr(recognizer, "runtime", None)
    return Capabilities(
        is_multilingual=bool(getattr(recognizer, "is_multilingual", False)),
        check_language=getattr(recognizer, "check_language", None),
        warm_up=getattr(recognizer, "warm_up", None),
        decode_pending=getattr(recognizer, "decode_pending", None),
        takes_host_work=hasattr(recognizer, "overlaps_host_work"),
        overlaps_host_work=bool(getattr(recognizer, "overlaps_host_work", False)),
        reads_rings=bool(getattr(recognizer, "reads_rings", False)),
        clock_starts_at=getattr(recognizer, "clock_starts_at", None),
        decode_chooser=getattr(recognizer, "decode_chooser", None),
        buffer_bytes=getattr(runtime, "buffer_bytes", None),
    )
