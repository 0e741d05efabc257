"""A run's record: telemetry, pipeline status and caption streams in one JSON-Lines file.

Standard library and NumPy only, so a run recorded headless (a GPU server with no Qt) opens in the
dashboard on a desktop later, and two runs can be compared. The first line is a header::

    {"format": "captioner-trace", "version": 1, "created_utc": "...", "meta": {...}}

then one object per event, ``{"type": "telemetry" | "status" | "caption", ...fields}``, in the
order they were recorded. Field names are those of :mod:`captioner.events`; ``None`` stays
``null``. A reader skips event types and fields it does not know, so later versions may add them.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from captioner.errors import UserError
from captioner.events import CaptionUpdate, PipelineStatus, TelemetrySample

TRACE_FORMAT = "captioner-trace"
TRACE_VERSION = 1

_TYPES: dict[type, str] = {TelemetrySample: "telemetry", PipelineStatus: "status", CaptionUpdate: "caption"}
_CLASSES = {name: cls for cls, name in _TYPES.items()}


def caption_latency_s(update: CaptionUpdate) -> float:
    """How late an update shows its text: from the end of the audio it covers to its emission.

    ``emitted_audio_s - end_s`` is the delay in the stream's audio clock (the model waited for
    more audio, or agreement); ``emitted_wall_s - emitted_audio_s`` is how far processing ran
    behind capture, counted only when positive because a file replayed faster than real time
    runs ahead of its audio.
    """
    behind_s = max(0.0, update.emitted_wall_s - update.emitted_audio_s)
    return max(0.0, update.emitted_audio_s - update.end_s) + behind_s


# ---------------------------------------------------------------------------------------------
# Encoding


def event_to_dict(event: TelemetrySample | PipelineStatus | CaptionUpdate) -> dict[str, Any]:
    kind = _TYPES.get(type(event))
    if kind is None:
        raise TypeError(f"cannot record {type(event).__name__} in a trace")
    record: dict[str, Any] = {"type": kind}
    for f in dataclasses.fields(event):
        value = getattr(event, f.name)
        if isinstance(value, tuple):
            value = [list(v) if isinstance(v, tuple) else v for v in value]
        elif isinstance(value, float):
            value = round(value, 6)
        record[f.name] = value
    return record


def event_from_dict(record: dict[str, Any]) -> TelemetrySample | PipelineStatus | CaptionUpdate | None:
    """The event of one line, or ``None`` for a type this version does not know."""
    cls = _CLASSES.get(record.get("type", ""))
    if cls is None:
        return None
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for name, value in record.items():
        if name not in known:
            continue
        if isinstance(value, list):
            value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        kwargs[name] = value
    return cls(**kwargs)


# ---------------------------------------------------------------------------------------------
# Recording


class TraceRecorder:
    """Appends events to a trace file as they happen; any thread may call :meth:`record`.

    Lines are flushed every ``flush_every`` events and on :meth:`close`, so a run that is killed
    keeps all but its last few events.
    """

    def __init__(self, path: str | os.PathLike, meta: dict[str, Any] | None = None, flush_every: int = 32) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self._file: IO[str] | None = self.path.open("w", encoding="utf-8")
        except OSError as exc:
            raise UserError(f"cannot write the trace {self.path}: {exc.strerror or exc}") from None
        self._flush_every = max(1, flush_every)
        self._pending = 0
        self.events = 0
        self._last_of: dict[type, Any] = {}
        self._write(header(meta))
        self._file.flush()

    def _write(self, record: dict[str, Any]) -> None:
        assert self._file is not None
        self._file.write(json.dumps(record, separators=(",", ":"), allow_nan=False, default=_json_default))
        self._file.write("\n")

    def record(self, event: TelemetrySample | PipelineStatus | CaptionUpdate) -> None:
        """Any thread."""
        record = _finite(event_to_dict(event))
        with self._lock:
            if self._file is None:
                return
            self._write(record)
            self.events += 1
            self._pending += 1
            if self._pending >= self._flush_every:
                self._file.flush()
                self._pending = 0

    def record_if_new(self, event: TelemetrySample | PipelineStatus | None) -> None:
        """Records a mailbox value (latest status or sample) unless it is the one recorded last
        for its type: polling a mailbox faster than it changes must not duplicate events."""
        if event is None:
            return
        kind = type(event)
        if self._last_of.get(kind) is event:
            return
        self._last_of[kind] = event
        self.record(event)

    def record_all(self, events: Iterable[TelemetrySample | PipelineStatus | CaptionUpdate]) -> None:
        for event in events:
            self.record(event)

    def close(self) -> None:
        with self._lock:
            file, self._file = self._file, None
        if file is not None:
            file.close()

    def __enter__(self) -> TraceRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def header(meta: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "format": TRACE_FORMAT,
        "version": TRACE_VERSION,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "meta": dict(meta or {}),
    }


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _finite(record: dict[str, Any]) -> dict[str, Any]:
    # JSON has no NaN/inf; an unmeasurable value is "not available", which a trace spells null.
    for key, value in record.items():
        if isinstance(value, float) and not np.isfinite(value):
            record[key] = None
    return record


def save_trace(path: str | os.PathLike, events: Iterable[Any], meta: dict[str, Any] | None = None) -> int:
    """Writes a whole run at once (e.g. the GUI's in-memory record); returns the event count."""
    with TraceRecorder(path, meta=meta, flush_every=1024) as recorder:
        recorder.record_all(events)
        return recorder.events


# ---------------------------------------------------------------------------------------------
# Loading


@dataclass
class Trace:
    """A loaded run. Event lists keep file order; ``meta`` is the header's free-form dict."""

    meta: dict[str, Any] = field(default_factory=dict)
    created_utc: str = ""
    version: int = TRACE_VERSION
    telemetry: list[TelemetrySample] = field(default_factory=list)
    statuses: list[PipelineStatus] = field(default_factory=list)
    captions: list[CaptionUpdate] = field(default_factory=list)

    def start_s(self) -> float:
        """The earliest ``time_s`` of telemetry and status (both are monotonic-clock stamps)."""
        times = [s.time_s for s in self.telemetry[:1]] + [s.time_s for s in self.statuses[:1]]
        return min(times) if times else 0.0

    def duration_s(self) -> float:
        times = [s.time_s for s in self.telemetry[-1:]] + [s.time_s for s in self.statuses[-1:]]
        return max(times) - self.start_s() if times else 0.0

    def telemetry_series(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """``(t_s, values)`` float64 arrays, ``t_s`` from :meth:`start_s`, NaN where N/A."""
        return _series(self.telemetry, name, self.start_s())

    def status_series(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        return _series(self.statuses, name, self.start_s())

    def final_captions(self) -> list[CaptionUpdate]:
        return [c for c in self.captions if c.kind == "final"]


def _series(items: list[Any], name: str, t0: float) -> tuple[np.ndarray, np.ndarray]:
    t = np.fromiter((s.time_s - t0 for s in items), dtype=np.float64, count=len(items))
    v = np.fromiter(
        (np.nan if getattr(s, name) is None else float(getattr(s, name)) for s in items),
        dtype=np.float64,
        count=len(items),
    )
    return t, v


def load_trace(path: str | os.PathLike) -> Trace:
    """Reads a trace; a file that is not one raises :class:`UserError` with the reason."""
    path = Path(path)
    try:
        with path.open(encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise UserError(f"cannot read the trace {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path} is not a captioner trace (not UTF-8 text)") from None
    if not lines:
        raise UserError(f"{path} is empty, not a captioner trace")
    try:
        head = json.loads(lines[0])
    except json.JSONDecodeError:
        head = None
    if not isinstance(head, dict) or head.get("format") != TRACE_FORMAT:
        raise UserError(f"{path} is not a captioner trace (its first line has no '{TRACE_FORMAT}' header)")
    version = head.get("version")
    if not isinstance(version, int) or version > TRACE_VERSION:
        raise UserError(f"{path} is a trace of version {version}; this captioner reads up to {TRACE_VERSION}")
    trace = Trace(meta=dict(head.get("meta") or {}), created_utc=str(head.get("created_utc", "")), version=version)
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            event = event_from_dict(json.loads(line))
        except (json.JSONDecodeError, TypeError, ValueError, AttributeError):
            if number == len(lines):
                break  # a run killed mid-write leaves a torn last line; keep the rest
            raise UserError(f"{path}:{number}: not a valid trace event") from None
        if isinstance(event, TelemetrySample):
            trace.telemetry.append(event)
        elif isinstance(event, PipelineStatus):
            trace.statuses.append(event)
        elif isinstance(event, CaptionUpdate):
            trace.captions.append(event)
    return trace


# ---------------------------------------------------------------------------------------------
# Headless recording of a live run


def record_run(
    recorder: TraceRecorder,
    pipeline: Any,
    sampler: Any | None = None,
    *,
    done: Any = None,
    poll_s: float = 0.1,
    max_s: float | None = None,
) -> None:
    """Drains a running pipeline (``drain_captions()``, ``latest_status()``) and a telemetry
    sampler (``latest()``) into ``recorder`` until ``done()`` is true or ``max_s`` passes.

    Duck-typed, so this module imports no engine code; each status and sample is recorded once,
    also across several calls with the same recorder.
    """
    import time

    start = time.monotonic()
    while True:
        for update in pipeline.drain_captions():
            recorder.record(update)
        recorder.record_if_new(pipeline.latest_status())
        if sampler is not None:
            recorder.record_if_new(sampler.latest())
        if (done is not None and done()) or (max_s is not None and time.monotonic() - start >= max_s):
            break
        time.sleep(poll_s)
    for update in pipeline.drain_captions():
        recorder.record(update)
    recorder.record_if_new(pipeline.latest_status())
