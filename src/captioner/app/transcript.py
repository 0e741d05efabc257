"""The transcript file: every committed caption line, on disk the moment it is committed.

Each line is appended, flushed and fsync'ed before :meth:`TranscriptWriter.write` returns, so a
crash or a kill loses nothing that was shown as committed. The first line is written (and
fsync'ed) when the file is opened, so a disk that is already full is refused before any session
starts. A disk that fills later holds lines in memory (never a torn line) until it has room
again; :attr:`TranscriptWriter.problem` says so meanwhile, and :meth:`TranscriptWriter.loss`
what never reached the disk. Lines are plain text,
``[HH:MM:SS.mmm --> HH:MM:SS.mmm] stream: text`` (times are the stream's audio clock), one per
committed update, ``stream (Speaker 2): text`` where the stream's speakers are labelled; the first
line names the session. A speaker renamed in the app (:meth:`TranscriptWriter.rename_speaker`)
gets a ``#`` line saying so at once, and the lines already written are rewritten with the name
when the file is closed (a new file, fsync'ed, put in its place). Files live in the user data dir
(``platformdirs``), one per session, named by the UTC start time.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import time
from collections import deque
from pathlib import Path

from captioner.errors import UserError
from captioner.events import CaptionUpdate
from captioner.formats import format_timestamp


def default_transcript_dir() -> Path:
    override = os.environ.get("CAPTIONER_TRANSCRIPT_DIR")
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_data_dir("captioner", appauthor=False)) / "transcripts"


def _who(stream: str, speaker: str) -> str:
    return f"{stream} ({speaker})" if speaker else stream


def format_line(update: CaptionUpdate, speaker: str | None = None) -> str:
    """The line of a committed caption; ``speaker``: the name to write for its speaker (a
    rename), else its label."""
    text = " ".join(update.text.split())
    who = _who(update.stream, update.speaker if speaker is None else speaker)
    return f"[{format_timestamp(update.start_s)} --> {format_timestamp(update.end_s)}] {who}: {text}\n"


def _reason(error: OSError) -> str:
    """What to tell the user about a failed write, in a few words."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return "disk full"
    return os.strerror(error.errno) if error.errno else str(error)


def _pseudo_filesystem(folder: Path) -> str:
    """``/proc`` or ``/sys`` when ``folder`` (or the part of it that exists) is on that kernel
    file system, else "". Their files look regular, and some take writes as commands (as root,
    a transcript at /proc/self/comm would rename the process), so none may hold a transcript."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        device = existing.stat().st_dev
    except OSError:
        return ""
    for mount in ("/proc", "/sys"):
        try:
            if os.stat(mount).st_dev == device:
                return mount
        except OSError:
            continue
    return ""


def _check_transcript_path(path: Path) -> None:
    if path.is_dir():
        raise UserError(f"the transcript {path} is a folder; give a file name")
    if path.exists() and not stat.S_ISREG(path.stat().st_mode):
        raise UserError(f"the transcript {path} is not a regular file (a device or a pipe cannot hold one)")
    mount = _pseudo_filesystem(path.parent)
    if mount:
        raise UserError(f"cannot write the transcript {path}: {mount} is not a disk")


def _make_folder(folder: Path, named_by: str = "") -> None:
    mount = _pseudo_filesystem(folder)
    why = f" (set by {named_by})" if named_by else ""
    if mount:
        raise UserError(f"cannot make the transcript folder {folder}{why}: {mount} is not a disk")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserError(f"cannot make the transcript folder {folder}{why}: a file has that name") from None
    except OSError as error:
        raise UserError(f"cannot make the transcript folder {folder}{why}: {_reason(error)}") from None


class TranscriptWriter:
    """Appends committed captions to one file. ``write`` may be called from any thread.

    A line is written whole or not at all: when the disk fails (full, quota, I/O error) the
    bytes of the line being written are cut back to the previous newline, the line is held in
    memory with any later ones, :attr:`paused` says why, and every later ``write`` (or
    :meth:`retry`) tries the held lines first, in order — so the file resumes, complete, once
    space returns."""

    def __init__(self, path: Path | None = None, directory: Path | None = None, title: str = "") -> None:
        """Opens the file (appending to one that exists) and writes its first line. A path
        that cannot hold a transcript (a folder, a device, no permission, /proc, a folder that
        cannot be made, a disk too full for that first line) is a one-line
        :class:`~captioner.errors.UserError` here, before any session starts; a disk that fills
        later only pauses the writing (see :attr:`paused`)."""
        try:
            if path is None:
                from_env = directory is None and bool(os.environ.get("CAPTIONER_TRANSCRIPT_DIR"))
                directory = Path(directory) if directory is not None else default_transcript_dir()
                _make_folder(directory, "CAPTIONER_TRANSCRIPT_DIR" if from_env else "")
                stamp = time.strftime("%Y-%m-%dT%H-%M-%SZ", time.gmtime())
                path = directory / f"transcript-{stamp}.txt"
                n = 1
                while path.exists():
                    n += 1
                    path = directory / f"transcript-{stamp}-{n}.txt"
            self.path = Path(path)
            _check_transcript_path(self.path)
            _make_folder(self.path.parent)
            existed = self.path.exists()
            # O_APPEND: every write lands whole at the end even if another process appends too.
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as error:  # no permission, a full disk, a name too long: one line
            raise UserError(f"cannot write the transcript {path or directory}: {_reason(error)}") from None
        self._lock = threading.Lock()
        self.lines_written = 0
        self.paused: str | None = None
        """``None`` while lines reach the disk; else why they are held (e.g. "disk full")."""
        self._held: deque[str] = deque()
        """Committed lines not yet on disk, oldest first."""
        self._names: dict[tuple[str, str], str] = {}
        """(stream, speaker label) -> the name the person gave that speaker."""
        self._labelled: list[tuple[int, str, str, str]] = []
        """(line number, stream, label, name written) of each line with a speaker, for the
        rewrite at close."""
        self._lines_queued = 1  # the header, after the lines of a file appended to
        if existed:
            with contextlib.suppress(OSError), open(self.path, "rb") as f:
                self._lines_queued += sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
        header = f"# captioner transcript {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}"
        try:
            # Real bytes, fsync'ed: a full disk still lets the empty file be made, so only a
            # write tells, and it must tell now, not after a session of captions held in memory.
            self._append(header + (f" — {title}" if title else "") + "\n")
        except OSError as error:
            os.close(self._fd)
            self._fd = -1
            if not existed:
                with contextlib.suppress(OSError):
                    self.path.unlink()
            raise UserError(f"cannot write the transcript {self.path}: {_reason(error)}") from None

    @property
    def held_lines(self) -> int:
        """Committed lines waiting in memory for the disk."""
        return len(self._held)

    @property
    def problem(self) -> str | None:
        """While lines are held: one sentence for the person, the same every time it is asked
        (a window shows it when it changes), else ``None``."""
        why = self.paused
        if why is None:
            return None
        return f"captions are not being saved ({why}): they are kept in memory and written when there is room"

    def loss(self) -> str | None:
        """After :meth:`close`: one line saying which committed lines never reached the disk
        (they were shown, so the person must be told), else ``None``."""
        held = self.held_lines
        if not held:
            return None
        if not self.lines_written:
            what = ("the committed line shown was not saved" if held == 1
                    else f"none of the {held} committed lines shown was saved")
        else:
            lines = "1 committed line shown was" if held == 1 else f"{held} committed lines shown were"
            what = f"the last {lines} not saved (it keeps the {self.lines_written} before them)"
        return f"cannot write the transcript {self.path}: {self.paused or 'not written'}; {what}"

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
                try:
                    self._append(self._held[0])
                except OSError as error:
                    self.paused = _reason(error)
                    return
                self._held.popleft()
                self.lines_written += 1
            self.paused = None

    def write(self, update: CaptionUpdate) -> None:
        """Append one committed caption (partials are ignored) and make it durable; a line the
        disk refuses is held (see :attr:`paused`), never lost or torn."""
        if update.kind != "final" or not update.text.strip():
            return
        with self._lock:
            name = self._names.get((update.stream, update.speaker), update.speaker)
            if update.speaker:
                self._labelled.append((self._lines_queued, update.stream, update.speaker, name))
            self._held.append(format_line(update, name))
            self._lines_queued += 1
        self._write_held()

    def rename_speaker(self, stream: str, speaker: str, name: str) -> None:
        """From now on ``speaker`` ("Speaker 2") of ``stream`` is written as ``name``; a ``#``
        line records it at once, and :meth:`close` rewrites the lines already written."""
        name = " ".join(name.split())
        if not speaker or not name:
            return
        with self._lock:
            if self._names.get((stream, speaker), speaker) == name:
                return
            self._names[(stream, speaker)] = name
            self._held.append(f"# {_who(stream, speaker)} is {name}\n")
            self._lines_queued += 1
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
                if not self._held:
                    self._apply_names()

    def _apply_names(self) -> None:
        """The lines written before a speaker was renamed, rewritten with the name: a new file
        beside this one, fsync'ed, then put in its place. A line that is not as written (another
        process appended too) is left as it is; any failure leaves the file as it was."""
        stale = {n: (stream, label, written) for n, stream, label, written in self._labelled
                 if self._names.get((stream, label), label) != written}
        if not stale:
            return
        tmp = self.path.with_name(self.path.name + ".names")
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines(keepends=True)
            for n, (stream, label, written) in stale.items():
                old = f"] {_who(stream, written)}: "
                if n < len(lines) and old in lines[n]:
                    lines[n] = lines[n].replace(old, f"] {_who(stream, self._names[(stream, label)])}: ", 1)
            with open(tmp, "w", encoding="utf-8") as f:
                f.writelines(lines)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()

    def __enter__(self) -> TranscriptWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
