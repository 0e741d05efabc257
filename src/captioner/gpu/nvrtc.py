"""CUDA source compiled once per process and device (NVRTC costs a quarter of a second and more
per module): the kernels that read the feature rings get their functions here. Nothing here
imports CuPy: the array module is passed in."""

from __future__ import annotations

_FUNCTIONS: dict[tuple[int, int, tuple[str, ...]], tuple] = {}


def functions(cp, source: str, names: tuple[str, ...]) -> tuple:
    """The kernels ``names`` of ``source``, compiled (C++17) on the current device the first time."""
    key = (int(cp.cuda.Device().id), hash(source), names)
    found = _FUNCTIONS.get(key)
    if found is None:
        module = cp.RawModule(code=source, options=("-std=c++17",))
        found = _FUNCTIONS[key] = tuple(module.get_function(name) for name in names)
    return found
