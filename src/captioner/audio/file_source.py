"""Audio files (WAV, FLAC, OGG and whatever else libsndfile reads) as a source, and the checks
every command that reads a file shares.

:func:`open_audio_file` validates a file's header, :func:`read_audio_16k` reads, checks and
resamples a whole file, :class:`FileSource` replays one at its native rate, mixed to mono,
either paced in real time (against an injectable clock, so a test can simulate the replay
deterministically) or as fast as the consumer takes it. A file source never drops audio.

Only regular files are read: every reader checks a whole file before it starts, which a pipe
cannot give, and opening a FIFO that nobody writes to blocks for ever. A float file whose
samples go far past full scale (±1) is scaled to ±1 with a warning (:data:`FLOAT_PEAK_LIMIT`).
"""

from __future__ import annotations

import contextlib
import os
import stat
import struct
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from captioner.audio.replay import ReplaySource
from captioner.audio.resample import Resampler, check_rate, mixdown
from captioner.errors import UserError, one_line
from captioner.events import SAMPLE_RATE_HZ

_DECODE_FRAMES = 8192  # native frames decoded per step: small enough to start fast, big enough to be cheap

FLOAT_PEAK_LIMIT = 2.0
"""A float file whose samples reach past this is scaled to a peak of 1 (with a warning). Full
scale is ±1; a mix that was never limited overshoots it by a little, which the model hears as it
is, but 6 dB past it means the file was written at the wrong scale (int16 counts stored as
floats, a gain of 10^6): read as they are, such samples turned speech into "and and that and",
and a server connection's int16 conversion clips them to a square wave."""
_FLOAT_SUBTYPES = frozenset({"FLOAT", "DOUBLE"})  # the PCM kinds that hold any value, not a fixed range


@dataclass(frozen=True)
class AudioFileInfo:
    """What the header of a readable audio file says."""

    path: Path
    format: str
    subtype: str
    rate_hz: int
    channels: int
    frames: int
    gain: float = 1.0
    """What every sample is multiplied by as it is read: 1, or 1/peak for a float file whose
    samples go past :data:`FLOAT_PEAK_LIMIT` (set where the samples are checked)."""

    @property
    def duration_s(self) -> float:
        return self.frames / self.rate_hz


def _soundfile():
    import soundfile  # noqa: PLC0415 - libsndfile is loaded only when a file is read

    return soundfile


def _libsndfile_reason(error: Exception, path: Path) -> str:
    """libsndfile's message without the "Error opening '<path>':" prefix it repeats."""
    text = one_line(error)
    prefix = f"Error opening {str(path)!r}:"
    if text.startswith(prefix):
        text = text[len(prefix):].strip()
    if "does not exist" in text:
        # What libsndfile says when its MPEG decoder gave up on an existing regular file.
        text = "Format not recognised"
    return text.rstrip(".") or type(error).__name__


_stderr_lock = threading.Lock()


@contextlib.contextmanager
def _quiet_native_stderr():
    """Silences file descriptor 2 while libsndfile probes a file: its MPEG decoder (mpg123)
    prints "Note: Illegal Audio-MPEG-Header..." lines straight to the C stderr when it guesses
    at a file that is not audio, which would break the one-line error promise."""
    with _stderr_lock:
        try:
            saved_fd = os.dup(2)
        except OSError:
            yield
            return
        try:
            with open(os.devnull, "wb") as devnull:
                os.dup2(devnull.fileno(), 2)
            yield
        finally:
            os.dup2(saved_fd, 2)
            os.close(saved_fd)


def _wav_truncation(path: Path, file_size_bytes: int) -> tuple[int, int] | None:
    """For a RIFF/WAVE file: (bytes its data chunk declares, bytes actually present) when the
    file ends before the data does; ``None`` when complete or not a plain RIFF WAV.

    libsndfile silently reads what is there, so a cut-off recording would otherwise pass as a
    shorter one. Sizes of 0 and 0xFFFFFFFF are left alone: streaming writers leave those.
    """
    try:
        with path.open("rb") as f:
            head = f.read(12)
            if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
                return None
            offset = 12
            while offset + 8 <= file_size_bytes:
                f.seek(offset)
                chunk = f.read(8)
                if len(chunk) < 8:
                    return None
                chunk_id, chunk_size = chunk[:4], struct.unpack("<I", chunk[4:])[0]
                if chunk_id == b"data":
                    if chunk_size in (0, 0xFFFFFFFF):
                        return None
                    present = file_size_bytes - offset - 8
                    return (chunk_size, present) if present < chunk_size else None
                offset += 8 + chunk_size + (chunk_size & 1)
    except OSError:
        return None
    return None


_OGG_TAIL_BYTES = 1 << 16  # an Ogg page is at most 65,307 bytes: the last one starts in here
_OGG_END_OF_STREAM = 0x04


def _ogg_truncated(path: Path, file_size_bytes: int) -> bool:
    """For an Ogg file: True when it does not end with a whole end-of-stream page.

    libsndfile takes an Ogg file's length from the last page it finds, so a file cut anywhere
    passes as a complete shorter one; a complete stream's last page carries the end-of-stream
    flag and is whole."""
    try:
        with path.open("rb") as f:
            if f.read(4) != b"OggS":
                return False
            start = max(0, file_size_bytes - _OGG_TAIL_BYTES)
            f.seek(start)
            tail = f.read()
    except OSError:
        return False
    page = tail.rfind(b"OggS")
    while page >= 0 and (len(tail) - page < 27 or tail[page + 4] != 0):  # version 0 pages only
        page = tail.rfind(b"OggS", 0, page)
    if page < 0:
        return True
    flags, n_segments = tail[page + 5], tail[page + 26]
    lacing = tail[page + 27:page + 27 + n_segments]
    page_bytes = 27 + n_segments + sum(lacing)
    return len(lacing) < n_segments or page + page_bytes > len(tail) or not flags & _OGG_END_OF_STREAM


def open_audio_file(path: str | os.PathLike) -> AudioFileInfo:
    """Checks that ``path`` is a readable, non-empty, complete audio file at ≥ 8 kHz.

    Raises :class:`UserError` with one line saying what is wrong otherwise. Reads only the
    header (and, for WAV, the chunk sizes); the samples are checked as they are read.
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"audio file not found: {path}")
    if path.is_dir():
        raise UserError(f"{path} is a folder, not an audio file")
    try:
        status = path.stat()
        if not stat.S_ISREG(status.st_mode):
            # Checked before the file is opened: opening a FIFO blocks until someone writes.
            raise UserError(f"{path} is {_file_kind(status.st_mode)}, not a regular file: "
                            "save the audio to a file and give its path")
        size_bytes = status.st_size
        with path.open("rb"):
            pass
    except OSError as error:
        raise UserError(f"cannot read {path}: {one_line(error.strerror or error)}") from None
    if size_bytes == 0:
        raise UserError(f"{path} is empty (0 bytes)")
    sf = _soundfile()
    try:
        with _quiet_native_stderr():
            info = sf.info(str(path))
    except Exception as error:  # libsndfile reports every unreadable file the same way
        raise UserError(
            f"{path} is not an audio file that can be read ({_libsndfile_reason(error, path)}); "
            "use WAV, FLAC or OGG"
        ) from None
    if info.channels < 1:
        raise UserError(f"{path} has no audio channels")
    check_rate(info.samplerate, str(path))
    if info.format == "OGG" and _ogg_truncated(path, size_bytes):
        raise UserError(f"{path} is truncated: its Ogg stream stops without its last page "
                        f"(after {info.frames / info.samplerate:.3f} s of audio)")
    if info.frames <= 0:
        raise UserError(f"{path} holds no audio samples")
    truncated = _wav_truncation(path, size_bytes)
    if truncated is not None:
        declared, present = truncated
        raise UserError(
            f"{path} is truncated: its header promises {declared} bytes of audio but only "
            f"{max(present, 0)} are there"
        )
    return AudioFileInfo(path, info.format, info.subtype, int(info.samplerate), int(info.channels), int(info.frames))


def _file_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _check_finite(block: np.ndarray, info: AudioFileInfo, first_frame: int) -> None:
    if not np.isfinite(block).all():
        bad = int(np.flatnonzero(~np.isfinite(block).all(axis=-1) if block.ndim == 2 else ~np.isfinite(block))[0])
        at_s = (first_frame + bad) / info.rate_hz
        raise UserError(f"{info.path} contains NaN or infinite samples (first at {at_s:.3f} s)")


def _native_blocks(sound_file, info: AudioFileInfo) -> Iterator[np.ndarray]:
    """Decoded ``[n, channels]`` float32 blocks, checked; a file that ends early or fails to
    decode midway is a ``UserError``."""
    position = 0
    # mpg123 prints its complaints about damaged frames straight to the C stderr.
    quiet = _quiet_native_stderr if info.format == "MP3" else contextlib.nullcontext
    while position < info.frames:
        try:
            with quiet():
                block = sound_file.read(min(_DECODE_FRAMES, info.frames - position), dtype="float32",
                                        always_2d=True)
        except Exception as error:
            raise UserError(f"{info.path} is damaged: decoding failed at {position / info.rate_hz:.3f} s "
                            f"({one_line(error)})") from None
        if block.shape[0] == 0:
            raise UserError(
                f"{info.path} is truncated: it ends at {position / info.rate_hz:.3f} s but its header "
                f"says {info.duration_s:.3f} s"
            )
        _check_finite(block, info, position)
        position += block.shape[0]
        yield block if info.gain == 1.0 else block * np.float32(info.gain)


def _open_sound_file(info: AudioFileInfo):
    try:
        with _quiet_native_stderr() if info.format == "MP3" else contextlib.nullcontext():
            return _soundfile().SoundFile(str(info.path))
    except Exception as error:
        raise UserError(f"cannot open {info.path}: {_libsndfile_reason(error, info.path)}") from None


def _peak(info: AudioFileInfo) -> float:
    """The largest absolute sample of the file, decoded once (truncation and NaN/Inf are
    reported as they are met)."""
    peak = 0.0
    with _open_sound_file(info) as sound_file:
        for block in _native_blocks(sound_file, info):
            peak = max(peak, float(np.abs(block).max(initial=0.0)))
    return peak


def _scaled(info: AudioFileInfo, peak: float) -> AudioFileInfo:
    """``info``, with the gain that brings a float file's ``peak`` to 1 where it lies past
    :data:`FLOAT_PEAK_LIMIT`, said in a one-line warning. Scaled rather than refused: a file
    whose full scale is plainly wrong still holds the recording, and its level does not matter."""
    if info.subtype not in _FLOAT_SUBTYPES or peak <= FLOAT_PEAK_LIMIT:
        return info
    # Said from here, so a file read twice in a run (offline words, then speakers) says it once.
    warnings.warn(f"{info.path}: samples reach {peak:.3g}: the file is not normalised (full scale is ±1); "
                  "scaled to ±1", UserWarning, stacklevel=1)
    return replace(info, gain=1.0 / peak)


def check_audio_samples(path: str | os.PathLike) -> AudioFileInfo:
    """:func:`open_audio_file`, then decodes every sample once (truncation, NaN/Inf, and a float
    file's peak: the info returned carries the gain its samples are read with)."""
    info = open_audio_file(path)
    return _scaled(info, _peak(info))


def audio_16k_blocks(path: str | os.PathLike) -> tuple[AudioFileInfo, Iterator[np.ndarray]]:
    """The file's header, and its audio as a stream of 16 kHz mono float32 blocks (a few
    thousand samples each), decoded and resampled as they are taken: any length in bounded
    memory. The header is checked at once; NaN/Inf samples and a file that turns out shorter
    than its header says are a :class:`UserError` when the iteration reaches them (a float file
    is decoded once first, for its peak: there they are reported at once)."""
    info = open_audio_file(path)
    if info.subtype in _FLOAT_SUBTYPES:
        info = _scaled(info, _peak(info))

    def blocks() -> Iterator[np.ndarray]:
        resampler = Resampler(info.rate_hz)
        with _open_sound_file(info) as sound_file:
            for block in _native_blocks(sound_file, info):
                yield resampler.process(block)
        yield resampler.flush()

    return info, blocks()


def read_audio_16k(path: str | os.PathLike) -> np.ndarray:
    """The whole file, validated, mixed to mono and resampled to 16 kHz: ``[n]`` float32.

    Raises :class:`UserError` for anything :func:`open_audio_file` refuses, for NaN/Inf
    samples and for a file that turns out shorter than its header says.
    """
    info, blocks = audio_16k_blocks(path)
    # Filled in place: a list of pieces joined at the end would hold the audio twice (a 2-hour
    # file is 460 MB at 16 kHz), and the resampler gives out about rate_out/rate_in of its input.
    out = np.empty(info.frames * SAMPLE_RATE_HZ // info.rate_hz + SAMPLE_RATE_HZ, dtype=np.float32)
    filled = 0
    for samples in blocks:
        if filled + samples.shape[0] > out.shape[0]:  # never expected; stay correct anyway
            out = np.concatenate([out[:filled], np.empty(samples.shape[0] + SAMPLE_RATE_HZ, np.float32)])
        out[filled:filled + samples.shape[0]] = samples
        filled += samples.shape[0]
    return out[:filled]


class FileSource(ReplaySource):
    """Replays an audio file at its native rate, mixed down to mono (the consumer resamples).

    Pacing is :class:`~captioner.audio.replay.ReplaySource`'s: ``realtime=True`` releases each
    chunk when ``clock_ns()`` reaches its place in the file (measured from :meth:`start`);
    give a fake clock and a ``sleep`` that advances it to simulate a replay deterministically.
    ``realtime=False`` delivers as fast as the sink takes it. The file is checked when the
    source is made; ``check_samples=True`` also decodes it once, so NaN/Inf samples and a file
    shorter than its header are reported before anything starts (a replay that meets them
    anyway ends with a ``SourceEnd`` that carries the error).
    """

    origin = "file"
    """A recording: ``speakers="auto"`` labels its speakers (docs/speakers.md)."""

    def __init__(
        self,
        path: str | os.PathLike,
        stream: str | None = None,
        realtime: bool = False,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        sleep: Callable[[float], object] | None = None,
        check_samples: bool = True,
    ):
        self.info = check_audio_samples(path) if check_samples else open_audio_file(path)
        super().__init__(
            stream if stream is not None else self.info.path.stem,
            realtime=realtime,
            clock_ns=clock_ns,
            sleep=sleep,
        )
        self.rate_hz = self.info.rate_hz
        self._file = None
        self._blocks: Iterator[np.ndarray] | None = None

    @property
    def duration_s(self) -> float:
        return self.info.duration_s

    def _open(self) -> None:
        """Owner thread, from ``start``."""
        self._file = _open_sound_file(self.info)
        self._blocks = _native_blocks(self._file, self.info)

    def _produce(self) -> np.ndarray | None:
        """Replay thread: the next decoded block, mixed down; raises ``UserError`` when the
        file turns out damaged."""
        block = next(self._blocks, None) if self._blocks is not None else None
        return None if block is None else mixdown(block)

    def _close(self) -> None:
        """Replay thread, once it ends."""
        if self._file is not None:
            self._file.close()
        self._file = None
        self._blocks = None
