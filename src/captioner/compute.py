"""Names of compute devices ("cpu", "cuda", "cuda:N") and the one rule that turns a request into
a device, read the same way by every layer.

The array back-end (``gpu``) and the ONNX Runtime sessions (``models``) both take a device name
and each probes its own library for usable GPUs. This module, which imports nothing but the
standard library, holds what they must agree on without either layer importing the other: what
a name means (:func:`parse_device`), where a request comes from (:func:`requested_device`), and
what is chosen or refused for it (:func:`resolve_device`).
"""

from __future__ import annotations

import os
import re

from captioner.errors import UserError

DEVICE_ENV = "CAPTIONER_DEVICE"
"""Environment variable that picks the device when a command is given none."""

_DEVICE_RE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


def _unknown(device: str) -> UserError:
    return UserError(f"unknown device {device!r}: use 'cpu', 'cuda' or 'cuda:N'")


def parse_device(device: str) -> tuple[str, int | None]:
    """``"cpu"`` -> ("cpu", None); ``"cuda"``/``"cuda:N"`` -> ("cuda", N)."""
    match = _DEVICE_RE.match(device.strip().lower())
    if not match:
        raise _unknown(device)
    kind, index = match.group(1), match.group(2)
    if kind == "cpu":
        if index is not None:
            raise _unknown(device)
        return "cpu", None
    return "cuda", int(index) if index is not None else 0


def requested_device(device: str | None) -> str:
    """The device asked for: ``device`` itself, else (for ``None`` or "auto", the default of
    every command) ``CAPTIONER_DEVICE``, else "auto"."""
    wanted = device if device not in (None, "", "auto") else os.environ.get(DEVICE_ENV, "")
    wanted = wanted.strip()
    return "auto" if wanted.lower() in ("", "auto") else wanted


def resolve_device(device: str | None, usable_cuda_devices: int, why_none: str = "") -> str:
    """The device that runs a request: "cpu" or "cuda:N".

    ``device``: a name, "auto" or ``None`` (then ``CAPTIONER_DEVICE``, then "auto").
    ``usable_cuda_devices``: how many GPUs the caller's library can really run on (0 when none;
    ``why_none`` then says why). "auto" takes ``cuda:0`` when there is one, else the CPU, without
    a word. A GPU that was asked for by name and cannot be used is a :class:`UserError`, never a
    quiet fall-back to the CPU: the person asked for it and should know.
    """
    wanted = requested_device(device)
    if wanted == "auto":
        return "cuda:0" if usable_cuda_devices > 0 else "cpu"
    kind, index = parse_device(wanted)
    if kind == "cpu":
        return "cpu"
    name = f"cuda:{index}"
    if usable_cuda_devices <= 0:
        reason = f" ({why_none})" if why_none else ""
        raise UserError(f"{name} was asked for but no CUDA device is usable here{reason}; use --device cpu")
    if index >= usable_cuda_devices:
        last = f"cuda:0..cuda:{usable_cuda_devices - 1}" if usable_cuda_devices > 1 else "cuda:0"
        raise UserError(f"{name} does not exist: this machine has {usable_cuda_devices} usable CUDA "
                        f"device{'s' if usable_cuda_devices > 1 else ''} ({last})")
    return name
