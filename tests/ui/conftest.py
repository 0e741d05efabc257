"""Qt tests run offscreen with Qt warnings as failures (the offscreen plugin's notes about
window-manager features it lacks are the only messages ignored)."""

from __future__ import annotations

import argparse
import gc
import os

import pytest
from fakes import TIMEOUT_S

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

OFFSCREEN_NOTES = r"This plugin does not support"


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.qt_log_level_fail("WARNING"))
            item.add_marker(pytest.mark.qt_log_ignore(OFFSCREEN_NOTES))


@pytest.fixture(autouse=True)
def _qt_garbage_collected_on_this_thread():
    """Each test's garbage is collected here, on the GUI thread, before and after it. Left to the
    cyclic GC, a Qt object in a cycle is destroyed by whichever thread's allocation sets off the
    collection: in one run (2026-12-04) the engine's worker thread, loading a model at the start of
    the next test, did, and QObject's destructor there waited for the interpreter lock while the
    GUI thread waited on Qt (gdb: the worker in QObject::~QObject -> take_gil; the test hung until
    its timeout). The app's windows follow the same rule while they live (captioner/ui/collector.py);
    after the test its windows, closed by pytest-qt, are deleted here, which gives automatic
    collection back to the tests that follow."""
    from PySide6.QtCore import QCoreApplication, QEvent

    gc.collect()
    yield
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    gc.collect()


@pytest.fixture
def settings_store(tmp_path):
    from captioner.ui.settings import open_settings

    return open_settings(str(tmp_path / "settings.ini"))


@pytest.fixture
def window(qtbot, settings_store):
    from captioner.ui.main_window import MainWindow

    win = MainWindow(settings_store)
    qtbot.addWidget(win)
    qtbot.addWidget(win.overlay)
    win.show()
    qtbot.waitExposed(win)
    return win


@pytest.fixture
def gui_args(tmp_path):
    """``captioner gui`` arguments, with a settings file of the test's own."""
    from captioner.app.commands import gui

    parser = argparse.ArgumentParser()
    gui.add_arguments(parser)
    return lambda *argv: parser.parse_args(["--settings", str(tmp_path / "settings.ini"), *argv])


@pytest.fixture
def open_app(qtbot, tmp_path, monkeypatch):
    """Opens the app's window as `captioner gui` does; ``devices``: what the device listing
    finds (None: the real listing of this machine)."""
    from captioner.app.gui_main import open_window

    monkeypatch.setenv("CAPTIONER_TRANSCRIPT_DIR", str(tmp_path / "transcripts"))
    opened = []

    def open_(args, factory, devices=None):
        if devices is not None:
            import captioner.audio.devices

            monkeypatch.setattr(captioner.audio.devices, "list_input_devices", lambda: list(devices))
        window, controller = open_window(args, pipeline_factory=factory)
        qtbot.addWidget(window)
        qtbot.addWidget(window.overlay)
        opened.append(controller)
        return window, controller

    yield open_
    for controller in opened:
        controller.shutdown(timeout_s=TIMEOUT_S)
