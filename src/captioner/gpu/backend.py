"""The array back-end: CuPy on a working CUDA device, NumPy otherwise.

This is the one module of the project that imports CuPy, and it does so lazily (inside
functions), so importing it costs nothing on a machine without CUDA. Feature code is written
once against ``backend.xp`` (the ``numpy`` or ``cupy`` module) and runs on either.

Choice of device, first match wins:

1. the ``device`` argument of :func:`get_backend` (``"cpu"``, ``"cuda"``, ``"cuda:N"``;
   ``None`` or ``"auto"`` defer to the next rule) — e.g. a ``--device`` flag;
2. the environment variable ``CAPTIONER_DEVICE`` (same values);
3. ``cuda:0`` when :func:`cuda_usable`, else ``cpu``.

Asking for CUDA explicitly when it is not usable is a :class:`~captioner.errors.UserError`,
never a silent fall-back to the CPU. The rule itself is :func:`captioner.compute.resolve_device`,
shared with the ONNX Runtime sessions (``models.session``), so features and model never disagree
on what a request means; this module only says how many GPUs CuPy can run on.
"""

from __future__ import annotations

import contextlib
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from captioner import cuda_driver
from captioner.compute import (
    DEVICE_ENV,  # noqa: F401 - re-exported: callers read backend.DEVICE_ENV
    parse_device,
    requested_device,
    resolve_device,
)
from captioner.errors import one_line


@dataclass(frozen=True)
class GpuInfo:
    """One CUDA device as the runtime reports it."""

    index: int
    name: str
    total_vram_bytes: int
    driver_version: str
    compute_capability: str


@dataclass(frozen=True)
class Backend:
    """Where arrays live. ``xp`` is the ``numpy`` or ``cupy`` module."""

    xp: ModuleType
    name: str  # "cpu" or "cuda:N"
    device_name: str
    device_index: int | None = None
    _cupy: Any = field(default=None, repr=False, compare=False)

    @property
    def is_cuda(self) -> bool:
        return self._cupy is not None

    def asnumpy(self, array) -> np.ndarray:
        """A host copy (NumPy arrays pass through without a copy)."""
        if self._cupy is not None and isinstance(array, self._cupy.ndarray):
            return self._cupy.asnumpy(array)
        return np.asarray(array)

    def asarray(self, array, dtype=None):
        """The array on this back-end's device (no copy when it is already there)."""
        with self.activate():
            return self.xp.asarray(array, dtype=dtype)

    def activate(self):
        """Context manager making this back-end's GPU current for the calling thread.

        CuPy allocates on the thread's current device, so the one thread that works a GPU
        enters this (or calls :meth:`use`) before allocating. A no-op on the CPU.
        """
        if self._cupy is None:
            return contextlib.nullcontext()
        return self._cupy.cuda.Device(self.device_index)

    def use(self) -> None:
        """Make this back-end's GPU current for the calling thread from now on."""
        if self._cupy is not None:
            self._cupy.cuda.Device(self.device_index).use()

    def empty_pinned(self, shape, dtype) -> np.ndarray:
        """A NumPy array in page-locked host memory (CUDA copies from it can run asynchronously
        and be captured in CUDA graphs); a plain array on the CPU."""
        if self._cupy is None:
            return np.empty(shape, dtype=dtype)
        import cupyx  # noqa: PLC0415 - CuPy's companion package, lazily like CuPy itself

        return cupyx.empty_pinned(shape, dtype=dtype)

    def vram_free_fraction(self) -> float | None:
        """Free over total memory of this back-end's GPU (CuPy's pooled blocks count as used);
        ``None`` on the CPU. Called by the thread that works this GPU."""
        if self._cupy is None:
            return None
        with self.activate():
            free_bytes, total_bytes = self._cupy.cuda.runtime.memGetInfo()
        return free_bytes / total_bytes if total_bytes else None

    def vram_bytes(self) -> tuple[int, int] | None:
        """``(free_bytes, total_bytes)`` of this back-end's GPU, as :meth:`vram_free_fraction`
        measures them; ``None`` on the CPU. Called by the thread that works this GPU."""
        if self._cupy is None:
            return None
        with self.activate():
            free_bytes, total_bytes = self._cupy.cuda.runtime.memGetInfo()
        return int(free_bytes), int(total_bytes)

    def inject_fault(self) -> None:
        """A real device fault, for the fault-injection hook only (``CAPTIONER_FAULT_INJECT``,
        read by the test suite and ``benchmarks/bench_hot_restart.py``). On CUDA a kernel
        writes through an invalid address: an illegal memory access, the sticky error that
        poisons this process's CUDA context for good; the synchronisation raises it here. On
        the CPU nothing can poison anything: a ``RuntimeError`` stands for the failed step."""
        if self._cupy is None:
            raise RuntimeError("injected fault in the model step (CAPTIONER_FAULT_INJECT)")
        kernel = self._cupy.RawKernel(
            r"""
            extern "C" __global__ void captioner_fault(unsigned long long address) {
                *((volatile float*) address) = 1.0f;  // nothing is mapped there
            }
            """,
            "captioner_fault",
        )
        with self.activate():
            kernel((1,), (1,), (np.uint64(0x10),))
            self._cupy.cuda.Device(self.device_index).synchronize()
        raise RuntimeError("the injected CUDA fault did not fault")  # a driver that let it pass

    def synchronize(self) -> None:
        """Wait for all work queued on the device (no-op on the CPU); used around timings."""
        if self._cupy is not None:
            with self.activate():
                self._cupy.cuda.Device(self.device_index).synchronize()


def _import_cupy():
    import cupy  # noqa: PLC0415 - the one place CuPy is imported, lazily on purpose

    return cupy


@functools.lru_cache(maxsize=1)
def _cuda_probe() -> tuple[int, str]:
    """(devices on which CuPy can actually run a kernel, why none when 0). Never raises. The
    driver is asked first (:mod:`captioner.cuda_driver`): without it, or without a GPU,
    installing CuPy would not help, and the reason must not send anyone to install it."""
    count, why_none = cuda_driver.driver_devices()
    if count == 0:
        return 0, why_none
    try:
        cupy = _import_cupy()
    except ImportError:
        return 0, "CuPy is not installed: install the [cuda] extra"
    except Exception as error:  # a CuPy build that fails while loading its libraries
        return 0, f"CuPy failed to load: {one_line(error)}"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
        if count < 1:
            return 0, "the CUDA driver lists no device"
        with cupy.cuda.Device(0):
            # A device can be listed yet unusable (driver/toolkit mismatch, no kernel image):
            # only a real launch and a copy back prove it works.
            probe = cupy.arange(8, dtype=cupy.float32)
            if float((probe * 2).sum().get()) != 56.0:
                return 0, "a test kernel on cuda:0 gave a wrong result"
        return count, ""
    except Exception as error:  # a driver or launch failure means "no usable CUDA"
        return 0, f"CUDA failed: {one_line(error)}"


def _cuda_device_count() -> int:
    """Devices on which CuPy can actually run a kernel (0 when CuPy or the driver is missing)."""
    return _cuda_probe()[0]


def cuda_usable() -> bool:
    """True when CuPy is importable and a CUDA device runs a kernel. Never raises."""
    return _cuda_device_count() > 0


def _device_name(props: dict) -> str:
    """The name in CUDA device properties (CuPy gives bytes or str depending on its version)."""
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def cpu_backend() -> Backend:
    return Backend(xp=np, name="cpu", device_name="CPU (NumPy)")


def _cuda_backend(index: int) -> Backend:
    cupy = _import_cupy()
    name = _device_name(cupy.cuda.runtime.getDeviceProperties(index))
    return Backend(xp=cupy, name=f"cuda:{index}", device_name=name, device_index=index, _cupy=cupy)


def get_backend(device: str | None = None) -> Backend:
    """The back-end for ``device``, else ``$CAPTIONER_DEVICE``, else the best available; a GPU
    asked for by name that CuPy cannot use is a ``UserError`` (:func:`~captioner.compute.resolve_device`)."""
    wanted = requested_device(device)
    if wanted != "auto" and parse_device(wanted)[0] == "cpu":
        return cpu_backend()  # asked for the CPU: no need to load CuPy to say so
    count, why_none = _cuda_probe()
    name = resolve_device(wanted, count, why_none)
    if name == "cpu":
        return cpu_backend()
    return _cuda_backend(int(name.split(":")[1]))


def _kernel_driver_version() -> str | None:
    """The NVIDIA kernel driver's version from /proc (Linux); reading a file needs no NVML."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text(errors="replace")
    except OSError:
        return None
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text)
    return match.group(1) if match else None


def describe_gpus() -> list[GpuInfo]:
    """Every CUDA device CuPy sees: name, total VRAM, driver. Any failure -> an empty list."""
    try:
        if _cuda_device_count() == 0:
            return []
        cupy = _import_cupy()
        runtime = cupy.cuda.runtime
        cuda_api = int(runtime.driverGetVersion())
        driver = _kernel_driver_version()
        api_text = f"CUDA {cuda_api // 1000}.{(cuda_api % 1000) // 10}"
        driver_text = f"{driver} ({api_text})" if driver else api_text
        gpus = []
        for index in range(int(runtime.getDeviceCount())):
            props = runtime.getDeviceProperties(index)
            gpus.append(
                GpuInfo(
                    index=index,
                    name=_device_name(props),
                    total_vram_bytes=int(props["totalGlobalMem"]),
                    driver_version=driver_text,
                    compute_capability=f"{props['major']}.{props['minor']}",
                )
            )
        return gpus
    except Exception:  # an unusable driver or CuPy build is "no GPU", not a crash
        return []
