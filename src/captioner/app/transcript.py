"""The transcript file: every committed caption line, on disk the moment it is committed.

Each line is appended, flushed and fsync'ed before :meth:`TranscriptWriter.write` returns, so a
crash or a kill loses nothing that was shown as committed; a full disk holds lines in memory
(never a torn line) until it has room again. Lines are plain text,
``[HH:MM:SS.mmm --> HH:MM:SS.mmm] stream: text`` (times are the stream's audio clock), one per
committed update; the first line names the session. Files live in the user data dir
(``platformdirs``), one per session, named by the UTC start time.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections import deque
from pathlib import Path

from captioner.events import CaptionUpdate
from captioner.formats import format_timestamp


def default_transcript_dir() -> Path:
    override = os.environ.get("CAPTIONER_TRANSCRIPT_DIR")
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_data_dir("captioner", appauthor=False)) / "transcripts"


def format_line(update: CaptionUpdate) -> str:
    text = " ".join(update.text.split())
    return f"[{format_timestamp(update.start_s)} --> {format_timestamp(update.end_s)}] {update.stream}: {text}\n"


def _reason(error: OSError) -> str:
    """What to tell the user about a failed write, in a few words."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return "disk full"
    return os.strerror(error.errno) if error.errno else str(error)


class TranscriptWriter:
    """Appends committed captions to one file. ``write`` may be called from any thread.

    A line is written whole or not at all: when the disk fails (full, quota, I/O error) the
    bytes of the line being written are cut back to the previous newline, the line is held in
    memory with any later ones, :attr:`paused` says why, and every later ``write`` (or
    :meth:`retry`) tries the held lines first, in order — so the file resumes, complete, once
    space returns."""

    def __init__(self, path: Path | None = None, directory: Path | None = None, title: str = "") -> None:
        if path is None:
            directory = Path(directory) if directory is not None else default_transcript_dir()
            stamp = time.strftime("%Y-%m-%dT%H-%M-%SZ", time.gmtime())
            path = directory / f"transcript-{stamp}.txt"
            n = 1
            while path.exists():
                n += 1
                path = directory / f"transcript-{stamp}-{n}.txt"
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # O_APPEND: every write lands whole at the end even if another process appends too.
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.lines_written = 0
        self.paused: str | None = None
        """``None`` while lines reach the disk; else why they are held (e.g. "disk full")."""
        self._held: deque[tuple[str, bool]] = deque()
        """Lines not yet on disk, each with whether it is a caption (the header is not)."""
        header = f"# captioner transcript {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}"
        self._held.append((header + (f" — {title}" if title else "") + "\n", False))
        self._write_held()

    @property
    def held_lines(self) -> int:
        """Committed lines waiting in memory for the disk."""
        return sum(is_caption for _, is_caption in self._held)

    def _append(self, text: str) -> None:
        """One line, whole, with one ``write`` where the kernel takes it all; on failure the
        file is cut back to where it was (no torn line) and the error raised."""
        data = text.encode("utf-8")
        start = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            os.fsync(self._fd)
        except OSError:
            try:
                os.ftruncate(self._fd, start)
            except OSError:
                pass  # the file keeps a torn tail; the next successful write still starts a new line
            raise

    def _write_held(self) -> None:
        with self._lock:
            if self._fd < 0:
                raise ValueError("transcript is closed")
            while self._held:
                text, is_caption = self._held[0]
                try:
                    self._append(text)
                except OSError as error:
                    self.paused = _reason(error)
                    return
                self._held.popleft()
                self.lines_written += is_caption
            self.paused = None

    def write(self, update: CaptionUpdate) -> None:
        """Append one committed caption (partials are ignored) and make it durable; a line the
        disk refuses is held (see :attr:`paused`), never lost or torn."""
        if update.kind != "final" or not update.text.strip():
            return
        with self._lock:
            self._held.append((format_line(update), True))
        self._write_held()

    def retry(self) -> None:
        """Try the held lines again (a timer calls it while :attr:`paused`)."""
        if self._held:
            self._write_held()

    def close(self) -> None:
        if self._held and self._fd >= 0:
            self._write_held()  # a last chance for lines held by a full disk
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> TranscriptWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
