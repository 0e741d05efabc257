"""The NVIDIA driver itself: whether it is there and how many CUDA devices it lists.

Both GPU libraries of the engine (CuPy for the features, ONNX Runtime's CUDA provider for the
model) ask this first, before anything of their own, so that a machine without a driver or
without a GPU is told exactly that, the same way by every caller (the CLI's ``--device``, the
public API's ``device=``): a missing library is only worth naming, with its install hint, once a
driver and a device are there for it to run on. Standard library only (``ctypes``), so it costs
nothing to ask.
"""

from __future__ import annotations

import ctypes
import functools
import sys

NO_DRIVER = "no NVIDIA driver: libcuda could not be loaded"
NO_DEVICE = "the NVIDIA driver lists no CUDA device"
_CUDA_ERROR_NO_DEVICE = 100  # what cuInit says with a driver installed and no GPU (or none visible)


@functools.lru_cache(maxsize=1)
def driver_devices() -> tuple[int, str]:
    """(CUDA devices the NVIDIA driver lists, why none when 0), asked of libcuda itself: neither
    CuPy (which may not be installed) nor ONNX Runtime (which has no call for it) is needed."""
    names = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so")
    for name in names:
        try:
            libcuda = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        return 0, NO_DRIVER
    status = libcuda.cuInit(0)
    if status == _CUDA_ERROR_NO_DEVICE:
        return 0, NO_DEVICE
    if status != 0:
        return 0, f"the NVIDIA driver failed to start (CUDA error {status})"
    count = ctypes.c_int(0)
    status = libcuda.cuDeviceGetCount(ctypes.byref(count))
    if status != 0 or count.value < 1:
        return 0, NO_DEVICE
    return count.value, ""
