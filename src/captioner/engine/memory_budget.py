"""The GPU memory one engine may use (``--gpu-memory``): its process's own memory against a budget.

The device's free memory (the VRAM floor) says nothing of an engine that must leave room for
other work on its card, or that stands in for a smaller card on a larger one; this counts what
the engine's own process holds, as NVML sees it (the CUDA context, ONNX Runtime's arena, CuPy's
pool), so admission refuses a stream before the budget runs out.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from captioner.engine.admission import Memory

READ_EVERY_S = 1.0
"""NVML's process list costs about a millisecond; a burst of openings reads it once a second."""


class ProcessMemory:
    """This process's GPU memory against ``budget_bytes``. Made and read on the engine's thread
    (NVML's reader is bound to the thread that made it; it lives as long as the engine). Where
    NVML cannot count a process's memory, ``accounted`` (the bytes the engine's own pools and
    buffers hold) stands in."""

    def __init__(self, gpu_index: int, budget_bytes: int, accounted: Callable[[], int]) -> None:
        self.gpu_index = gpu_index
        self.budget_bytes = int(budget_bytes)
        self._accounted = accounted
        self._reader = None
        self._used: int | None = None
        self._read_at_s = -READ_EVERY_S

    def used_bytes(self) -> int:
        now_s = time.monotonic()
        if self._used is None or now_s - self._read_at_s >= READ_EVERY_S:
            self._used = self._measured()
            self._read_at_s = now_s
        return self._used if self._used is not None else int(self._accounted())

    def memory(self) -> Memory:
        return Memory(max(0, self.budget_bytes - self.used_bytes()), self.budget_bytes)

    def _measured(self) -> int | None:
        if self._reader is None:
            from captioner.gpu.telemetry import NvmlReader  # noqa: PLC0415 - only an engine with a budget needs it

            self._reader = NvmlReader(self.gpu_index)
        return self._reader.read_gpu().get("vram_process_bytes")
