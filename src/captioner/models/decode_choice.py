"""Which greedy path decodes a small batch, by measurement (``decode_on="auto"``).

Greedy decoding has two paths that give the same tokens: the host's (``LogitRules`` row by
row on logits copied to NumPy) and the device's (the rules, argmax and log-probability where
the logits lie, one ``[2, B]`` copy a step; on CUDA one kernel launch). Which is faster below
``DEVICE_DECODING_MIN_BATCH`` rows depends on the machine and on the code of the day: the
threshold was measured against the device path's old array code, before the rules became one
kernel, and a served engine makes many model steps that small, whose host decoding showed in its
profile (docs/decoding.md, "Choosing host or device decoding"). So below the threshold each
size class (1, 2, 3-4, 5-8, 9-15 rows) tries both paths a few times, then keeps to the one whose
decoder steps took less time, and tries the other again now and then (GPU clocks, contention
and the batch mix drift). A desktop's one stream starts on the host, as before.
"""

from __future__ import annotations

import threading
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from statistics import median

HOST = "host"
DEVICE = "device"
TRIALS = 3
"""Timed decodes of each path in a size class before the faster one is kept."""
RETRY_EVERY = 64
"""After that, one decode in this many (per size class) goes to the path not kept."""
RECENT = 5
"""A path's time is the median of its last this many decodes (s per decoder step): one slow
outlier (a CUDA graph captured at a bucket's first use; a pause of the collector) moves no
choice, and three newer decodes on one side turn it."""


def size_class(rows: int) -> int:
    """The smallest power of two not below ``rows``: the classes 1, 2, 3-4, 5-8, 9-16 rows
    are named by their upper bounds."""
    rows = max(1, int(rows))
    return 1 << (rows - 1).bit_length() if rows & (rows - 1) else rows


@dataclass
class _PathTime:
    runs: int = 0
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT))

    def add(self, s_per_step: float) -> None:
        self.recent.append(s_per_step)
        self.runs += 1

    @property
    def s_per_step(self) -> float:
        return float(median(self.recent)) if self.recent else 0.0


class DecodeChooser:
    """For one recognizer (one device): per size class, the seconds a decoder step takes on
    each path, and which path the next decode of that many rows takes. Thread-safe (the
    language check decodes on its own thread)."""

    def __init__(self, min_device_rows: int) -> None:
        """``min_device_rows``: from this many rows the device decodes, unmeasured (it is far
        ahead of the host there, docs/decoding.md; the host row by row only gets slower per row)."""
        self.min_device_rows = int(min_device_rows)
        self._times: dict[tuple[int, str], _PathTime] = {}
        self._decisions: dict[int, int] = {}
        self._lock = threading.Lock()
        self._forced: str | None = None

    @contextmanager
    def warming(self, path: str):
        """Within it every small batch takes ``path`` and nothing is timed: a recognizer's
        warm-up meets both paths' shapes (on CUDA each has its own buffers and captured graphs
        per bucket) without its first-use costs counting as either path's time."""
        if path not in (HOST, DEVICE):
            raise ValueError(f"path must be {HOST!r} or {DEVICE!r}, not {path!r}")
        self._forced = path
        try:
            yield
        finally:
            self._forced = None

    def path(self, rows: int) -> str:
        """``"host"`` or ``"device"`` for a greedy decode of ``rows`` windows."""
        if rows >= self.min_device_rows:
            return DEVICE
        if self._forced is not None:
            return self._forced
        size = size_class(rows)
        with self._lock:
            kept = self._kept(size)
            if not kept:
                host, device = self._time(size, HOST), self._time(size, DEVICE)
                return HOST if host.runs <= device.runs else DEVICE  # the host first: today's path
            decision = self._decisions[size] = self._decisions.get(size, 0) + 1
            return (DEVICE if kept == HOST else HOST) if decision % RETRY_EVERY == 0 else kept

    def record(self, rows: int, path: str, seconds: float, steps: int) -> None:
        """A decode of ``rows`` windows on ``path`` ran ``steps`` decoder steps in ``seconds``
        (its greedy loop: the model's steps and the rules, not the encoder or the prompt)."""
        if rows >= self.min_device_rows or steps <= 0 or path not in (HOST, DEVICE) or self._forced is not None:
            return
        with self._lock:
            self._time(size_class(rows), path).add(float(seconds) / int(steps))

    def _time(self, size: int, path: str) -> _PathTime:
        return self._times.setdefault((size, path), _PathTime())

    def _kept(self, size: int) -> str:
        """The path kept for a size class: the faster, once both had their trials (else "")."""
        host, device = self._time(size, HOST), self._time(size, DEVICE)
        if host.runs < TRIALS or device.runs < TRIALS:
            return ""
        return HOST if host.s_per_step <= device.s_per_step else DEVICE

    def table(self) -> dict[int, dict[str, float | int | str]]:
        """Per size class measured: each path's ms per decoder step and timed runs, and the
        path kept (``""`` while still trying both)."""
        with self._lock:
            out: dict[int, dict[str, float | int | str]] = {}
            for size in sorted({s for s, _ in self._times}):
                host, device = self._time(size, HOST), self._time(size, DEVICE)
                out[size] = {"host_ms_per_step": 1e3 * host.s_per_step, "host_runs": host.runs,
                             "device_ms_per_step": 1e3 * device.s_per_step, "device_runs": device.runs,
                             "kept": self._kept(size)}
            return out

    def device_from_rows(self) -> int:
        """The fewest rows from which every size class measured so far is kept on the device
        (``min_device_rows`` while the host is kept, or still tried, in the class just below)."""
        table = self.table()
        rows = self.min_device_rows
        size = size_class(self.min_device_rows - 1)
        while size >= 1 and table.get(size, {}).get("kept") == DEVICE:
            rows = size // 2 + 1
            size //= 2
        return rows
