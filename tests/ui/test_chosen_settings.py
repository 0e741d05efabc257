"""What the app remembers: only what the user chose in it.

Options given on the command line apply to their run; a saved setting that fails at launch (a
server that refuses, a model that is gone) falls back to the default for that run under a banner
that names it and offers to forget it; the overlay shows only with something to show, off the
app's own window unless the user put it there.
"""

from __future__ import annotations

import argparse
import time

import pytest
from fakes import TIMEOUT_S, Factory, final, write_tone_wav
from PySide6.QtCore import QPoint, QRect, QSize
from PySide6.QtWidgets import QApplication, QPushButton

from captioner.app import cli
from captioner.ui import main_window as main_window_module
from captioner.ui.notices import failure_notice
from captioner.ui.overlay_place import default_overlay_rect
from captioner.ui.run_config import RunConfig, SourceChoice
from captioner.ui.settings import (
    AppSettings,
    load_settings,
    open_settings,
    save_settings,
)

WAIT_MS = int(TIMEOUT_S * 1000)


class Microphone:
    name, is_monitor, open_as = "USB headset", False, "3"


@pytest.fixture
def ini(tmp_path):
    return str(tmp_path / "settings.ini")


@pytest.fixture
def clip(tmp_path):
    return str(write_tone_wav(tmp_path / "clip.wav"))


def saved(ini: str) -> AppSettings:
    return load_settings(open_settings(ini))


def save(ini: str, **values) -> None:
    save_settings(open_settings(ini), AppSettings(**values))


@pytest.fixture
def launch(qtbot, tmp_path, monkeypatch):
    """Opens the app as `captioner gui ARGS` does (a fake pipeline; a USB headset listed)."""
    import captioner.audio.devices
    from captioner.app.commands import gui
    from captioner.app.gui_main import open_window

    monkeypatch.setenv("CAPTIONER_TRANSCRIPT_DIR", str(tmp_path / "transcripts"))
    monkeypatch.setattr(captioner.audio.devices, "list_input_devices", lambda: [Microphone()])
    parser = argparse.ArgumentParser()
    gui.add_arguments(parser)
    opened = []

    def launch_(ini, *argv, factory=None):
        args = parser.parse_args(["--settings", ini, "--device", "cpu", *argv])
        args.token = None
        window, controller = open_window(args, pipeline_factory=factory or Factory())
        qtbot.addWidget(window)
        qtbot.addWidget(window.overlay)
        opened.append((window, controller))
        return window, controller

    yield launch_
    for _window, controller in opened:
        controller.shutdown(timeout_s=TIMEOUT_S)


def close(window) -> None:
    window.close()  # saves the settings, as quitting the app does


def test_options_given_on_the_command_line_are_not_saved(launch, ini):
    window, _ = launch(ini, "--server", "ws://127.0.0.1:18765", "--model", "base", "--policy", "alignatt",
                       "--theme", "light", "--language", "de", "--overlay", "--no-start")
    assert window.controls.server() == "ws://127.0.0.1:18765" and window.controls.model() == "base"
    assert window.theme.name == "light" and window.overlay_action.isChecked()
    close(window)
    s = saved(ini)
    assert (s.server, s.model, s.policy, s.theme, s.language, s.overlay_visible) == \
        ("", "tiny.en", "auto", "dark", "auto", False)


def test_what_the_user_changes_in_the_app_is_saved_even_after_an_option(launch, ini):
    window, _ = launch(ini, "--model", "base", "--theme", "light", "--no-start")
    window.controls.set_model("tiny.en")  # back to the default, chosen in the app
    window.controls.set_server("ws://10.0.0.5:8765")
    window.set_font_pt(30)
    close(window)
    s = saved(ini)
    assert (s.model, s.server, s.font_pt, s.theme) == ("tiny.en", "ws://10.0.0.5:8765", 30, "dark")


class FailsOnce(Factory):
    """The first pipeline fails to start with ``error`` (a server that refuses); later ones run."""

    def __init__(self, error):
        super().__init__()
        self.error, self.calls = error, 0

    def __call__(self, sources, **kwargs):
        self.calls += 1
        if self.calls == 1:
            raise self.error
        return super().__call__(sources, **kwargs)


def banner_button(window, prefix: str) -> QPushButton:
    QApplication.processEvents()
    (button,) = [b for b in window.banner.findChildren(QPushButton) if b.text().startswith(prefix) and b.isVisible()]
    return button


def test_a_saved_server_that_fails_at_launch_falls_back_to_this_computer(launch, ini, clip, qtbot):
    """The saved server refuses: this run captions on this computer (the same source), the
    banner names the server and offers "Reset it"; the saved value is kept until then."""
    save(ini, server="ws://127.0.0.1:18765")
    factory = FailsOnce(RuntimeError("the server refused the token (401): check --token-file"))
    window, controller = launch(ini, "--file", clip, factory=factory)
    requested = []
    window.start_requested.connect(requested.append)
    qtbot.waitUntil(lambda: window.banner.kind == "fallback", timeout=WAIT_MS)
    assert window.banner.level == "warning"
    text = window.banner.text()
    assert "saved server ws://127.0.0.1:18765" in text and "this computer" in text and "Ws://" not in text
    assert window.controls.server() == ""
    assert requested[-1].server == "" and [c.path for c in requested[-1].sources] == [clip]
    qtbot.waitUntil(lambda: factory.built and factory.built[-1].backend is not None, timeout=WAIT_MS)
    assert factory.calls == 2  # the fallback run started
    close(window)
    assert saved(ini).server == "ws://127.0.0.1:18765"  # kept: a network that is down comes back

    window, _ = launch(ini, "--file", clip, factory=FailsOnce(RuntimeError("connection refused")))
    qtbot.waitUntil(lambda: window.banner.kind == "fallback", timeout=WAIT_MS)
    banner_button(window, "Reset it").click()
    assert saved(ini).server == "" and window.banner.isHidden()


def test_a_saved_model_that_is_gone_falls_back_to_the_default_model(launch, ini, clip, tmp_path, qtbot):
    gone = str(tmp_path / "whisper-small-ct2")
    save(ini, model=gone)
    factory = Factory()
    window, _ = launch(ini, "--file", clip, factory=factory)  # starts at once, as the app does
    qtbot.waitUntil(lambda: window.banner.kind == "fallback", timeout=WAIT_MS)
    assert "saved model" in window.banner.text() and "tiny.en" in window.banner.text()
    qtbot.waitUntil(lambda: len(factory.built) == 1, timeout=WAIT_MS)
    assert factory.built[0].model == "tiny.en"
    banner_button(window, "Reset it").click()
    close(window)
    assert saved(ini).model == "tiny.en"


def test_a_failure_the_user_caused_in_the_app_is_not_a_fallback(launch, ini):
    """Only the launch's start of a saved value falls back; a server typed in the app that
    refuses says so, with the field to change."""
    window, _ = launch(ini, "--no-start")
    window.controls.set_server("ws://127.0.0.1:9")
    window.start_requested.emit(window.controls.run_config())
    window.show_session_failed("ws://127.0.0.1:9: connection refused", "server")
    assert window.banner.kind == "error" and window.controls.server() == "ws://127.0.0.1:9"
    assert "Change the Server field" in window.banner.text()
    assert window.banner.text().startswith("ws://127.0.0.1:9")  # a URL is not capitalised


def test_failure_hints_name_the_field_to_change():
    assert "<b>Model</b> box" in failure_notice("model x: no such file or folder", setting="model")
    assert "<b>Server</b> field" in failure_notice("the server needs a token", setting="server")
    assert "Sources" in failure_notice("no such audio file: a.wav")
    assert failure_notice("no such audio file: a.wav").startswith("<b>No such")


def test_the_gui_refuses_a_model_that_does_not_exist_on_one_line(tmp_path, capsys):
    ini = str(tmp_path / "s.ini")
    assert cli.main(["gui", "--settings", ini, "--model", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file or folder" in err
    assert saved(ini).model == "tiny.en"


def test_reset_settings_forgets_everything(tmp_path, capsys, monkeypatch):
    ini = str(tmp_path / "s.ini")
    save(ini, server="ws://h:1", model="base", overlay_visible=True, font_pt=40)
    monkeypatch.setattr("captioner.app.gui_main.run_app", lambda args: 0)
    assert cli.main(["gui", "--settings", ini, "--reset-settings"]) == 0
    assert "settings reset" in capsys.readouterr().out
    assert saved(ini) == AppSettings()


def test_the_overlay_shows_only_with_captions_and_hides_when_idle(launch, ini, monkeypatch):
    window, _ = launch(ini, "--overlay", "--no-start")
    window.resize(1000, 600)
    assert window.overlay_action.isChecked() and not window.overlay.isVisible()
    window.apply_captions([final("Me", "Good morning, everyone.", 0, 1)])
    assert window.overlay.isVisible()
    monkeypatch.setattr(main_window_module, "OVERLAY_IDLE_S", 0.05)
    time.sleep(0.1)
    window.pump()
    assert not window.overlay.isVisible() and window.overlay_action.isChecked()
    window.apply_captions([final("Me", "Next point.", 2, 3)])
    assert window.overlay.isVisible()
    window.clear_captions()
    assert not window.overlay.isVisible()


def test_the_overlay_goes_to_the_screen_s_bottom_edge_off_the_window(launch, ini):
    window, _ = launch(ini, "--overlay", "--no-start")
    screen = window.screen().availableGeometry()
    window.setGeometry(QRect(screen.left() + 40, screen.top() + 40, screen.width() // 2, screen.height() // 2))
    window.apply_captions([final("Me", "Placed by itself.", 0, 1)])
    overlay = window.overlay.frameGeometry()
    assert not overlay.intersects(window.frameGeometry())
    assert screen.contains(overlay) and screen.bottom() - overlay.bottom() < 100


@pytest.mark.parametrize(("window_rect", "expect"), [
    (QRect(0, 0, 1500, 1000), "beside"),  # the app's default size leaves a strip on the right
    (QRect(300, 0, 1300, 700), "bottom"),
    (QRect(0, 200, 1920, 880), "top"),
    (QRect(0, 0, 1920, 1080), "over"),  # maximised: the bottom edge, the only place left
])
def test_default_overlay_place(window_rect, expect):
    screen, size = QRect(0, 0, 1920, 1080), QSize(900, 130)
    rect = default_overlay_rect(screen, window_rect, size)
    assert screen.contains(rect)
    assert rect.intersects(window_rect) == (expect == "over")
    if expect in ("bottom", "over", "beside"):
        assert rect.bottom() > 900
    if expect == "bottom":
        assert rect.size() == size and abs(rect.center().x() - 960) <= 2
    if expect == "top":
        assert rect.top() < 100


def test_an_overlay_the_user_dragged_stays_there_next_launch(launch, ini):
    window, _ = launch(ini, "--no-start")
    window.set_overlay_visible(True)
    window.apply_captions([final("Me", "Drag me.", 0, 1)])
    window.overlay.resize(500, 120)  # restoring a geometry keeps a window on its screen (offscreen: 800 px)
    window.overlay.move(QPoint(123, 77))
    window.overlay.moved_by_user.emit()  # what a drag does (test_main_window drags it for real)
    close(window)
    window, _ = launch(ini, "--no-start")
    assert window.overlay_action.isChecked()  # turned on in the app: remembered
    window.apply_captions([final("Me", "Still there.", 0, 1)])
    assert window.overlay.pos() == QPoint(123, 77)


def test_the_overlay_is_remembered_only_when_turned_on_in_the_app(launch, ini):
    window, _ = launch(ini, "--no-start")
    window.overlay_action.trigger()
    close(window)
    assert saved(ini).overlay_visible


def test_run_config_has_the_server_field():  # the fallback compares it with the saved value
    assert RunConfig(sources=(SourceChoice("device", "Me", "Default"),)).server == ""


def test_a_saved_input_that_is_gone_falls_back_to_the_default_input(launch, ini, qtbot):
    save(ini, sources=["device:7"])  # a headset that is not plugged in now
    factory = Factory()
    window, _ = launch(ini, "--no-start", factory=factory)
    assert window.banner.kind == "fallback"
    assert "saved source 7" in window.banner.text() and "Default" in window.banner.text()
    assert [c.key() for c in window.controls.selected_sources()] == ["device:"]
    close(window)
    assert saved(ini).sources == ["device:7"]  # kept for when it is plugged in again
    window, _ = launch(ini, "--no-start", factory=factory)
    banner_button(window, "Reset it").click()
    close(window)
    assert saved(ini).sources == ["device:"]  # forgotten: what is ticked now is saved
