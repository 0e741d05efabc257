"""Captioner in the desktop's menu (issue 46): `captioner install-desktop` puts a desktop entry
and the icon into a user's data folder, desktop-file-validate has nothing to say about the entry,
`--uninstall` takes out exactly those files, the entry's Exec line opens the app under Xvfb (its
window in the class the entry names, with the icon), and scripts/setup.sh installs it without
ever failing on it.

Every install goes into a temporary ``XDG_DATA_HOME``, never the real home.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from captioner.app.desktop_entry import exec_value, quote_argument
from captioner.data.icons import PNG_SIZES, png_path, svg_path
from test_setup_script import FAKE_PYTHON, checkout, executable, setup  # noqa: F401 (fixture)


def environment(data_home: Path, home: Path) -> dict[str, str]:
    """As a desktop session's menu starts programs: no virtual environment, no display of ours."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM", "VIRTUAL_ENV", "PYTHONPATH")}
    env.update(XDG_DATA_HOME=str(data_home), HOME=str(home), PATH="/usr/local/bin:/usr/bin:/bin")
    return env


def captioner(data_home: Path, *argv: str) -> subprocess.CompletedProcess:
    home = data_home.parent / "home"
    home.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "captioner", "install-desktop", *argv], cwd=home,
                          env=environment(data_home, home), capture_output=True, text=True, timeout=60)


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def data_home(tmp_path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def installed(data_home) -> Path:
    done = captioner(data_home)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.count("\n") == 1 and done.stdout.startswith("captioner: added Captioner to the desktop menu")
    return data_home


EXPECTED_FILES = {"applications/captioner.desktop", "icons/hicolor/scalable/apps/captioner.svg",
                  *(f"icons/hicolor/{n}x{n}/apps/captioner.png" for n in PNG_SIZES)}


def test_installs_the_entry_and_every_icon_size(installed):
    assert files_under(installed) == EXPECTED_FILES
    assert {48, 256} <= set(PNG_SIZES)
    for n in PNG_SIZES:
        assert png_size(installed / f"icons/hicolor/{n}x{n}/apps/captioner.png") == (n, n)
    assert (installed / "icons/hicolor/scalable/apps/captioner.svg").read_bytes() == svg_path().read_bytes()


def entry(installed: Path) -> dict[str, str]:
    lines = (installed / "applications/captioner.desktop").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "[Desktop Entry]"
    return dict(line.split("=", 1) for line in lines[1:] if line and not line.startswith("#"))


def test_entry_names_the_app_and_its_icon(installed):
    values = entry(installed)
    assert values["Name"] == "Captioner" and values["Icon"] == "captioner"
    assert values["Type"] == "Application" and values["Terminal"] == "false"
    assert values["StartupWMClass"] == "captioner"
    assert values["GenericName"] and values["Comment"] and values["Keywords"].endswith(";")
    # A menu has no virtual environment: Exec starts this environment's own script by its full path.
    program = Path(shlex.split(values["Exec"])[0])
    assert program.is_absolute() and os.access(program, os.X_OK), values["Exec"]


@pytest.mark.skipif(shutil.which("desktop-file-validate") is None, reason="needs desktop-file-utils")
def test_desktop_file_validate_has_nothing_to_say(installed):
    done = subprocess.run(["desktop-file-validate", str(installed / "applications/captioner.desktop")],
                          capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")  # hints would be printed too


def test_a_second_install_changes_nothing(installed):
    times = {p: p.stat().st_mtime_ns for p in installed.rglob("*") if p.is_file()}
    done = captioner(installed)
    assert done.returncode == 0 and done.stdout.startswith("captioner: Captioner is already in the desktop menu")
    assert {p: p.stat().st_mtime_ns for p in installed.rglob("*") if p.is_file()} == times


def test_a_changed_entry_is_put_right(installed):
    desktop = installed / "applications/captioner.desktop"
    good = desktop.read_bytes()
    desktop.write_text("[Desktop Entry]\nExec=/old/checkout/.venv/bin/captioner gui\n", encoding="utf-8")
    done = captioner(installed)
    assert done.returncode == 0 and done.stdout.startswith("captioner: updated Captioner in the desktop menu")
    assert desktop.read_bytes() == good


def test_uninstall_removes_exactly_what_was_installed(data_home):
    others = {"applications/other.desktop": b"[Desktop Entry]\n", "icons/hicolor/48x48/apps/other.png": b"png",
              "icons/hicolor/index.theme": b"[Icon Theme]\n"}
    for name, data in others.items():
        (data_home / name).parent.mkdir(parents=True, exist_ok=True)
        (data_home / name).write_bytes(data)
    assert captioner(data_home).returncode == 0
    assert files_under(data_home) == EXPECTED_FILES | set(others)

    done = captioner(data_home, "--uninstall")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"captioner: removed Captioner from the desktop menu ({len(EXPECTED_FILES)} files under {data_home})\n"
    assert files_under(data_home) == set(others)
    assert all((data_home / name).read_bytes() == data for name, data in others.items())
    # The icon folders made for it are gone; one another application uses stays.
    sizes = {p.name for p in (data_home / "icons/hicolor").iterdir() if p.is_dir()}
    assert sizes == {"48x48"}

    again = captioner(data_home, "--uninstall")
    assert again.returncode == 0 and "nothing removed" in again.stdout


def test_an_unwritable_data_folder_is_one_line_and_exit_2(tmp_path):
    blocker = tmp_path / "data"
    blocker.write_text("a file where the data folder should be", encoding="utf-8")
    done = captioner(blocker)
    assert done.returncode == 2
    assert done.stderr.startswith("captioner: error: cannot write ") and done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_a_relative_xdg_data_home_is_ignored(tmp_path):
    # The XDG Base Directory spec: a relative path in these variables is invalid and ignored.
    home = tmp_path / "home"
    home.mkdir()
    env = environment(Path("relative/data"), home)
    done = subprocess.run([sys.executable, "-m", "captioner", "install-desktop"], cwd=home, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (home / ".local/share/applications/captioner.desktop").is_file()
    assert not (home / "relative").exists()


def test_without_a_captioner_script_the_entry_runs_this_python(tmp_path, monkeypatch):
    import sysconfig

    from captioner.app import desktop_entry

    monkeypatch.setattr(sysconfig, "get_path", lambda name, *a, **k: str(tmp_path))  # no script there
    assert desktop_entry.launch_argv() == [sys.executable, "-m", "captioner", "gui"]
    text = desktop_entry.entry_text()
    assert f"Exec={exec_value([sys.executable, '-m', 'captioner', 'gui'])}\n" in text
    assert "TryExec=" not in text  # it names a script, and there is none


@pytest.mark.parametrize(("argument", "quoted"), [
    ("/home/me/captioner/.venv/bin/captioner", "/home/me/captioner/.venv/bin/captioner"),
    ("/home/me/my files/captioner", '"/home/me/my files/captioner"'),
    ("/opt/$HOME", r'"/opt/\\$HOME"'),  # the spec's own example: four characters for one `\$`
    ("a\\b", r'"a\\\\b"'),
    ("100%", "100%%"),
    ('say "hi"', r'"say \\"hi\\""'),
])
def test_exec_quoting_follows_the_specification(argument, quoted):
    assert exec_value([argument]) == quoted
    assert quote_argument("gui") == "gui"


# -- the icon as Qt sees it ------------------------------------------------------------------


def test_the_pngs_are_renders_of_the_svg(qapp):
    from PySide6.QtGui import QImage

    from captioner.ui.icon import render_icon

    def pixels(image: QImage) -> np.ndarray:
        image = image.convertToFormat(QImage.Format.Format_RGBA8888_Premultiplied)  # edges: colour x alpha
        return np.frombuffer(image.constBits(), np.uint8).reshape(image.height(), image.bytesPerLine())[:, :4 * image.width()]

    for n in PNG_SIZES:
        shipped = QImage(str(png_path(n)))
        assert (shipped.width(), shipped.height()) == (n, n)
        difference = np.abs(pixels(shipped).astype(int) - pixels(render_icon(n)).astype(int))
        # Changed the SVG? Run scripts/render-icons.py.
        # Anti-aliased edges differ by a few levels with the Qt application's state (seen at 24 px
        # in the full suite: 1.18); a changed drawing moves the mean far more.
        assert difference.mean() < 4.0, f"captioner-{n}.png no longer matches captioner.svg"


def test_app_icon_holds_every_render(qapp):
    from captioner.ui.icon import app_icon

    icon = app_icon()
    assert not icon.isNull()
    sizes = {(s.width(), s.height()) for s in icon.availableSizes()}
    assert {(n, n) for n in PNG_SIZES} <= sizes
    assert not icon.pixmap(16, 16).isNull() and not icon.pixmap(512, 512).isNull()


def test_run_app_sets_the_icon_and_desktop_file_name_before_any_window(qapp, monkeypatch):
    from PySide6.QtGui import QGuiApplication, QIcon

    from captioner.app import gui_main

    class Opened(Exception):
        pass

    seen = {}

    def open_window(args):
        seen.update(icon=QGuiApplication.windowIcon(), name=QGuiApplication.desktopFileName())
        raise Opened

    monkeypatch.setattr(gui_main, "open_window", open_window)
    before = QGuiApplication.windowIcon(), QGuiApplication.desktopFileName()
    try:
        with pytest.raises(Opened):
            gui_main.run_app(argparse.Namespace())
    finally:
        QGuiApplication.setWindowIcon(before[0] if not before[0].isNull() else QIcon())
        QGuiApplication.setDesktopFileName(before[1])
    assert not seen["icon"].isNull()
    assert seen["name"] == "captioner"


# -- the menu launches it ----------------------------------------------------------------------

WINDOWS_PROBE = r"""
# Runs the command given, and while it runs notes every mapped window of class "captioner" with
# the first line of its _NET_WM_ICON ("Icon (W x H):" when the window has an icon).
"$@" & app=$!
while kill -0 "$app" 2>/dev/null; do
  for id in $(xwininfo -root -children 2>/dev/null | awk '/^ +0x/ {print $1}'); do
    xwininfo -id "$id" 2>/dev/null | grep -q IsViewable || continue
    class=$(xprop -notype -id "$id" WM_CLASS 2>/dev/null)
    case "$class" in *captioner*) ;; *) continue ;; esac
    icon=$(xprop -notype -len 8 -id "$id" _NET_WM_ICON 2>/dev/null | head -n 1)
    echo "window $id | $class | $icon" >> "$SEEN"
  done
  sleep 0.2
done
wait "$app"
"""


@pytest.mark.skipif(any(shutil.which(t) is None for t in ("xvfb-run", "xprop", "xwininfo")),
                    reason="needs xvfb-run and x11-utils")
def test_the_entry_launches_the_app_under_xvfb(installed, tmp_path):
    values = entry(installed)
    argv = shlex.split(values["Exec"].replace("\\\\", "\\"))  # the string escapes, then Exec's quoting
    assert not any(a.startswith("%") for a in argv)  # no field codes to expand
    probe, seen = tmp_path / "probe.sh", tmp_path / "seen.txt"
    probe.write_text(WINDOWS_PROBE, encoding="utf-8")
    home = installed.parent / "home"
    env = environment(installed, home) | {"SEEN": str(seen)}
    done = subprocess.run(["xvfb-run", "-a", "bash", str(probe), *argv,
                           "--no-start", "--quit-after", "3", "--settings", str(tmp_path / "settings.ini")],
                          cwd=home, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    windows = set(seen.read_text(encoding="utf-8").splitlines()) if seen.exists() else set()
    assert windows, "no captioner window was ever shown:\n" + done.stderr
    for line in windows:
        _, wm_class, icon = (part.strip() for part in line.split("|"))
        # WM_CLASS is (instance, class); the menu matches the class against StartupWMClass.
        assert wm_class.endswith(f', "{values["StartupWMClass"]}"'), line
        assert icon.startswith("_NET_WM_ICON = ") and "Icon (" in icon, line


# -- scripts/setup.sh --------------------------------------------------------------------------


def test_setup_adds_the_entry(checkout):
    calls = setup(checkout)[1]
    assert "python -m captioner install-desktop" in calls, calls
    assert calls.index("python -m captioner install-desktop") > calls.index("python -m captioner.app.prepare")


def test_a_failing_install_desktop_only_warns(checkout):
    failing = 'case "$*" in *install-desktop*) echo "captioner: error: cannot write /x: Read-only file system" >&2; exit 2 ;; esac\n'
    executable(checkout / ".venv" / "bin" / "python", FAKE_PYTHON + failing)
    env = {"PATH": f"{checkout.parent / 'stubs'}:/usr/bin:/bin", "CALLS": os.devnull, "HOME": str(checkout.parent)}
    done = subprocess.run(["bash", "scripts/setup.sh", "app"], cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert ("captioner setup: warning: Captioner was not added to the desktop menu: "
            "cannot write /x: Read-only file system\n") in done.stderr
    assert "ready" in done.stdout
    assert list((checkout / ".venv").glob(".captioner-setup-*"))  # the set-up counts as done
