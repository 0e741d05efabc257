"""One stream's state inside the engine, shared by its parts (the audio front, the model steps,
the report), and the slice of a block that the engine cuts when a backlog comes in pieces."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from captioner.engine.admission import Priority
from captioner.engine.policy.local_agreement import LocalAgreementPolicy
from captioner.engine.speakers import SpeakerTrack
from captioner.events import SAMPLE_RATE_HZ


class BlockSlice(NamedTuple):
    """A part of an :class:`~captioner.events.AudioBlock` (its fields, its samples a view of the
    block's read-only ones), cut on the engine's own thread when a backlog is fed in slices: a
    frozen dataclass with its checks cost a visible share of the engine thread at many streams
    (docs/decisions/002-engine-host-path.md), for a value that never leaves the thread."""

    stream: str
    first_sample: int
    capture_ns: int
    samples: np.ndarray


@dataclass(slots=True)
class StreamState:
    """One stream as the engine keeps it (the engine's thread only)."""

    name: str
    slot: int
    vad_row: int
    """The stream's row of the engine's :class:`~captioner.engine.vad_bank.VadBank`."""
    policy: LocalAgreementPolicy
    next_sample: int = 0
    """Samples pushed so far (stream clock), gaps filled with zeros."""
    vad_frames: int = 0
    """Feature frames the VAD has looked at."""
    frame_offset: int = 0
    """Stream frames before the feature ring's frame 0 (the features restarted, e.g. for a
    model with another number of mel bands); stream frame = feature frame + offset."""
    last_update_s: float = 0.0
    speech_since_update: bool = False
    segment_speech_frames: int = 0
    start_ns: int | None = None
    """Wall time at which sample 0 of the stream was captured."""
    tail: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    """The last ``FRAME_SAMPLES`` samples taken in (see ``replace_recognizer``)."""
    captures: deque = field(default_factory=lambda: deque(maxlen=512))
    """(end_sample, capture_ns) of recent blocks, to date any stream position."""
    last_samples: np.ndarray | None = None
    """The samples of the newest block taken in: its level is worked out when status asks
    (on every push it was a Python dot per stream per 100 ms, for a number shown once a second)."""
    gap_samples: int = 0
    language: str | None = None
    """The language this stream is decoded in (``None``: the engine's, else detected)."""
    segment_language: str | None = None
    """Language detected for the open segment: kept until it closes, so that updates of one
    sentence are not decoded as different languages."""
    priority: int = Priority.LIVE
    last_language: str | None = None
    """The language detected on the stream's last segment (decides whether an ``auto`` stream
    may go to an English-only light model)."""
    segment_model: str | None = None
    """``"main"`` or ``"light"``: the model that decodes the open segment, chosen at its first
    update and kept until it closes, so one sentence is never heard by two models."""
    last_update_ns: int | None = None
    """Clock time of the stream's last update within the open segment (update intervals)."""
    decoded_by: str | None = None
    """The recognizer (name) of the stream's last hypothesis: a forced prefix is its tokens, so
    it goes only to that recognizer (tiny.en and base number their tokens differently)."""
    speakers: SpeakerTrack | None = None
    """Its speaker labels, when they are on for it."""

    @property
    def level_dbfs(self) -> float:
        """Input level of the newest block (dBFS; -120 before any)."""
        x = self.last_samples
        if x is None:
            return -120.0
        # The level is for display: a float32 dot is plenty, and much cheaper.
        rms = math.sqrt(float(np.dot(x, x)) / x.size) if x.size else 0.0
        return 20 * math.log10(max(rms, 1e-6))

    def capture_ns_at(self, sample: int) -> int | None:
        for end_sample, capture_ns in reversed(self.captures):
            if end_sample <= sample:
                # The block ending here or earlier; extrapolate by the sample count.
                return capture_ns + (sample - end_sample) * 1_000_000_000 // SAMPLE_RATE_HZ
        if self.captures:
            end_sample, capture_ns = self.captures[0]
            return capture_ns - (end_sample - sample) * 1_000_000_000 // SAMPLE_RATE_HZ
        return None
