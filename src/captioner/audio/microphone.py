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

A device that goes away is noticed by the owner, who asks :meth:`MicrophoneSource.health`
now and then (a watch thread, never the callback): PortAudio's finished callback, no callback
for :data:`STALL_S` (a killed or frozen PulseAudio, a plug-in that hangs without telling
PortAudio), or a PulseAudio source that left the server (PulseAudio then moves the stream to
another source, which would caption the wrong audio under this label).
:meth:`MicrophoneSource.reopen` makes a fresh source once the same device is back.

PortAudio and alsa-lib print their complaints (``Expression '...' failed in
'src/hostapi/alsa/pa_linux_alsa.c'``, ``ALSA lib pcm.c: ...``) with C stdio on ``stderr``,
from PortAudio's own threads too, when a device fails mid-stream. While PortAudio works (its
start-up and rescans, and as long as a stream is open) the C library's ``stderr`` points at
``/dev/null``: Python's own ``sys.stderr`` writes to file descriptor 2 directly and is not
affected, so the user sees our one-line messages and not theirs.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import itertools
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from captioner.audio import pulse
from captioner.audio.pulse import PULSE_PREFIX
from captioner.audio.resample import check_rate
from captioner.audio.source import RawChunk, Sink, SourceEnd, SourceStats
from captioner.errors import UserError, one_line

# PortAudio devices that lead to the PulseAudio/PipeWire server, best first.
_PULSE_GATEWAYS = ("pulse", "pipewire", "default")

STALL_S = 1.0
"""A running stream whose callback has not come for this long (50 blocks of 20 ms) has stopped."""
FIRST_BLOCK_GRACE_S = 5.0
"""How long a stream just opened may take to deliver its first block: through the ALSA
``pulse`` plug-in the first callback comes well after the open (docs/reliability.md, "Lost inputs")."""
PULSE_CHECK_PERIOD_S = 1.0
"""How often the PulseAudio server is asked whether the sources being captured still exist."""
PULSE_CHECK_TIMEOUT_S = 0.5
"""A local server answers in milliseconds; a frozen one never: the loss is reported, not held up."""

_env_lock = threading.Lock()  # PULSE_SOURCE is process-wide: one stream opens at a time
_open_streams = 0  # PortAudio may be re-initialised (to see new devices) only when this is 0
_scan_generation = 0  # bumped by every rescan: PortAudio device indices are valid within one scan
# Held while PortAudio's device list is read or rebuilt, so a rescan never runs under a query.
portaudio_lock = threading.RLock()


# -- PortAudio's own stderr lines ------------------------------------------------------------------
@functools.cache
def _c_stderr() -> ctypes.c_void_p | None:
    """The C library's global ``FILE *stderr``, or ``None`` where it cannot be reached.

    Looked up in the global namespace (``dlopen(NULL)``), not in libc's own handle: the Python
    executable may hold the copy of ``stderr`` that every library uses (a copy relocation)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.c_void_p.in_dll(ctypes.CDLL(None), "stderr")
    except (OSError, ValueError):
        return None


@functools.cache
def _c_devnull() -> int | None:
    """A C ``FILE *`` on /dev/null, opened once and never closed (a PortAudio thread may still
    be writing to it after we point ``stderr`` back)."""
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    return libc.fopen(os.devnull.encode(), b"w") or None


_quiet_lock = threading.Lock()
_quiet_depth = 0
_quiet_saved: int | None = None


def _quiet_begin() -> None:
    """C stdio's ``stderr`` goes to /dev/null until the matching :func:`_quiet_end`; nested
    calls (several open streams) count."""
    global _quiet_depth, _quiet_saved
    with _quiet_lock:
        _quiet_depth += 1
        if _quiet_depth > 1:
            return
        pointer = _c_stderr()
        devnull = _c_devnull() if pointer is not None else None
        if pointer is not None and devnull is not None:
            _quiet_saved = pointer.value
            pointer.value = devnull


def _quiet_end() -> None:
    global _quiet_depth, _quiet_saved
    with _quiet_lock:
        _quiet_depth -= 1
        if _quiet_depth > 0 or _quiet_saved is None:
            return
        pointer = _c_stderr()
        if pointer is not None:
            pointer.value = _quiet_saved
        _quiet_saved = None


@contextlib.contextmanager
def quiet_portaudio() -> Iterator[None]:
    """PortAudio's and alsa-lib's C-level stderr lines are dropped inside this block."""
    _quiet_begin()
    try:
        yield
    finally:
        _quiet_end()


def import_sounddevice():
    """``sounddevice``, or a ``UserError`` saying how to get PortAudio."""
    try:
        with quiet_portaudio():  # the first import initialises PortAudio, which probes ALSA
            import sounddevice  # noqa: PLC0415 - the one place sounddevice is imported, lazily
    except OSError as error:  # raised when the PortAudio shared library is missing
        raise UserError(
            f"PortAudio is not available ({one_line(error)}); "
            "on Debian/Ubuntu: sudo apt-get install libportaudio2"
        ) from None
    _guard_portaudio_exit()
    return sounddevice


@functools.cache
def _guard_portaudio_exit() -> None:
    """Registered after sounddevice's own exit handler, so it runs first (atexit is last in,
    first out): while a stream is still open at exit — a close stuck on a frozen sound server,
    on a thread of its own — sounddevice's handler would stop it and terminate PortAudio under
    that close (a minute's wait here, then "double free or corruption"). The process is
    ending: the system closes the device; PortAudio is left alone."""

    def leave_portaudio_alone() -> None:
        if _open_streams:
            sd = sys.modules.get("sounddevice")
            handler = getattr(sd, "_exit_handler", None)
            if handler is not None:
                atexit.unregister(handler)

    atexit.register(leave_portaudio_alone)


def refresh_portaudio() -> bool:
    """Re-initialises PortAudio so devices that appeared since (a PulseAudio server that
    started, a USB microphone plugged in) are listed; skipped while a stream is open."""
    global _scan_generation
    sd = import_sounddevice()
    with portaudio_lock:
        if _open_streams:
            return False
        # Private, but what sounddevice's maintainer points to for a rescan
        # (spatialaudio/python-sounddevice#125); it would kill open streams, hence the count.
        with quiet_portaudio():
            sd._terminate()  # noqa: SLF001
            sd._initialize()  # noqa: SLF001
        _scan_generation += 1
    return True


# Names that mark a device capturing what the machine plays rather than a microphone.
_LOOPBACK_MARKS = ("monitor", "loopback", "stereo mix", "what u hear", "wave out")


def is_loopback_name(name: str) -> bool:
    lowered = name.lower()
    return any(mark in lowered for mark in _LOOPBACK_MARKS)


@dataclass(frozen=True)
class DeviceChoice:
    """A resolved device: what to open and how."""

    index: int
    name: str
    rate_hz: int
    channels: int
    pulse_source: str | None = None
    scan: int = field(default=-1, compare=False)
    """The PortAudio scan ``index`` belongs to: after a rescan the index may name another device."""

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
    return DeviceChoice(int(device["index"]), device["name"], rate, wanted_channels, scan=_scan_generation)


def _pulse_choice(inputs: list[dict], source: pulse.PulseSource, channels, rate_hz) -> DeviceChoice | None:
    by_name = {d["name"]: d for d in inputs}
    gateway = next((by_name[g] for g in _PULSE_GATEWAYS if g in by_name), None)
    if gateway is None:
        return None
    rate = int(rate_hz or source.rate_hz)
    check_rate(rate, f"PulseAudio source {source.name!r}")
    wanted_channels = min(int(gateway["max_input_channels"]), channels or min(source.channels, 2))
    return DeviceChoice(int(gateway["index"]), gateway["name"], rate, max(1, wanted_channels), source.name,
                        scan=_scan_generation)


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


# -- a device that went away -----------------------------------------------------------------------
_STREAM_TAG = "captioner.input"
"""Property put on each of our PulseAudio capture streams (through ``PULSE_PROP`` at the open),
so the server can say which source each one is on."""
_stream_tags = itertools.count(1)


@dataclass(frozen=True)
class _PulseView:
    sources: frozenset[str]
    """The server's source names."""
    placed: dict[str, str]
    """Our streams' tags -> the source each is on now."""


def _ask_pulse_view(client) -> _PulseView:
    names = {info.index: info.name for info in client.source_list()}
    placed = {}
    for output in client.source_output_list():
        tag = output.proplist.get(_STREAM_TAG)
        if tag:
            placed[tag] = names.get(output.source, "")
    return _PulseView(frozenset(names.values()), placed)


class _PulseWatch:
    """The server's view of our capture, asked at most once per ``max_age_s`` for every stream
    together (each question is a connection of its own, bounded by :data:`PULSE_CHECK_TIMEOUT_S`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._view: _PulseView | None = None
        self._asked_s = float("-inf")

    def get(self, max_age_s: float) -> _PulseView | None:
        """The view, or ``None`` when the server gave no answer (gone, frozen, no libpulse)."""
        with self._lock:
            if time.monotonic() - self._asked_s >= max_age_s:
                # pulse's bounded exchange (a daemon thread, no pile-up on a server that hangs).
                view = pulse._ask_server(_ask_pulse_view, PULSE_CHECK_TIMEOUT_S)  # noqa: SLF001
                self._view = view if view is not None and view.sources else None
                self._asked_s = time.monotonic()
            return self._view


_pulse_watch = _PulseWatch()


def _pulse_loss_reason(source_name: str, tag: str, max_age_s: float) -> str | None:
    """Why our stream ``tag`` of PulseAudio source ``source_name`` cannot be delivering that
    source's audio, or ``None`` when it is (or the server cannot tell: no answer is no proof).

    The ALSA plug-in's streams follow the server's default: when their source leaves, or the
    default changes (a sink plugged back becomes the default again), PulseAudio moves them to
    another source, and the callbacks go on with someone else's audio."""
    view = _pulse_watch.get(max_age_s)
    if view is None:
        return None
    if source_name not in view.sources:
        return f"PulseAudio source {source_name!r} is gone"
    placed = view.placed.get(tag)
    if placed and placed != source_name:
        return f"PulseAudio moved it to {placed!r}"
    return None


def _input_named(sd, name: str) -> dict | None:
    return next((d for d in _input_devices(sd) if d["name"] == name), None)


def find_again(choice: DeviceChoice) -> DeviceChoice | None:
    """``choice`` as it can be opened now — its PulseAudio source listed by the server, its
    PortAudio device (found by name: indices change between scans) present — else ``None``.

    Rescans PortAudio when the device is missing and no stream is open (a rescan would kill open
    ones). Never raises for a device that is simply not back; the caller polls again later."""
    sd = import_sounddevice()
    if choice.pulse_source:
        # The server first: the ALSA plug-in's open waits without a timeout on a frozen server.
        sources = [s for s in pulse.list_sources(PULSE_CHECK_TIMEOUT_S) if s.name == choice.pulse_source]
        if not sources:
            return None
    with portaudio_lock:
        device = _input_named(sd, choice.name)
        if device is None and refresh_portaudio():
            device = _input_named(sd, choice.name)
        if device is None:
            return None
        try:
            if choice.pulse_source:
                # The source's own rate now (a sink loaded again may run at another rate).
                return _pulse_choice([device], sources[0], choice.channels, None)
            return _portaudio_choice(device, choice.channels, choice.rate_hz)
        except UserError:  # a rate the device no longer offers: not usable, as if not back
            return None


def _current(choice: DeviceChoice) -> DeviceChoice | None:
    """``choice`` with its PortAudio index of the current scan (call under ``portaudio_lock``)."""
    if choice.scan == _scan_generation:
        return choice
    device = _input_named(import_sounddevice(), choice.name)
    return replace(choice, index=int(device["index"]), scan=_scan_generation) if device is not None else None


class MicrophoneSource:
    """A live input device as an :class:`~captioner.audio.source.AudioSource`.

    The device is resolved when the source is made (a missing device is a ``UserError`` then);
    it is opened by :meth:`start`. ``block_ms`` is the PortAudio block length, so the length of
    each :class:`~captioner.audio.source.RawChunk`. The native clock restarts at 0 on every
    ``start``; the counters of :meth:`stats` add up over the source's life.

    A :class:`~captioner.audio.source.RecoverableSource`: :meth:`health` says when the device
    has stopped delivering, :meth:`reopen` gives a fresh source once it is back.
    """

    live = True

    @property
    def origin(self) -> str:
        """``meeting`` for a monitor of an output (what the machine plays: a call's other
        people), else ``microphone`` (one person, "Me"): whether ``speakers="auto"`` labels it."""
        return "meeting" if is_loopback_name(self.device.pulse_source or self.device.name) else "microphone"

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
        self.block_ms = block_ms
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
        self._last_callback_ns = 0  # when the callback last ran (0: not since start)
        self._started_ns = 0
        self._tag = ""  # this open's PulseAudio stream tag (see _STREAM_TAG)
        # Set by stop() before the stream is aborted: PortAudio then calls finished_callback,
        # which must not report our own stop as a lost device.
        self._stopping = False
        self._exhausted = False

    # -- PortAudio callback thread ------------------------------------------------------------
    def _callback(self, indata, frames, time_info, status) -> None:
        """Called by PortAudio for every block: a copy goes to the sink, nothing more."""
        now_ns = time.monotonic_ns()
        self._last_callback_ns = now_ns
        if status:
            self._overflows += 1
        position = self._position
        self._position = position + frames
        if self._stopping:
            return
        chunk = RawChunk(self.stream, self.rate_hz, position, now_ns, indata.copy())
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
            self._last_callback_ns = 0
            self._stopping = False
            self._exhausted = False
            with portaudio_lock:  # counted from before the open: no rescan may run under it
                current = _current(self.device)
                if current is None:
                    raise UserError(f"cannot open input device {self.device.label}: it is no longer listed")
                self.device = current
                _open_streams += 1
            _quiet_begin()  # held while the stream is open: PortAudio reports a failure from its thread
            try:
                self._started_ns = time.monotonic_ns()
                self._stream = self._open(sd)
            except BaseException:
                _quiet_end()
                with portaudio_lock:
                    _open_streams -= 1
                raise

    def _open(self, sd):
        try:
            with _env_lock:
                previous = os.environ.get("PULSE_SOURCE")
                previous_props = os.environ.get("PULSE_PROP")
                if self.device.pulse_source:
                    # libpulse reads PULSE_SOURCE and PULSE_PROP when the ALSA plug-in
                    # connects, inside the open; the tag lets health() find this stream.
                    os.environ["PULSE_SOURCE"] = self.device.pulse_source
                    self._tag = f"{os.getpid()}.{next(_stream_tags)}"
                    os.environ["PULSE_PROP"] = f"{previous_props or ''} {_STREAM_TAG}={self._tag}".strip()
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
                        for name, value in (("PULSE_SOURCE", previous), ("PULSE_PROP", previous_props)):
                            if value is None:
                                os.environ.pop(name, None)
                            else:
                                os.environ[name] = value
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
                # Drops what the driver still buffers. On a frozen PulseAudio server this waits
                # (60 s here) for the plug-in: an owner that must not wait calls it elsewhere.
                stream.abort()
                stream.close()
            except Exception:  # a device that vanished cannot be closed twice; nothing to do
                pass
            finally:
                _quiet_end()
                with portaudio_lock:
                    _open_streams -= 1

    def health(self) -> str | None:
        """Why the open stream has stopped delivering, as one line, or ``None`` while it
        delivers (and before :meth:`start`, after :meth:`stop`). Called by the owner's watch
        thread a few times a second; may ask the PulseAudio server (at most once a second, for
        every source together, bounded by :data:`PULSE_CHECK_TIMEOUT_S`)."""
        if self._stream is None or self._stopping:
            return None
        if self._exhausted:
            why = f"the consumer failed: {self._sink_error}" if self._sink_error else "input device stopped"
        else:
            last_ns = self._last_callback_ns or self._started_ns
            limit_s = STALL_S if self._last_callback_ns else FIRST_BLOCK_GRACE_S
            silent_s = (time.monotonic_ns() - last_ns) / 1e9
            why = f"no audio for {silent_s:.1f} s" if silent_s > limit_s else None
        pulse_source = self.device.pulse_source
        if pulse_source is None or self._sink_error:
            return why
        # Asked afresh once the stream has stopped, to name the cause (the source left, the
        # stream was moved, the server is gone).
        moved = _pulse_loss_reason(pulse_source, self._tag, max_age_s=0.0 if why else PULSE_CHECK_PERIOD_S)
        if moved is not None:
            return moved
        if why is not None and _pulse_watch.get(max_age_s=PULSE_CHECK_PERIOD_S) is None:
            return "no answer from the PulseAudio server"
        return why

    def reopen(self) -> MicrophoneSource | None:
        """A new, unstarted source for the same device with the same label, once the device is
        listed again (see :func:`find_again`); ``None`` while it is not. Never the callback."""
        choice = find_again(self.device)
        if choice is None:
            return None
        return MicrophoneSource(choice, stream=self.stream, block_ms=self.block_ms)

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
