"""GPU and host telemetry: the one module that imports NVML (``pynvml`` from nvidia-ml-py).

Every NVML call goes through :meth:`NvmlReader._call`, which turns any error — no driver, no
library, a field this GPU does not support, a GPU that fell off the bus — into ``None``, shown as
"N/A". Nothing here raises into the caller, so a dashboard never dies of a telemetry hiccup.

Host CPU load and this process's CPU time come from psutil, which reads them on Linux and macOS
alike.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from captioner.events import TelemetrySample

SAMPLE_PERIOD_S = 0.5
"""2 Hz: often enough to see a step change, rare enough to cost nothing."""

HISTORY_SAMPLES = 2 * 60 * 10
"""Ten minutes at 2 Hz."""


# ---------------------------------------------------------------------------------------------
# Processes


def process_tree_pids(pid: int) -> set[int]:
    """``pid`` and every process it started, at any depth. On a GPU the model runs in a child
    process (the engine's host, ``engine/host.py``; a server's engines): counting only
    the process that samples showed a server's GPU memory as a small fraction of what its
    engines held (benchmarks/results/serve/HISTORY.md, "The server's own figure for its GPU memory was
    wrong"). A child that ends while being listed is left out."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:  # the process itself is gone: only its own pid is ours to match
        return {pid}
    return {pid, *(child.pid for child in children)}


# ---------------------------------------------------------------------------------------------
# Host CPU


CPU_MIN_INTERVAL_S = 0.1
"""The shortest interval a CPU share is worked out over. The kernel counts a process's CPU time in
clock ticks (10 ms on most Linux systems), so over a few milliseconds one tick reads as hundreds
of percent, as the sampler's first reading right after the meter was made once did
(docs/ui.md)."""


class CpuMeter:
    """Host load and this process's CPU share between successive :meth:`read` calls, by psutil.

    ``process_pct`` is in percent of ONE core (so it can exceed 100 on a multi-core machine),
    the unit a "costs less than 10% of a core" budget is stated in.

    psutil keeps the host's previous reading per thread, so construct and read a meter on one
    thread (the sampler's) and keep one meter per thread: a second meter's reads on the same
    thread would shorten this one's interval.
    """

    def __init__(self) -> None:
        self._process: psutil.Process | None = None
        try:
            self._process = psutil.Process()
            # The first call of each only stores the starting point; its value means nothing.
            self._process.cpu_percent(interval=None)
            psutil.cpu_percent(interval=None)
        except (psutil.Error, OSError):
            self._process = None
        self._last_read_s = time.monotonic()
        self._last: tuple[float | None, float | None] = (None, None)  # the last measured reading

    def read(self) -> tuple[float | None, float | None]:
        """Returns ``(host_pct, process_pct)`` since the previous call (``None`` if unknown).
        A call sooner than :data:`CPU_MIN_INTERVAL_S` after the last measured one measures
        nothing: it repeats that measurement (both ``None`` before the first), and the next one
        covers the whole time since."""
        now_s = time.monotonic()
        if now_s - self._last_read_s < CPU_MIN_INTERVAL_S:
            return self._last
        self._last_read_s = now_s
        try:
            host_pct: float | None = float(psutil.cpu_percent(interval=None))
        except (psutil.Error, OSError):
            host_pct = None
        try:
            process_pct = None if self._process is None else float(self._process.cpu_percent(interval=None))
        except (psutil.Error, OSError):
            process_pct = None
        self._last = (host_pct, process_pct)
        return self._last


# ---------------------------------------------------------------------------------------------
# NVML


class NvmlReader:
    """Reads one GPU through NVML. Construct and use on one thread (the sampler's).

    If NVML cannot start (no driver, no library, no such GPU) the reader stays usable and every
    GPU field of its samples is ``None``; :attr:`available` says which case holds and
    :attr:`error` why.
    """

    def __init__(self, gpu_index: int = 0, pid: int | None = None) -> None:
        self.gpu_index = gpu_index
        self.pid = os.getpid() if pid is None else pid
        self.error: str | None = None
        self._nvml: Any = None
        self._handle: Any = None
        self._name: str | None = None
        self._slowdown_c: float | None = None
        self._total_bytes: int | None = None
        try:
            import pynvml  # lazily: the module must import on machines without the library

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(gpu_index)
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, InvalidArgument...
            self.error = f"{type(exc).__name__}: {exc}"
            self._shutdown_quietly()
            return
        name = self._call(pynvml.nvmlDeviceGetName, self._handle)
        self._name = name.decode() if isinstance(name, bytes) else name
        self._slowdown_c = self._call(
            pynvml.nvmlDeviceGetTemperatureThreshold,
            self._handle,
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
        )

    @property
    def available(self) -> bool:
        return self._handle is not None

    @property
    def gpu_name(self) -> str | None:
        return self._name

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """The choke point: an NVML value, or ``None`` for any error."""
        if self._handle is None:
            return None
        try:
            return fn(*args)
        except Exception:
            return None

    def _process_vram_bytes(self) -> int | None:
        nvml = self._nvml
        processes = self._call(nvml.nvmlDeviceGetComputeRunningProcesses, self._handle)
        if processes is None:
            return None
        ours = process_tree_pids(self.pid)
        used = 0
        for proc in processes:
            if getattr(proc, "pid", None) in ours:
                value = getattr(proc, "usedGpuMemory", None)
                # NVML reports "not available" (e.g. under WDDM or in some containers) as None.
                if value is None:
                    return None
                used += int(value)
        return used

    def read_gpu(self) -> dict[str, Any]:
        """The GPU fields of a :class:`TelemetrySample` (all ``None`` without NVML)."""
        if self._handle is None:
            return {}
        nvml, h = self._nvml, self._handle
        power_mw = self._call(nvml.nvmlDeviceGetPowerUsage, h)
        limit_mw = self._call(nvml.nvmlDeviceGetEnforcedPowerLimit, h)
        utilization = self._call(nvml.nvmlDeviceGetUtilizationRates, h)
        memory = self._call(nvml.nvmlDeviceGetMemoryInfo, h)
        temperature = self._call(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
        sm_clock = self._call(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM)
        mem_clock = self._call(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM)
        return {
            "gpu_index": self.gpu_index,
            "gpu_name": self._name,
            "temperature_c": _float(temperature),
            "slowdown_temp_c": _float(self._slowdown_c),
            "power_w": None if power_mw is None else power_mw / 1000.0,
            "power_limit_w": None if limit_mw is None else limit_mw / 1000.0,
            "sm_clock_mhz": _float(sm_clock),
            "mem_clock_mhz": _float(mem_clock),
            "utilization_pct": _float(getattr(utilization, "gpu", None)),
            "vram_used_bytes": _int(getattr(memory, "used", None)),
            "vram_total_bytes": _int(getattr(memory, "total", None)),
            "vram_process_bytes": self._process_vram_bytes(),
        }

    def close(self) -> None:
        self._handle = None
        self._shutdown_quietly()

    def _shutdown_quietly(self) -> None:
        nvml, self._nvml = self._nvml, None
        if nvml is not None:
            try:
                nvml.nvmlShutdown()
            except Exception:
                pass


def _float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def nvml_gpu_names() -> list[str]:
    """Names of every GPU NVML sees (empty without NVML); for `captioner devices`."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        names = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        return names
    except Exception:
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


# ---------------------------------------------------------------------------------------------
# Sampler thread


class TelemetrySampler:
    """Samples one GPU and the host at 2 Hz on its own thread.

    Readers on any thread get the newest value from :meth:`latest` (a latest-value mailbox: a
    slow reader skips samples, it never queues them) and recent ones from :meth:`history`
    (bounded). ``clock`` stamps ``time_s``; it is :func:`time.monotonic` like the pipeline's.
    """

    def __init__(
        self,
        gpu_index: int = 0,
        period_s: float = SAMPLE_PERIOD_S,
        history_samples: int = HISTORY_SAMPLES,
        clock: Callable[[], float] = time.monotonic,
        on_sample: Callable[[TelemetrySample], None] | None = None,
    ) -> None:
        self.gpu_index = gpu_index
        self.period_s = period_s
        self._clock = clock
        self._on_sample = on_sample
        self._lock = threading.Lock()
        self._latest: TelemetrySample | None = None
        self._history: collections.deque[TelemetrySample] = collections.deque(maxlen=history_samples)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self.gpu_available = False
        self.gpu_name: str | None = None
        self.nvml_error: str | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="captioner-telemetry", daemon=True)
        self._thread.start()
        # NVML's init can take a moment; wait so gpu_available is meaningful after start().
        self._ready.wait(timeout=5.0)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=timeout_s)

    def __enter__(self) -> TelemetrySampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def latest(self) -> TelemetrySample | None:
        """Any thread: the newest sample, or None before the first."""
        with self._lock:
            return self._latest

    def history(self) -> list[TelemetrySample]:
        """Any thread: the retained samples, oldest first."""
        with self._lock:
            return list(self._history)

    def _run(self) -> None:
        reader = NvmlReader(self.gpu_index)
        self.gpu_available = reader.available
        self.gpu_name = reader.gpu_name
        self.nvml_error = reader.error
        cpu = CpuMeter()
        self._ready.set()
        try:
            next_s = self._clock()
            while not self._stop.is_set():
                sample = sample_once(reader, cpu, self._clock())
                with self._lock:
                    self._latest = sample
                    self._history.append(sample)
                if self._on_sample is not None:
                    try:
                        self._on_sample(sample)
                    except Exception:
                        pass  # a broken listener must not stop the sampling
                next_s += self.period_s
                delay_s = next_s - self._clock()
                if delay_s < 0:  # fell behind (suspended machine): restart the schedule
                    next_s, delay_s = self._clock(), 0.0
                self._stop.wait(delay_s)
        finally:
            reader.close()


def sample_once(reader: NvmlReader, cpu: CpuMeter, time_s: float) -> TelemetrySample:
    """One reading of GPU and host; never raises."""
    try:
        gpu = reader.read_gpu()
    except Exception:
        gpu = {}
    host_pct, process_pct = cpu.read()
    return TelemetrySample(time_s=time_s, cpu_pct=host_pct, process_cpu_pct=process_pct, **gpu)
