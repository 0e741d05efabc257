"""Values that cross threads. All are frozen; arrays inside them are made read-only.

Only the standard library and NumPy are imported here, so every layer can use these types.
Time is sample based: a stream's clock is the index of its samples at ``SAMPLE_RATE_HZ``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

SAMPLE_RATE_HZ = 16_000
"""Every source delivers mono float32 audio at this rate (Whisper's rate)."""

FRAME_SAMPLES = 160
"""One 10 ms frame at ``SAMPLE_RATE_HZ``; also the hop of the features."""

FRAMES_PER_S = SAMPLE_RATE_HZ // FRAME_SAMPLES
"""100: frames (and feature frames) per second of a stream's clock."""

WINDOW_S = 30
"""Whisper's window: every encoder input is 30 s of audio (shorter windows are padded)."""

WINDOW_FRAMES = WINDOW_S * FRAMES_PER_S
"""3000: feature frames in one window."""

NS_PER_S = 1_000_000_000
"""Capture times are ``time.monotonic_ns()`` values."""

MIN_FREE_VRAM_FRACTION = 0.15
"""Below this share of free GPU memory the engine refuses new streams: the streams already
captioned keep their headroom for longer windows and batch growth (the dashboard draws this line)."""


def _frozen_array(samples: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(samples, dtype=np.float32)
    if array is samples and array.flags.writeable:
        # Callers hand over their buffer; a view keeps their array writable while ours is not.
        array = array.view()
    array.flags.writeable = False
    return array


@dataclass(frozen=True, slots=True)
class AudioBlock:
    """A run of whole 10 ms frames from one stream.

    ``first_sample`` is the index of ``samples[0]`` in the stream's 16 kHz clock, so gaps
    (dropped blocks) show as jumps. ``capture_ns`` is ``time.monotonic_ns()`` when the last
    sample of the block was captured (or, for a file replay, when it was released).
    """

    stream: str
    first_sample: int
    capture_ns: int
    samples: np.ndarray

    def __post_init__(self) -> None:
        samples = _frozen_array(self.samples)
        if samples.ndim != 1:
            raise ValueError(f"AudioBlock samples must be 1-D, got shape {samples.shape}")
        object.__setattr__(self, "samples", samples)

    @property
    def n_samples(self) -> int:
        return int(self.samples.shape[0])

    @property
    def end_sample(self) -> int:
        return self.first_sample + self.n_samples

    @property
    def start_s(self) -> float:
        return self.first_sample / SAMPLE_RATE_HZ

    @property
    def end_s(self) -> float:
        return self.end_sample / SAMPLE_RATE_HZ


@dataclass(frozen=True, slots=True)
class FramedAudio:
    """Several streams' audio, each already whole 16 kHz frames on its own stream clock, in one
    array: stream ``streams[i]`` has ``lengths[i]`` samples starting at ``samples`` offset
    ``sum(lengths[:i])``, at index ``firsts[i]`` of its clock, its last sample captured at
    ``capture_ns[i]``.

    A server's front-end processes frame every connection's audio (the resampling and the
    framing of :class:`~captioner.audio.ingest.StreamIngest`, in their own interpreters), so the
    serving process hands each of its engines one of these per front-end frame instead of one
    item per connection and message: at a thousand connections that is ten thousand inbox items,
    ingests and ring entries a second less on the one interpreter lock that the serving loop and
    every engine's worker share.
    """

    streams: tuple[str, ...]
    firsts: tuple[int, ...]
    capture_ns: tuple[int, ...]
    lengths: tuple[int, ...]
    samples: np.ndarray

    def __post_init__(self) -> None:
        if not len(self.streams) == len(self.firsts) == len(self.capture_ns) == len(self.lengths):
            raise ValueError("FramedAudio needs one first sample, capture time and length per stream")
        samples = _frozen_array(self.samples)
        if samples.ndim != 1 or samples.shape[0] != sum(self.lengths):
            raise ValueError(f"FramedAudio samples must be 1-D with {sum(self.lengths)} samples, "
                             f"got shape {samples.shape}")
        if any(n % FRAME_SAMPLES for n in self.lengths):
            raise ValueError(f"FramedAudio holds whole {FRAME_SAMPLES}-sample frames per stream")
        object.__setattr__(self, "samples", samples)

    def pieces(self):
        """``(stream, first_sample, capture_ns, samples)`` per stream, each a view of ``samples``."""
        offset = 0
        for stream, first, capture_ns, n_samples in zip(self.streams, self.firsts, self.capture_ns, self.lengths):
            yield stream, first, capture_ns, self.samples[offset:offset + n_samples]
            offset += n_samples


CaptionKind = Literal["partial", "final", "clear"]


@dataclass(frozen=True, slots=True)
class CaptionUpdate:
    """One change to what a stream's captions show.

    ``partial`` replaces the stream's provisional text (it may still change); ``final`` is
    committed text, appended and never changed again, and takes the provisional text off the
    screen (a ``partial`` after it in the same batch shows what is still provisional);
    ``clear`` takes the provisional text back with nothing committed (its ``text`` is empty).
    ``start_s``/``end_s`` are the audio the text covers, in seconds of that stream's clock: a
    stream's finals never overlap and never go back. Times are to the millisecond. ``emitted_audio_s`` is how much audio of the
    stream had been captured when the update was made; ``emitted_wall_s`` is wall time since the
    stream started when the engine handed the update out (not earlier: a step's caller sees it
    no sooner), so their difference shows how far processing runs behind capture.
    """

    stream: str
    kind: CaptionKind
    text: str
    start_s: float
    end_s: float
    emitted_audio_s: float
    emitted_wall_s: float
    segment: int = 0
    language: str = ""
    words: tuple[tuple[str, float, float], ...] = ()
    """``(word, start_s, end_s)`` per word of ``text``, on the stream's clock, where the policy
    measured them (AlignAtt: the alignment heads' DTW); empty where it has none (no times are
    invented)."""
    speaker: str = ""
    """Who said it, where the stream's speakers are labelled ("Speaker 1", "Speaker 2", ...;
    decided once a line is committed, never changed); "" where they are not. Last, with a
    default, so that values made by position and readers that predate it go on working."""

    def to_json_dict(self) -> dict:
        """The fields as JSON values; ``speaker`` only where there is one (a reader that does not
        know it sees what it always saw)."""
        extra = {"speaker": self.speaker} if self.speaker else {}
        return {
            "stream": self.stream,
            "kind": self.kind,
            "text": self.text,
            "start_s": round(self.start_s, 3),
            "end_s": round(self.end_s, 3),
            "emitted_audio_s": round(self.emitted_audio_s, 3),
            "emitted_wall_s": round(self.emitted_wall_s, 3),
            "segment": self.segment,
            "language": self.language,
            "words": [[w, round(a, 3), round(b, 3)] for w, a, b in self.words],
            **extra,
        }


@dataclass(frozen=True, slots=True)
class TelemetrySample:
    """One reading of a GPU (and of the host), taken by the telemetry thread.

    ``None`` means "N/A": the value could not be read (no NVIDIA GPU, an NVML error, a field the
    GPU does not support). Units are in the names.
    """

    time_s: float
    gpu_index: int | None = None
    gpu_name: str | None = None
    temperature_c: float | None = None
    slowdown_temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    utilization_pct: float | None = None
    vram_used_bytes: int | None = None
    vram_total_bytes: int | None = None
    vram_process_bytes: int | None = None
    """Held by this process and those it started (a GPU engine runs in a child process)."""
    cpu_pct: float | None = None
    process_cpu_pct: float | None = None


@dataclass(frozen=True, slots=True)
class PipelineStatus:
    """How the captioning pipeline is keeping up, published a few times a second.

    Latencies are the most recent measurements; ``None`` where nothing was measured yet.
    ``real_time_factor`` is processing time over audio time (below 1 keeps up).
    ``lost_inputs`` are the streams whose live input device stopped and is being waited for
    (their streams stay open, in ``streams``; ``message`` says why). ``streams`` are the streams
    held; ``admitted_load``, ``streams_refused`` and ``light_model`` are admission's figures
    (docs/capacity.md).
    """

    time_s: float
    provider: str
    model: str
    device_name: str
    streams: tuple[str, ...] = ()
    frame_latency_ms: float | None = None
    step_latency_ms: float | None = None
    caption_latency_s: float | None = None
    queue_depth: int = 0
    dropped_frames: int = 0
    lag_s: float = 0.0
    real_time_factor: float | None = None
    input_levels_dbfs: tuple[float, ...] = ()
    batch_size: int = 0
    state: str = "running"
    message: str = ""
    extra: tuple[tuple[str, float], ...] = field(default=())
    lost_inputs: tuple[str, ...] = ()
    worker_restarts: int = 0
    admitted_load: float | None = None
    """The engine's time budget in use by the open streams (model time per round of updates over
    what the scheduler allows; 1.0 is where intervals start to stretch); ``None`` before any step."""
    streams_refused: int = 0
    """New streams refused at capacity so far (memory floor or update-interval limit)."""
    light_model: str = ""
    """The light model new segments of English streams go to under load; empty when not in use."""
