"""Lists the audio inputs a user can caption: PortAudio input devices, plus the sources of a
PulseAudio/PipeWire server (where the monitors of the outputs — a meeting's audio — live)."""

from __future__ import annotations

from dataclasses import dataclass

from captioner.audio import pulse
from captioner.audio.microphone import (
    import_sounddevice,
    is_loopback_name,
    portaudio_lock,
    refresh_portaudio,
)


@dataclass(frozen=True)
class InputDevice:
    """One input that ``MicrophoneSource(device=open_as)`` opens.

    ``index`` is the PortAudio index, ``None`` for a PulseAudio source (reached through
    PortAudio's ``pulse`` device, ``open_as`` is then ``"pulse:NAME"``).
    """

    index: int | None
    name: str
    host_api: str
    channels: int
    default_rate_hz: int
    is_monitor: bool
    is_default: bool = False

    @property
    def open_as(self) -> str:
        return str(self.index) if self.index is not None else f"{pulse.PULSE_PREFIX}{self.name}"


def list_input_devices(include_pulse: bool = True) -> list[InputDevice]:
    """Every input device PortAudio sees, then every PulseAudio/PipeWire source.

    Raises ``UserError`` only when PortAudio itself is missing. PortAudio is rescanned first
    (when no stream is open), so devices that appeared since start-up are listed.
    """
    sd = import_sounddevice()
    with portaudio_lock:
        refresh_portaudio()
        host_apis = [api["name"] for api in sd.query_hostapis()]
        default_index = sd.default.device[0]
        devices = [
            InputDevice(
                index=int(d["index"]),
                name=d["name"],
                host_api=host_apis[d["hostapi"]] if 0 <= d["hostapi"] < len(host_apis) else "?",
                channels=int(d["max_input_channels"]),
                default_rate_hz=int(round(d["default_samplerate"])),
                is_monitor=is_loopback_name(d["name"]),
                is_default=int(d["index"]) == default_index,
            )
            for d in sd.query_devices()
            if d["max_input_channels"] > 0
        ]
    if include_pulse:
        default_source = pulse.default_source()
        devices += [
            InputDevice(None, s.name, "PulseAudio", s.channels, s.rate_hz, s.is_monitor, s.name == default_source)
            for s in pulse.list_sources()
        ]
    return devices
