"""A folder on a disk that a test fills and empties: a real 64 KiB tmpfs where this process may
mount one (root with CAP_SYS_ADMIN), else the same behaviour made with a patched ``os.write``.

On the real disk :meth:`SmallDisk.fill` writes a filler file until the kernel says ENOSPC, and
:meth:`SmallDisk.free` deletes it, so every write the code under test makes meets a really full
disk: a file is still created (tmpfs counts inodes apart), its first bytes are refused, and a
file with room left in its last page takes lines until that page is used. Without a mount, a
write to any file under the folder takes 5 bytes (a torn start) and then fails with ENOSPC while
full, as ``tests/test_cli_faults.py`` does it.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

SIZE = "64k"


def _can_mount() -> bool:
    return os.name == "posix" and os.geteuid() == 0 and shutil.which("mount") is not None


class SmallDisk:
    def __init__(self, folder: Path, monkeypatch) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.real = _can_mount() and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={SIZE},mode=0755", "tmpfs", str(self.folder)],
            capture_output=True).returncode == 0
        self.full = False
        self._torn = False
        if not self.real:
            self._real_write = os.write
            monkeypatch.setattr(os, "write", self._write)

    def fill(self) -> None:
        """No byte more fits (the files there keep what they hold)."""
        self.full = True
        if not self.real:
            return
        block = b"\0" * 4096
        fd = os.open(self.folder / ".filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            while True:
                os.write(fd, block)
        except OSError as error:
            assert error.errno == errno.ENOSPC, error
        finally:
            os.close(fd)

    def free(self) -> None:
        """Room again."""
        self.full = False
        self._torn = False
        if self.real:
            (self.folder / ".filler").unlink(missing_ok=True)

    def close(self) -> None:
        if self.real:
            subprocess.run(["umount", "-l", str(self.folder)], capture_output=True)
            self.real = False

    def _write(self, fd, data):
        if not self.full or not self._in_folder(fd):
            return self._real_write(fd, data)
        if len(data) > 5 and not self._torn:
            self._torn = True
            return self._real_write(fd, bytes(data[:5]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def _in_folder(self, fd: int) -> bool:
        try:
            name = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return False
        return name.startswith(os.path.realpath(self.folder) + os.sep)
