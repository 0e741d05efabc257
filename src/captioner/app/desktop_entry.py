"""The text of Captioner's desktop entry (freedesktop.org Desktop Entry Specification,
version 1.4: what desktop-file-validate 0.26 checks; nothing here is newer).

A menu starts the app with no virtual environment activated and the home folder as its working
directory, so ``Exec`` names this environment's own ``captioner`` script by absolute path (its
shebang is the environment's Python). Without one (the package run from elsewhere) it falls back
to this interpreter with ``-m captioner``.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

from captioner.data.icons import ICON_NAME

DESKTOP_FILE_NAME = "captioner"
"""The entry is ``captioner.desktop``; the app gives Qt the same name (Wayland's app id), and on
X11 Qt's window class is the application name, also "captioner": ``StartupWMClass`` below."""

CATEGORIES = "Utility;Accessibility;"
"""One registered main category (more would list the app twice in some menus) and Accessibility,
which the specification files under Utility or Settings."""


def launch_argv() -> list[str]:
    """The command line that opens the desktop app from this installation."""
    script = Path(sysconfig.get_path("scripts")) / "captioner"
    if script.is_file():
        return [str(script), "gui"]
    return [sys.executable, "-m", "captioner", "gui"]


_RESERVED = set(" \t\n\"'\\><~|&;$*?#()`")


def quote_argument(argument: str) -> str:
    """One argument as Exec's quoting rules want it: in double quotes when it holds a reserved
    character, with a backslash before a double quote, a backquote, ``$`` and ``\\`` inside
    them; ``%`` doubled (a field code otherwise)."""
    text = argument.replace("%", "%%")
    if text and not (_RESERVED & set(text)):
        return text
    return '"' + "".join("\\" + c if c in '"`$\\' else c for c in text) + '"'


def escape_string(value: str) -> str:
    """A value as the file stores strings: its backslash escapes are undone when it is read
    (before Exec is split into arguments), so backslashes are doubled once more here."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")


def exec_value(argv: list[str]) -> str:
    return escape_string(" ".join(quote_argument(a) for a in argv))


def entry_text(argv: list[str] | None = None) -> str:
    argv = launch_argv() if argv is None else argv
    lines = [
        "[Desktop Entry]",
        "Type=Application",
        "Version=1.4",
        "Name=Captioner",
        "GenericName=Live Captions",
        "Comment=Live captions for speech from your microphone or a meeting's audio",
        f"Exec={exec_value(argv)}",
    ]
    if Path(argv[0]).name == "captioner":
        # The menu hides the entry once the environment it points into is gone.
        lines.append(f"TryExec={escape_string(argv[0])}")  # a plain path, no Exec quoting
    lines += [
        f"Icon={ICON_NAME}",
        "Terminal=false",
        f"Categories={CATEGORIES}",
        "Keywords=captions;subtitles;transcription;speech to text;hearing;deaf;meeting;whisper;",
        f"StartupWMClass={DESKTOP_FILE_NAME}",
        "StartupNotify=true",
    ]
    return "\n".join(lines) + "\n"
