"""Puts Captioner's desktop entry and icons where desktops look for a user's own applications
(XDG Base Directory: ``$XDG_DATA_HOME``, by default ~/.local/share), and takes them out again.

Exactly these files, no more: ``applications/captioner.desktop`` and ``captioner.svg`` /
``captioner.png`` in the hicolor theme's ``scalable`` and ``NxN`` folders. Each is written to a
temporary name and renamed, so a menu watching the folder never reads half a file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from captioner.app.desktop_entry import DESKTOP_FILE_NAME, entry_text
from captioner.data.icons import ICON_NAME, PNG_SIZES, png_path, svg_path
from captioner.errors import UserError, one_line


def data_home() -> Path:
    """``$XDG_DATA_HOME``; unset, empty or relative (which the spec says to ignore): ~/.local/share."""
    value = os.environ.get("XDG_DATA_HOME", "")
    if value and os.path.isabs(value):
        return Path(value)
    return Path.home() / ".local" / "share"


def entry_path(home: Path) -> Path:
    return home / "applications" / f"{DESKTOP_FILE_NAME}.desktop"


def hicolor(home: Path) -> Path:
    return home / "icons" / "hicolor"


def icon_targets(home: Path) -> list[tuple[Path, Path]]:
    """(packaged file, where it goes) for every icon."""
    apps = lambda folder: hicolor(home) / folder / "apps"
    pairs = [(svg_path(), apps("scalable") / f"{ICON_NAME}.svg")]
    pairs += [(png_path(n), apps(f"{n}x{n}") / f"{ICON_NAME}.png") for n in PNG_SIZES]
    return pairs


@dataclass(frozen=True)
class Outcome:
    written: int  # files created or changed
    existed: int  # of those, files that were there before with other content
    total: int  # files the entry is made of


def _contents(home: Path) -> list[tuple[Path, bytes]]:
    wanted = [(entry_path(home), entry_text().encode("utf-8"))]
    for source, target in icon_targets(home):
        try:
            wanted.append((target, source.read_bytes()))
        except OSError:
            raise UserError(f"the packaged icon {source} is missing; reinstall captioner") from None
    return wanted


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def install(home: Path) -> Outcome:
    written = existed = 0
    wanted = _contents(home)
    for path, data in wanted:
        try:
            if path.is_file() and path.read_bytes() == data:
                continue  # idempotent: an unchanged file keeps its time stamp, no cache rebuilt
            existed += path.exists()
            _write(path, data)
        except OSError as error:
            raise UserError(f"cannot write {path}: {one_line(error.strerror or error)}") from None
        written += 1
    if written:
        refresh_caches(home)
    return Outcome(written=written, existed=existed, total=len(wanted))


def uninstall(home: Path) -> int:
    """Removes the entry and the icons; returns how many files were there. Icon folders left
    empty are removed too (they were made for these files); ``applications`` and the theme's
    own folder stay."""
    removed = 0
    paths = [entry_path(home)] + [target for _, target in icon_targets(home)]
    for path in paths:
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as error:
            raise UserError(f"cannot remove {path}: {one_line(error.strerror or error)}") from None
        removed += 1
        if path.parent.parent.parent == hicolor(home):  # .../hicolor/NxN/apps/captioner.png
            for folder in (path.parent, path.parent.parent):
                try:
                    folder.rmdir()
                except OSError:  # not empty: another application's icons live there
                    break
    if removed:
        refresh_caches(home)
    return removed


def refresh_caches(home: Path) -> None:
    """Brings the desktop's caches up to date where they exist. A cache that is not there is not
    made (the menu and the icon theme read the folders instead), so --uninstall can leave
    exactly what was there before; a missing or failing tool is ignored."""
    theme = hicolor(home)
    if theme.is_dir():
        os.utime(theme)  # the icon theme spec's sign that a theme's folders changed
    runs = [
        ("update-desktop-database", entry_path(home).parent, "mimeinfo.cache", ["--quiet"]),
        ("gtk-update-icon-cache", theme, "icon-theme.cache", ["--quiet", "--force", "--ignore-theme-index"]),
    ]
    for tool, folder, cache, options in runs:
        program = shutil.which(tool)
        if program is None or not (folder / cache).is_file():
            continue
        try:
            subprocess.run([program, *options, str(folder)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=60, check=False)
        except (OSError, subprocess.SubprocessError):
            pass  # a stale cache only delays the menu noticing; the files are in place
