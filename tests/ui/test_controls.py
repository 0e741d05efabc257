"""The control panel: sources (devices, monitors, files, several at once), model, language."""

from __future__ import annotations

from PySide6.QtCore import Qt

from captioner.audio.devices import InputDevice
from captioner.ui.controls import ControlPanel, RunConfig

DEVICES = [
    InputDevice(index=3, name="USB headset mic", host_api="ALSA", channels=1, default_rate_hz=48000, is_monitor=False),
    InputDevice(index=None, name="alsa_output.pci.analog-stereo.monitor", host_api="PulseAudio", channels=2,
                default_rate_hz=48000, is_monitor=True),
]


def test_sources_several_at_once(qtbot, tmp_path):
    panel = ControlPanel()
    qtbot.addWidget(panel)
    panel.set_devices(DEVICES)
    labels = [panel.source_list.item(i).text() for i in range(panel.source_list.count())]
    assert labels[0] == "[Me] Default microphone"
    assert labels[1] == "[Me] USB headset mic  (microphone)"
    assert labels[2].startswith("[Meeting] alsa_output") and "meeting audio" in labels[2]
    assert [c.key() for c in panel.selected_sources()] == ["device:"]  # the default input
    panel.add_file(str(tmp_path / "lecture.wav"))
    panel.source_list.item(2).setCheckState(Qt.CheckState.Checked)
    panel.source_list.item(0).setCheckState(Qt.CheckState.Unchecked)
    seen = []
    panel.start_requested.connect(seen.append)
    panel.start_button.click()
    (config,) = seen
    assert isinstance(config, RunConfig)
    assert [(c.kind, c.stream, c.device) for c in config.sources] == [
        ("device", "Meeting", "pulse:alsa_output.pci.analog-stereo.monitor"), ("file", "lecture", None)]
    assert config.sources[1].path.endswith("lecture.wav")


def test_refresh_keeps_selection_and_files(qtbot, tmp_path):
    panel = ControlPanel()
    qtbot.addWidget(panel)
    panel.set_devices(DEVICES)
    choice = panel.add_file(str(tmp_path / "a.wav"))
    panel.select_only(["device:3", choice.key()])
    panel.set_devices(DEVICES)
    assert sorted(c.key() for c in panel.selected_sources()) == sorted(["device:3", choice.key()])


def test_english_only_model_disables_language_and_translate(qtbot):
    panel = ControlPanel()
    qtbot.addWidget(panel)
    panel.set_model("tiny.en")
    assert not panel.language_combo.isEnabled() and not panel.translate_check.isEnabled()
    assert panel.run_config().language == "en" and panel.run_config().translate is False
    panel.set_model("base")
    panel.set_language("fr")
    panel.translate_check.setChecked(True)
    config = panel.run_config()
    assert (config.model, config.language, config.translate) == ("base", "fr", True)


def test_model_folder_entry(qtbot, tmp_path):
    panel = ControlPanel()
    qtbot.addWidget(panel)
    panel.set_model(str(tmp_path))
    assert panel.model() == str(tmp_path)
    assert panel.model_combo.currentText() == tmp_path.name
    assert panel.model_combo.itemText(panel.model_combo.count() - 1) == "Folder…"


def test_running_locks_the_choices(qtbot):
    panel = ControlPanel()
    qtbot.addWidget(panel)
    stops = []
    panel.stop_requested.connect(lambda: stops.append(1))
    panel.set_running(True)
    assert panel.start_button.text() == "Stop" and not panel.source_list.isEnabled()
    panel.start_button.click()
    assert stops == [1]
    panel.set_running(False)
    assert panel.start_button.text() == "Start" and panel.source_list.isEnabled()
