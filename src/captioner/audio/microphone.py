"""Live capture from any input device through PortAudio (python-sounddevice).

The one module of the project that imports ``sounddevice``, and only inside functions, so
everything else imports on a machine without PortAudio. A device is opened at its native rate
and channel count; the PortAudio callback copies the block and hands it to the consumer's sink
as a :class:`~captioner.audio.source.RawChunk`, nothing more (no logging, no resampling, no
allocation beyond the copy): a chunk the sink refuses is dropped and counted, a driver overflow
is counted too. The consumer mixes down, resamples to 16 kHz and cuts 10 ms frames
(:class:`~captioner.audio.ingest.StreamIngest`).

Devices, by ``device``:

* ``None``: the default input device;
* an int (or digits): a PortAudio device index, as ``captioner devices`` lists them;
* ``"pulse:NAME"``: the PulseAudio/PipeWire source ``NAME`` (e.g. ``alsa_output.….monitor``,
  the audio playing on the machine), opened through PortAudio's ALSA ``pulse`` device with
  ``PULSE_SOURCE=NAME``, at the source's own rate;
* any other text: a case-insensitive part of a PortAudio device's name, else of a
  PulseAudio source's name; ``"monitor"`` alone is the monitor of the default output (what
  the machine is playing), whatever other monitors exist.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from captioner.audio import pulse
from captioner.audio.pulse import PULSE_PREFIX
from captioner.audio.resample import check_rate
from captioner.audio.source import RawChunk, Sink, SourceEnd, SourceStats
from captioner.errors import UserError, one_line

# PortAudio devices that lead to the PulseAudio/PipeWire server, best first.
_PULSE_GATEWAYS = ("pulse", "pipewire", "default")

_env_lock = threading.Lock()  # PULSE_SOURCE is process-wide: one stream opens at a time
_open_streams = 0  # PortAudio may be re-initialised (to see new devices) only when this is 0
# Held while PortAudio's device list is read or rebuilt, so a rescan never runs under a query.
portaudio_lock = threading.RLock()


def import_sounddevice():
    """``sounddevice``, or a ``UserError`` saying how to get PortAudio."""
    try:
        import sounddevice  # noqa: PLC0415 - the one place sounddevice is imported, lazily
    except OSError as error:  # raised when the PortAudio shared library is missing
        raise UserError(
            f"PortAudio is not available ({one_line(error)}); "
            "on Debian/Ubuntu: sudo apt-get install libportaudio2"
        ) from None
    return sounddevice


def refresh_portaudio() -> bool:
    """Re-initialises PortAudio so devices that appeared since (a PulseAudio server that
    started, a USB microphone plugged in) are listed; skipped while a stream is open."""
    sd = import_sounddevice()
    with portaudio_lock:
        if _open_streams:
            return False
        # Private, but what sounddevice's maintainer points to for a rescan
        # (spatialaudio/python-sounddevice#125); it would kill open streams, hence the count.
        sd._terminate()  # noqa: SLF001
        sd._initialize()  # noqa: SLF001
    return True


@dataclass(frozen=True)
class DeviceChoice:
    """A resolved device: what to open and how."""

    index: int
    name: str
    rate_hz: int
    channels: int
    pulse_source: str | None = None

    @property
    def label(self) -> str:
        return f"{PULSE_PREFIX}{self.pulse_source}" if self.pulse_source else f"{self.index}: {self.name}"


def _input_devices(sd) -> list[dict]:
    return [d for d in sd.query_devices() if d["max_input_channels"] > 0]


def _portaudio_choice(device: dict, channels: int | None, rate_hz: int | None) -> DeviceChoice:
    max_channels = int(device["max_input_channels"])
    wanted_channels = min(max_channels, channels or 2)
    rate = int(rate_hz or round(device["default_samplerate"]))
    check_rate(rate, f"input device {device['name']!r}")
    return DeviceChoice(int(device["index"]), device["name"], rate, wanted_channels)


def _pulse_choice(inputs: list[dict], source: pulse.PulseSource, channels, rate_hz) -> DeviceChoice | None:
    by_name = {d["name"]: d for d in inputs}
    gateway = next((by_name[g] for g in _PULSE_GATEWAYS if g in by_name), None)
    if gateway is None:
        return None
    rate = int(rate_hz or source.rate_hz)
    check_rate(rate, f"PulseAudio source {source.name!r}")
    wanted_channels = min(int(gateway["max_input_channels"]), channels or min(source.channels, 2))
    return DeviceChoice(int(gateway["index"]), gateway["name"], rate, max(1, wanted_channels), source.name)


def _resolve_once(sd, device, channels, rate_hz) -> DeviceChoice | None:
    inputs = _input_devices(sd)
    if device is None or isinstance(device, int) or (isinstance(device, str) and device.strip().isdigit()):
        # PortAudio's default input is None or -1 when there is none: no device has that index.
        index = sd.default.device[0] if device is None else int(device)
        matches = [d for d in inputs if d["index"] == index]
        return _portaudio_choice(matches[0], channels, rate_hz) if matches else None
    text = str(device).strip()
    if text.lower().startswith(PULSE_PREFIX):
        name = text[len(PULSE_PREFIX):].strip()
        if not name:
            raise UserError("'pulse:' needs a source name, e.g. pulse:alsa_output.pci-0000_00_1f.3.analog-stereo.monitor")
        known = [s for s in pulse.list_sources() if s.name == name]
        if not known:
            raise UserError(f"PulseAudio has no source named {name!r} (run 'captioner devices' to list them)")
        return _pulse_choice(inputs, known[0], channels, rate_hz)
    wanted = text.lower()
    exact = [d for d in inputs if d["name"].lower() == wanted]
    partial = exact or [d for d in inputs if wanted in d["name"].lower()]
    if len(partial) == 1:
        return _portaudio_choice(partial[0], channels, rate_hz)
    if len(partial) > 1:
        names = ", ".join(f"{d['index']}: {d['name']}" for d in partial)
        raise UserError(f"input device {text!r} is ambiguous: it matches {names}; give the index instead")
    sources = pulse.list_sources()
    exact_sources = [s for s in sources if s.name.lower() == wanted]
    found = exact_sources or [s for s in sources if wanted in s.name.lower()]
    if len(found) > 1 and wanted == "monitor":
        # "monitor" alone means what the machine plays: the default sink's monitor.
        playing = pulse.default_monitor()
        found = [s for s in found if s.name == playing] or found
    if len(found) > 1:
        names = ", ".join(s.name for s in found)
        raise UserError(f"input device {text!r} is ambiguous: it matches PulseAudio sources {names}")
    if found:
        return _pulse_choice(inputs, found[0], channels, rate_hz)
    return None


def resolve_device(device: str | int | None, channels: int | None = None, rate_hz: int | None = None) -> DeviceChoice:
    """The device ``device`` names (see the module docstring), or a one-line ``UserError``."""
    sd = import_sounddevice()
    with portaudio_lock:
        choice = _resolve_once(sd, device, channels, rate_hz)
        if choice is None and refresh_portaudio():
            choice = _resolve_once(sd, device, channels, rate_hz)
    if choice is None:
        what = "no default input device" if device is None else f"no input device matches {str(device)!r}"
        raise UserError(f"{what} (run 'captioner devices' to list them)")
    return choice


class MicrophoneSource:
    """A live input device as an :class:`~captioner.audio.source.AudioSource`.

    The device is resolved when the source is made (a missing device is a ``UserError`` then);
    it is opened by :meth:`start`. ``block_ms`` is the PortAudio block length, so the length of
    each :class:`~captioner.audio.source.RawChunk`. The native clock restarts at 0 on every
    ``start``; the counters of :meth:`stats` add up over the source's life.
    """

    live = True

    def __init__(
        self,
        device: str | int | DeviceChoice | None = None,
        stream: str = "Me",
        channels: int | None = None,
        rate_hz: int | None = None,
        block_ms: float = 20.0,
    ):
        self.stream = stream
        # A DeviceChoice is a device already resolved (by a caller that needed it first).
        self.device = device if isinstance(device, DeviceChoice) else resolve_device(device, channels=channels, rate_hz=rate_hz)
        self.rate_hz = self.device.rate_hz
        self.channels = self.device.channels
        self.block_frames = max(1, int(round(self.rate_hz * block_ms / 1000)))
        self._stream = None
        self._lock = threading.Lock()  # serialises start/stop
        self._sink: Sink | None = None
        self._callback_abort: type[Exception] = Exception  # sounddevice.CallbackAbort once started
        # Written only by the PortAudio callback thread, read by anyone: plain ints suffice.
        self._position = 0  # native index of the next block's first sample
        self._overflows = 0
        self._dropped_blocks = 0
        self._delivered_samples = 0
        self._sink_error = ""
        # Set by stop() before the stream is aborted: PortAudio then calls finished_callback,
        # which must not report our own stop as a lost device.
        self._stopping = False
        self._exhausted = False

    # -- PortAudio callback thread ------------------------------------------------------------
    def _callback(self, indata, frames, time_info, status) -> None:
        """Called by PortAudio for every block: a copy goes to the sink, nothing more."""
        if status:
            self._overflows += 1
        position = self._position
        self._position = position + frames
        if self._stopping:
            return
        chunk = RawChunk(self.stream, self.rate_hz, position, time.monotonic_ns(), indata.copy())
        try:
            taken = self._sink(chunk)
        except Exception as error:
            # A sink that raises is a bug of the consumer: end the stream and say so in the
            # SourceEnd, rather than let PortAudio abort with only a traceback on stderr.
            self._sink_error = one_line(error)
            raise self._callback_abort from None
        if taken:
            self._delivered_samples += frames
        else:
            self._dropped_blocks += 1

    def _finished(self) -> None:
        """Called by PortAudio once the stream has become inactive: after our own stop, or when
        the device went away (or the callback aborted)."""
        if self._stopping:
            return
        self._exhausted = True
        why = f"the consumer failed: {self._sink_error}" if self._sink_error else "input device stopped"
        self._sink(SourceEnd(self.stream, error=why))

    # -- owner thread -------------------------------------------------------------------------
    def start(self, sink: Sink) -> None:
        """Opens the device; blocks go to ``sink`` from PortAudio's callback thread, so the sink
        must never block (return False to refuse a chunk: it is dropped and counted)."""
        global _open_streams
        with self._lock:
            if self._stream is not None:
                raise RuntimeError(f"input {self.device.label} is already started")
            sd = import_sounddevice()
            self._sink = sink
            self._callback_abort = sd.CallbackAbort
            self._position = 0
            self._sink_error = ""
            self._stopping = False
            self._exhausted = False
            with portaudio_lock:  # counted from before the open: no rescan may run under it
                _open_streams += 1
            try:
                self._stream = self._open(sd)
            except BaseException:
                with portaudio_lock:
                    _open_streams -= 1
                raise

    def _open(self, sd):
        try:
            with _env_lock:
                previous = os.environ.get("PULSE_SOURCE")
                if self.device.pulse_source:
                    # libpulse reads PULSE_SOURCE when the ALSA plug-in connects, inside the open.
                    os.environ["PULSE_SOURCE"] = self.device.pulse_source
                try:
                    stream = sd.InputStream(
                        device=self.device.index,
                        samplerate=self.rate_hz,
                        channels=self.channels,
                        dtype="float32",
                        blocksize=self.block_frames,
                        callback=self._callback,
                        finished_callback=self._finished,
                    )
                    try:
                        stream.start()
                    except BaseException:
                        self._stopping = True  # closing a half-started stream is no lost device
                        stream.close()
                        raise
                finally:
                    if self.device.pulse_source:
                        if previous is None:
                            os.environ.pop("PULSE_SOURCE", None)
                        else:
                            os.environ["PULSE_SOURCE"] = previous
        except sd.PortAudioError as error:
            raise UserError(f"cannot open input device {self.device.label}: {one_line(error)}") from None
        return stream

    def stop(self) -> None:
        """Closes the device. PortAudio's abort returns only once the callback thread is done,
        so no sink call happens after this returns."""
        global _open_streams
        with self._lock:
            stream, self._stream = self._stream, None
            if stream is None:
                return
            self._stopping = True
            try:
                stream.abort()  # drops what the driver still buffers: no wait on a stalled device
                stream.close()
            except Exception:  # a device that vanished cannot be closed twice; nothing to do
                pass
            finally:
                with portaudio_lock:
                    _open_streams -= 1

    # -- any thread ---------------------------------------------------------------------------
    @property
    def exhausted(self) -> bool:
        """True once the device went away and its SourceEnd was delivered (never after our own
        :meth:`stop`, which delivers nothing)."""
        return self._exhausted

    def stats(self) -> SourceStats:
        return SourceStats(
            delivered_samples=self._delivered_samples,
            dropped_blocks=self._dropped_blocks,
            overflows=self._overflows,
        )
