"""The controller reports to the window only through the SessionView interface.

The first tests run the controller against a recording fake view and a fake pipeline (plain
Python, no Qt, no model); the others check the window's side, the queued bridge, and the two
joined by the GUI entry point's wiring.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from fakes import TIMEOUT_S, Factory, RecordingView, final, status, write_tone_wav

from captioner.errors import UserError
from captioner.ui.run_config import RunConfig, SourceChoice
from captioner.ui.session_view import SessionView


@pytest.fixture
def clip_path(tmp_path):
    return write_tone_wav(tmp_path / "clip.wav")


@pytest.fixture
def transcripts(tmp_path, monkeypatch):
    directory = tmp_path / "transcripts"
    monkeypatch.setenv("CAPTIONER_TRANSCRIPT_DIR", str(directory))
    return directory


@pytest.fixture
def make_controller(transcripts):
    from captioner.app.gui_app import LiveController

    made = []

    def make(view, factory):
        controller = LiveController(view, device="cpu", pipeline_factory=factory)
        made.append(controller)
        return controller

    yield make
    for controller in made:
        controller.shutdown(timeout_s=TIMEOUT_S)


def file_config(path, model="tiny.en"):
    return RunConfig(sources=(SourceChoice("file", "Clip", path.name, path=str(path)),), model=model)


def wait_until(condition):
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# -- the controller against a recording view (no Qt) ---------------------------------------------


def test_the_fake_view_is_a_session_view():
    assert isinstance(RecordingView(), SessionView)


def test_a_file_session_starts_and_finishes_in_order(make_controller, clip_path, transcripts):
    view, factory = RecordingView(), Factory()
    controller = make_controller(view, factory)
    controller.start(file_config(clip_path))
    started = view.wait_for("session_started")
    assert view.names() == ["session_starting", "session_progress", "session_progress", "session_started"]
    assert view.calls[0] == ("session_starting", "tiny.en")
    assert view.calls[1][1:] == ("tiny.en: building graphs", 0.5)
    _, transcript_path, meta = started
    assert transcript_path is not None and transcript_path.startswith(str(transcripts))
    assert meta["device_requested"] == "cpu" and meta["backend"] == "fake"
    (pipeline,) = factory.built
    assert (pipeline.model, pipeline.language, pipeline.task, pipeline.device) == ("tiny.en", "auto", "transcribe", "cpu")
    assert [s.stream for s in pipeline.sources] == ["Clip"]
    wait_until(lambda: not controller.busy)
    assert controller.pipeline is pipeline

    # The window's feed: captions pass through; once every file has ended, it stops by itself.
    pipeline.captions = [final("Clip", "Hello.")]
    pipeline.leftovers = [final("Clip", "Goodbye.", 1.0, 2.0)]
    assert [u.text for u in controller.drain_captions()] == ["Hello."]
    pipeline.exhausted = True
    assert controller.drain_captions() == []
    _, leftovers, last_status, error = view.wait_for("session_stopped")
    assert view.names()[-2:] == ["session_stopping", "session_stopped"]
    assert view.wait_for("session_stopping") == ("session_stopping", True)
    assert [u.text for u in leftovers] == ["Goodbye."] and last_status is pipeline.status and error is None
    assert controller.pipeline is None and not controller.busy and pipeline.stopped == 1


@pytest.mark.parametrize("config, reason", [
    (RunConfig(sources=()), "pick at least one source"),
    (RunConfig(sources=(SourceChoice("file", "Gone", "gone.wav", path="/nonexistent/gone.wav"),)), "gone.wav"),
])
def test_a_bad_source_fails_the_start(make_controller, config, reason):
    view, factory = RecordingView(), Factory()
    controller = make_controller(view, factory)
    controller.start(config)
    _, message = view.wait_for("session_failed")
    assert view.names() == ["session_starting", "session_failed"]
    assert reason in message
    assert factory.built == []
    wait_until(lambda: not controller.busy)
    assert controller.pipeline is None


def test_a_failing_model_fails_the_start_and_another_start_is_possible(make_controller, clip_path):
    view = RecordingView()
    controller = make_controller(view, Factory(fail=RuntimeError("no such model")))
    controller.start(file_config(clip_path, model="tiny.en"))
    _, message = view.wait_for("session_failed")
    assert message == "could not start: RuntimeError: no such model"
    assert view.names() == ["session_starting", "session_progress", "session_failed"]
    assert view.failed_settings == [""]  # the model was found: its start failed, not the setting
    wait_until(lambda: not controller.busy)
    controller.start(file_config(clip_path, model="tiny.en"))
    view.wait_for("session_failed", count=2)
    assert view.names().count("session_starting") == 2


def test_a_model_that_does_not_exist_fails_as_the_model_setting(make_controller, clip_path, tmp_path):
    """Found missing before any pipeline is built, and named as the setting to change."""
    view = RecordingView()
    factory = Factory()
    controller = make_controller(view, factory)
    controller.start(file_config(clip_path, model=str(tmp_path / "nosuch")))
    _, message = view.wait_for("session_failed")
    assert "no such file or folder" in message
    assert view.failed_settings == ["model"] and factory.built == []


def test_a_user_error_from_the_pipeline_is_shown_as_is(make_controller, clip_path):
    view = RecordingView()
    controller = make_controller(view, Factory(fail=UserError("not enough free VRAM")))
    controller.start(file_config(clip_path))
    assert view.wait_for("session_failed") == ("session_failed", "not enough free VRAM")


def test_requests_during_a_start_are_ignored(make_controller, clip_path):
    gate = threading.Event()
    view, factory = RecordingView(), Factory(gate=gate)
    controller = make_controller(view, factory)
    controller.start(file_config(clip_path))
    controller.start(file_config(clip_path))
    controller.stop()
    assert controller.busy
    gate.set()
    view.wait_for("session_started")
    assert view.names().count("session_starting") == 1 and "session_stopping" not in view.names()
    assert len(factory.built) == 1


def test_a_failed_worker_stops_the_session_with_its_reason(make_controller, clip_path):
    view, factory = RecordingView(), Factory()
    controller = make_controller(view, factory)
    controller.start(file_config(clip_path))
    view.wait_for("session_started")
    wait_until(lambda: not controller.busy)
    factory.built[0].error = RuntimeError("capture lost")
    controller.drain_captions()
    assert view.wait_for("session_stopped")[3] == "capture lost"
    assert view.wait_for("session_stopping") == ("session_stopping", False)


def test_shutdown_hands_back_what_a_running_session_commits(make_controller, clip_path):
    view, factory = RecordingView(), Factory()
    controller = make_controller(view, factory)
    controller.start(file_config(clip_path))
    view.wait_for("session_started")
    factory.built[0].leftovers = [final("Clip", "Last words.")]
    assert [u.text for u in controller.shutdown(timeout_s=TIMEOUT_S)] == ["Last words."]
    assert "session_stopped" not in view.names()  # the window is gone by then: nothing is queued


def test_devices_are_listed_to_the_view(make_controller, monkeypatch):
    import captioner.audio.devices as devices

    view = RecordingView()
    controller = make_controller(view, Factory())
    monkeypatch.setattr(devices, "list_input_devices", lambda: ["mic"])
    controller.refresh_devices()

    def broken():
        raise UserError("PortAudio is not installed")

    monkeypatch.setattr(devices, "list_input_devices", broken)
    controller.refresh_devices()
    assert view.calls == [("devices_listed", ["mic"], None),
                          ("devices_listed", [], "No audio devices: PortAudio is not installed")]


def test_gui_app_imports_and_runs_without_qt():
    """The composition root is plain Python: importing it and running a (failing) start loads no
    Qt module."""
    code = (
        "import sys, time\n"
        "from captioner.app.gui_app import LiveController\n"
        "from captioner.ui.run_config import RunConfig\n"
        "class View:\n"
        "    def __init__(self): self.calls = []\n"
        "    def __getattr__(self, name): return lambda *a: self.calls.append(name)\n"
        "view = View()\n"
        "controller = LiveController(view, device='cpu')\n"
        "controller.refresh_devices()\n"
        "controller.start(RunConfig(sources=()))\n"
        "deadline = time.monotonic() + 30\n"
        "while 'session_failed' not in view.calls and time.monotonic() < deadline: time.sleep(0.01)\n"
        "controller.shutdown()\n"
        "qt = sorted(m for m in sys.modules if m.split('.')[0] in ('PySide6', 'shiboken6', 'pyqtgraph'))\n"
        "print(view.calls, qt)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "QT_QPA_PLATFORM"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("['devices_listed', 'session_starting', 'session_failed'] []"), out.stdout


# -- the window's side: the bridge and its slots (Qt) --------------------------------------------


@pytest.fixture
def quiet_window(qtbot, settings_store):
    """A window whose session slots note the thread they run on."""
    from captioner.ui.main_window import MainWindow

    class ThreadNotingWindow(MainWindow):
        def __init__(self, *args, **kwargs):
            self.slot_threads = []
            super().__init__(*args, **kwargs)

        def show_session_started(self, transcript_path, meta):
            self.slot_threads.append(threading.current_thread())
            super().show_session_started(transcript_path, meta)

    win = ThreadNotingWindow(settings_store)
    qtbot.addWidget(win)
    qtbot.addWidget(win.overlay)
    win.show()
    qtbot.waitExposed(win)
    return win


def test_the_window_session_is_a_session_view(quiet_window):
    assert isinstance(quiet_window.session, SessionView)


def test_calls_from_a_helper_thread_reach_the_widgets_on_the_gui_thread(quiet_window, qtbot):
    window = quiet_window

    def helper():
        window.session.session_starting("base")
        window.session.session_progress("base: loading", 0.25)
        window.session.session_started("/tmp/transcript.txt", {"backend": "cpu"})

    thread = threading.Thread(target=helper)
    thread.start()
    thread.join()
    assert window.state_label.text() == "Stopped"  # queued: the helper thread touched nothing
    qtbot.waitUntil(lambda: window.state_label.text() == "Captioning", timeout=3000)
    assert window.slot_threads == [threading.main_thread()]
    assert window.controls.running and window.controls.start_button.isEnabled()
    assert window.record_meta["backend"] == "cpu"
    assert "/tmp/transcript.txt" in window.history.transcript_label.text()


def test_progress_then_stop_are_shown(quiet_window, qtbot):
    window = quiet_window
    window.session.session_starting("tiny.en")
    window.session.session_progress("tiny.en: building graphs", 0.4)
    qtbot.waitUntil(lambda: window.state_label.text() == "tiny.en: building graphs (40%)", timeout=3000)
    assert window.controls.running and not window.controls.start_button.isEnabled()
    window.session.session_started(None, {})
    window.session.session_stopping(True)
    qtbot.waitUntil(lambda: window.state_label.text().startswith("Finishing"), timeout=3000)
    assert not window.controls.start_button.isEnabled()
    window.session.session_stopped([final("Clip", "The end.")], status(), "capture lost")
    qtbot.waitUntil(lambda: window.state_label.text() == "Stopped: capture lost", timeout=3000)
    assert window.caption_view.committed_text() == "Clip: The end."
    assert window.streams_label.text() == "Streams: 1"
    assert not window.controls.running and window.controls.start_button.isEnabled()


def test_a_failed_start_ends_the_progress_and_says_why_in_the_banner(window, qtbot):
    from PySide6.QtWidgets import QApplication, QDialog, QMessageBox

    window.session.session_starting("base")
    qtbot.waitUntil(lambda: window.progress_bar.isVisible(), timeout=3000)
    window.session.session_progress("base: building graphs", 0.3)
    qtbot.waitUntil(lambda: window.progress_bar.value() == 30, timeout=3000)
    window.session.session_failed("not enough free VRAM")
    qtbot.waitUntil(lambda: window.state_label.text() == "Error: not enough free VRAM", timeout=3000)
    assert not window.progress_bar.isVisible()
    # In the window, not in a dialog: nothing modal, no message box.
    assert window.banner.isVisible() and window.banner.level == "error"
    assert window.banner.text().startswith("Not enough free VRAM")
    assert QApplication.activeModalWidget() is None
    assert not [w for w in QApplication.topLevelWidgets() if isinstance(w, (QDialog, QMessageBox)) and w.isVisible()]
    assert not window.controls.running and window.controls.start_button.isEnabled()
    window.banner.close_button.click()
    assert not window.banner.isVisible()


def test_devices_are_applied_at_once_on_the_gui_thread(quiet_window):
    class Device:
        name, is_monitor, open_as = "USB headset", False, 3

    quiet_window.session.devices_listed([Device()], "No audio devices: just testing")
    assert [c.label for c in quiet_window.controls.source_list.choices()] == ["Default microphone", "USB headset"]
    assert quiet_window.statusBar().currentMessage() == "No audio devices: just testing"


def test_the_entry_point_wires_window_and_controller(quiet_window, qtbot, make_controller, clip_path, monkeypatch):
    """The window's requests reach the controller, and its reports the window, as in the app."""
    import captioner.audio.devices as devices
    from captioner.app.gui_main import connect_window

    window, factory = quiet_window, Factory()
    controller = make_controller(window.session, factory)
    connect_window(window, controller)
    monkeypatch.setattr(devices, "list_input_devices", lambda: [])
    window.controls.refresh_button.click()
    assert window.controls.source_list.choices() == []  # no input here: nothing to tick

    window.controls.add_file(str(clip_path))
    window.controls.select_only([f"file:{clip_path}"])
    window.controls.start_button.click()
    qtbot.waitUntil(lambda: window.state_label.text() == "Captioning", timeout=5000)
    factory.built[0].captions = [final("clip", "Hello.")]
    qtbot.waitUntil(lambda: window.caption_view.committed_text() == "clip: Hello.", timeout=3000)

    factory.built[0].leftovers = [final("clip", "Goodbye.", 3.0, 4.0)]
    window.controls.start_button.click()  # "Stop"
    qtbot.waitUntil(lambda: window.state_label.text() == "Stopped", timeout=5000)
    # A pause after a sentence's end ends the cue.
    assert window.caption_view.committed_text() == "clip: Hello.\nclip: Goodbye."
    assert window.controls.start_button.text() == "Start" and controller.pipeline is None
