"""The transcript file: every committed caption line, on disk the moment it is committed.

Each line is appended, flushed and fsync'ed before :meth:`TranscriptWriter.write` returns, so a
crash or a kill loses nothing that was shown as committed. Lines are plain text,
``[HH:MM:SS.mmm --> HH:MM:SS.mmm] stream: text`` (times are the stream's audio clock), one per
committed update; the first line names the session. Files live in the user data dir
(``platformdirs``), one per session, named by the UTC start time.
"""

from __future__ import annotations

import os
import threading
import time
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


class TranscriptWriter:
    """Appends committed captions to one file. ``write`` may be called from any thread."""

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
        header = f"# captioner transcript {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}"
        self._append(header + (f" — {title}" if title else "") + "\n")

    def _append(self, text: str) -> None:
        data = text.encode("utf-8")
        with self._lock:
            if self._fd < 0:
                raise ValueError("transcript is closed")
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            os.fsync(self._fd)

    def write(self, update: CaptionUpdate) -> None:
        """Append one committed caption (partials are ignored) and make it durable."""
        if update.kind != "final" or not update.text.strip():
            return
        self._append(format_line(update))
        self.lines_written += 1

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> TranscriptWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
