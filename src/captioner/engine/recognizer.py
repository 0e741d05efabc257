"""What the engine needs of a model, and what it hands one: a window of log-mel frames per due
stream in, one :class:`~captioner.engine.policy.words.Hypothesis` per window out.

Whisper fills this slot today (:mod:`captioner.engine.whisper`); a frame-synchronous streaming
model, or a scripted recognizer in tests, fits the same protocol.
"""

from __future__ import annotations

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
    """What the engine needs of a model (Whisper today; another model fits the same slot)."""

    name: str
    provider: str
    device_name: str
    n_mels: int

    def decode(self, requests: list[WindowRequest]) -> list[Hypothesis]:
        """One batched step: a hypothesis per request, times on each stream's clock."""
