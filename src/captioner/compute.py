"""Names of compute devices ("cpu", "cuda", "cuda:N"), read the same way by every layer.

The array back-end (``gpu``) and the ONNX Runtime sessions (``models``) both take a device name;
this one parser, which imports nothing but the standard library, keeps them agreeing on what a
name means without either layer importing the other.
"""

from __future__ import annotations

import os
import re

from captioner.errors import UserError

DEVICE_ENV = "CAPTIONER_DEVICE"
"""Environment variable that picks the device when a command is given none."""

_DEVICE_RE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


def parse_device(device: str) -> tuple[str, int | None]:
    """``"cpu"`` -> ("cpu", None); ``"cuda"``/``"cuda:N"`` -> ("cuda", N)."""
    match = _DEVICE_RE.match(device.strip().lower())
    if not match:
        raise UserError(f"unknown device {device!r}: use 'cpu', 'cuda' or 'cuda:N'")
    kind, index = match.group(1), match.group(2)
    if kind == "cpu":
        if index is not None:
            raise UserError(f"unknown device {device!r}: use 'cpu', 'cuda' or 'cuda:N'")
        return "cpu", None
    return "cuda", int(index) if index is not None else 0


def requested_device(device: str | None) -> str:
    """The device asked for: ``device`` itself, else ``CAPTIONER_DEVICE``, else "auto"."""
    wanted = device if device not in (None, "") else os.environ.get(DEVICE_ENV, "")
    return wanted.strip() or "auto"
