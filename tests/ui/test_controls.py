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
    assert panel.source_list.texts() == [
        "Microphones", "Default microphone", "USB headset mic",
        "Meeting audio (what this computer plays)", "alsa_output.pci.analog-stereo.monitor",
    ]
    assert [c.key() for c in panel.selected_sources()] == ["device:"]  # the default input
    lecture = tmp_path / "lecture.wav"
    panel.add_file(str(lecture))
    assert panel.source_list.texts()[-2:] == ["Files", "lecture.wav"]  # named once, by its file name
    panel.select_only(["device:pulse:alsa_output.pci.analog-stereo.monitor", f"file:{lecture}"])
    seen = []
    panel.start_requested.connect(seen.append)
    panel.start_button.click()
    (config,) = seen
    assert isinstance(config, RunConfig)
    assert [(c.kind, c.stream, c.device) for c in config.sources] == [
        ("device", "Meeting", "pulse:alsa_output.pci.analog-stereo.monitor"), ("file", "lecture", None)]
    assert config.sources[1].path.endswith("lecture.wav")


def test_group_headers_and_notes_cannot_be_ticked(qtbot):
    panel = ControlPanel()
    qtbot.addWidget(panel)
    panel.set_devices([])
    for i in range(panel.source_list.count()):
        flags = panel.source_list.item(i).flags()
        assert not flags & Qt.ItemFlag.ItemIsUserCheckable
    assert panel.source_list.choices() == []


def test_no_device_offers_no_default_and_ticks_nothing(qtbot):
    """Without any input there is no "Default microphone" to tick: the list says none was found."""
    panel = ControlPanel()
    qtbot.addWidget(panel)
    panel.want_sources(["device:"])  # remembered from a machine that had one
    panel.set_devices([])
    texts = panel.source_list.texts()
    assert "Default microphone" not in texts
    assert texts[:2] == ["Microphones", "None found: plug one in, then press Refresh."]
    assert "None found" in texts[3]  # no meeting audio either
    assert panel.selected_sources() == [] and not panel.has_inputs


def test_remembered_sources_that_are_gone_are_not_ticked(qtbot, tmp_path):
    present, gone = tmp_path / "present.wav", tmp_path / "gone.wav"
    present.write_bytes(b"")
    panel = ControlPanel()
    qtbot.addWidget(panel)
    panel.want_sources(["device:7", f"file:{gone}", f"file:{present}"])
    panel.set_devices(DEVICES)
    # The file still there is listed and ticked; the device and the file that are gone are not.
    assert [c.key() for c in panel.selected_sources()] == [f"file:{present}"]
    assert "gone.wav" not in panel.source_list.texts()
    # Nothing remembered exists: the default input (there is one) is ticked instead.
    other = ControlPanel()
    qtbot.addWidget(other)
    other.want_sources(["device:7"])
    other.set_devices(DEVICES)
    assert [c.key() for c in other.selected_sources()] == ["device:"]


def test_the_demo_is_never_remembered(qtbot, tmp_path):
    panel = ControlPanel()
    qtbot.addWidget(panel)
    panel.set_devices([])
    demo = panel.add_demo(str(tmp_path / "sample.flac"), "A sample")
    assert demo.demo and demo.stream == "Demo"
    assert panel.source_list.texts()[-2:] == ["Files", "Demo: A sample"]
    assert panel.selected_sources() == [demo] and panel.remembered_sources() == []


def test_long_names_wrap_without_a_sideways_scroll_bar(qtbot, tmp_path):
    panel = ControlPanel()
    qtbot.addWidget(panel)
    panel.resize(260, 500)
    panel.show()
    qtbot.waitExposed(panel)
    name = "en_ami_ES2011a_hs0_40-46s_a_long_recording_name_without_spaces.wav"
    panel.set_devices([])
    panel.add_file(str(tmp_path / name))
    source_list = panel.source_list
    assert source_list.horizontalScrollBarPolicy() == Qt.ScrollBarPolicy.ScrollBarAlwaysOff
    assert source_list.wordWrap()
    item = source_list.item(source_list.count() - 1)
    assert item.text() == name  # in full: not elided, not "[stem] name"
    rect = source_list.visualItemRect(item)
    assert rect.right() <= source_list.viewport().width()  # wrapped within the panel's width
    assert rect.height() > source_list.fontMetrics().height() * 1.5  # on more than one line


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
