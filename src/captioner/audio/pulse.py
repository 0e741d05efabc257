"""What a PulseAudio (or PipeWire, through pipewire-pulse) server offers, asked through `pactl`.

PortAudio sees a PulseAudio server only as one ALSA device named ``pulse`` (and ``default``),
behind which every source hides, monitors of the output sinks included (the audio a meeting
plays). Listing those sources needs the server itself, so this asks `pactl`, with a timeout;
no server or no `pactl` simply means an empty list.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

PACTL_TIMEOUT_S = 3.0
PULSE_PREFIX = "pulse:"
"""``--device pulse:NAME`` opens the server's source ``NAME``."""

_SPEC_RE = re.compile(r"(\d+)ch\s+(\d+)Hz")


@dataclass(frozen=True)
class PulseSource:
    """One source of the server; ``name`` is what ``PULSE_SOURCE`` / ``pulse:NAME`` take."""

    name: str
    channels: int
    rate_hz: int
    is_monitor: bool


def _pactl(*args: str, timeout_s: float = PACTL_TIMEOUT_S) -> str | None:
    exe = shutil.which("pactl")
    if exe is None:
        return None
    try:
        done = subprocess.run(
            [exe, *args], capture_output=True, text=True, timeout=timeout_s, check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def list_sources(timeout_s: float = PACTL_TIMEOUT_S) -> list[PulseSource]:
    """The server's sources (empty when there is no server or no `pactl`)."""
    text = _pactl("list", "short", "sources", timeout_s=timeout_s)
    if not text:
        return []
    sources = []
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) < 4:
            continue
        name, spec = fields[1], fields[3]
        match = _SPEC_RE.search(spec)
        channels, rate_hz = (int(match.group(1)), int(match.group(2))) if match else (2, 48_000)
        sources.append(PulseSource(name, channels, rate_hz, name.endswith(".monitor")))
    return sources


def _info_field(field_name: str, timeout_s: float) -> str | None:
    text = _pactl("info", timeout_s=timeout_s)
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith(f"{field_name}:"):
            return line.split(":", 1)[1].strip() or None
    return None


def default_source(timeout_s: float = PACTL_TIMEOUT_S) -> str | None:
    """Name of the server's default source, or ``None``."""
    return _info_field("Default Source", timeout_s)


def default_sink(timeout_s: float = PACTL_TIMEOUT_S) -> str | None:
    """Name of the server's default sink (where applications play), or ``None``."""
    return _info_field("Default Sink", timeout_s)


def default_monitor(timeout_s: float = PACTL_TIMEOUT_S) -> str | None:
    """The monitor source of the default sink: what the machine is playing right now."""
    sink = default_sink(timeout_s)
    return f"{sink}.monitor" if sink else None
