"""Controls: sources (microphones, meeting/system audio monitors, files; several at once), model,
language, translate, policy, speaker labels, server, start/stop, clear.

The panel knows devices only as values handed to it (``index``, ``name``, ``is_monitor``), so the
UI never touches the audio library; the app lists the devices and turns a :class:`RunConfig`
into a running pipeline. The request types live in :mod:`captioner.ui.run_config` (plain
Python, so the app can read them without Qt) and are importable from here too.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from captioner.ui.run_config import (
    LANGUAGES,
    POLICIES,
    SPEAKER_MODES,
    RunConfig,
    SourceChoice,
)
from captioner.ui.source_list import SourceGroup, SourceList

BUILTIN_MODELS = ("tiny.en", "base")
ENGLISH_ONLY_SUFFIX = ".en"
AUDIO_FILE_FILTER = "Audio (*.wav *.flac *.ogg *.mp3 *.m4a *.opus);;All files (*)"
_FOLDER_ITEM = "Folder…"


DEFAULT_INPUT = SourceChoice("device", "Me", "Default microphone", device=None)
DEMO_STREAM = "Demo"
MICROPHONES = "Microphones"
MEETING_AUDIO = "Meeting audio (what this computer plays)"
FILES = "Files"


def stream_label_for(device: Any) -> str:
    return "Meeting" if getattr(device, "is_monitor", False) else "Me"


class ControlPanel(QWidget):
    """GUI thread only. Emits :attr:`start_requested` with a :class:`RunConfig`."""

    start_requested = Signal(object)
    stop_requested = Signal()
    clear_requested = Signal()
    refresh_requested = Signal()

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self._running = False

        self._listed = False  # a device listing has arrived
        self._has_inputs = False
        self._wanted: set[str] = set()
        self._missing: list[str] = []
        sources_box = QGroupBox("Sources")
        self.source_list = SourceList()
        self.source_list.setMinimumHeight(120)
        self.source_list.add_note("Looking for audio inputs…")
        self.add_file_button = QPushButton("Add file…")
        self.refresh_button = QPushButton("Refresh")
        self.add_file_button.clicked.connect(self._pick_file)
        self.refresh_button.clicked.connect(self.refresh_requested)
        buttons = QHBoxLayout()
        buttons.addWidget(self.add_file_button)
        buttons.addWidget(self.refresh_button)
        box_layout = QVBoxLayout(sources_box)
        box_layout.addWidget(self.source_list)
        box_layout.addLayout(buttons)

        model_box = QGroupBox("Model")
        self.model_combo = QComboBox()
        self.model_combo.setObjectName("modelCombo")
        for name in BUILTIN_MODELS:
            self.model_combo.addItem(name, name)
        self.model_combo.addItem(_FOLDER_ITEM, None)
        self.model_combo.activated.connect(self._on_model_activated)
        self.language_combo = QComboBox()
        for code, name in LANGUAGES:
            self.language_combo.addItem(f"{name} ({code})" if code != "auto" else name, code)
        self.translate_check = QCheckBox("Translate to English")
        self.policy_combo = _choice_combo(
            "policyCombo", POLICIES,
            "When a word is final: LocalAgreement (two updates agree on it), AlignAtt (the model's attention "
            "says it was heard whole; sooner), or Automatic (the one measured better on this device)")
        self.speakers_combo = _choice_combo(
            "speakersCombo", SPEAKER_MODES,
            "Who said what: label the speakers (\"Speaker 1\", \"Speaker 2\", … — click a name in the captions, "
            "or press F2, to rename them) of a meeting's audio and files, of every source (a microphone too), "
            "or of none")
        # A `captioner serve` box to caption on instead of this machine (its model is the server's).
        self.server_edit = QLineEdit()
        self.server_edit.setObjectName("serverEdit")
        self.server_edit.setPlaceholderText("this computer")
        self.server_edit.setToolTip("Caption on a captioner server: ws://HOST:8765 (empty: on this computer)")
        self.server_edit.setClearButtonEnabled(True)
        form = QFormLayout(model_box)
        form.addRow("Model", self.model_combo)
        form.addRow("Language", self.language_combo)
        form.addRow("", self.translate_check)
        form.addRow("Policy", self.policy_combo)
        form.addRow("Speakers", self.speakers_combo)
        form.addRow("Server", self.server_edit)
        self.model_combo.currentIndexChanged.connect(self._update_language_enabled)

        self.start_button = QPushButton("Start")
        self.start_button.setObjectName("startButton")
        self.start_button.setMinimumHeight(36)
        self.start_button.clicked.connect(self._on_start_stop)
        self.clear_button = QPushButton("Clear")
        self.clear_button.clicked.connect(self.clear_requested)
        run_row = QHBoxLayout()
        run_row.addWidget(self.start_button, 2)
        run_row.addWidget(self.clear_button, 1)

        layout = QVBoxLayout(self)
        layout.addWidget(sources_box, 1)
        layout.addWidget(model_box)
        layout.addLayout(run_row)
        self._update_language_enabled()

    # -- sources ---------------------------------------------------------------------------

    def want_sources(self, keys: Iterable[str]) -> None:
        """The sources to tick once the devices are listed (the remembered choice); those that
        are not there then are simply not ticked."""
        self._wanted = set(keys)

    @property
    def has_inputs(self) -> bool:
        """Whether the last device listing found any input (a microphone or a meeting's audio)."""
        return self._has_inputs

    def set_devices(self, devices: Iterable[Any], checked_keys: Iterable[str] | None = None) -> None:
        """Lists the inputs, grouped: the default input and every microphone, every monitor of an
        output ("meeting audio"), then the files added. The default input is offered only when
        some input exists. Ticked afterwards: ``checked_keys`` if given, else what was ticked (or,
        on the first listing, what :meth:`want_sources` asked for) where it is still listed;
        when that leaves nothing ticked, the default input.

        ``devices``: values with ``name``, ``is_monitor`` and ``open_as`` (or ``index``), such as
        ``captioner.audio.devices.InputDevice``."""
        devices = list(devices)
        if checked_keys is not None:
            previous = set(checked_keys)
        elif self._listed:
            previous = {c.key() for c in self.selected_sources()}
        else:
            previous = set(self._wanted)
        files = [c for c in self.source_list.choices() if c.kind == "file"]
        listed = {c.key() for c in files}
        for key in sorted(previous - listed):
            path = key[len("file:"):] if key.startswith("file:") else ""
            if path and Path(path).is_file():  # a remembered file that is gone is not offered
                files.append(_file_choice(path))
        microphones = [DEFAULT_INPUT] if devices else []
        monitors = []
        for device in devices:
            # ``open_as`` is what the audio layer opens (a PortAudio index, or "pulse:NAME").
            open_as = getattr(device, "open_as", getattr(device, "index", None))
            choice = SourceChoice("device", stream_label_for(device), str(device.name), device=open_as)
            (monitors if choice.stream == "Meeting" else microphones).append(choice)
        self.source_list.show_groups([
            SourceGroup(MICROPHONES, tuple(microphones), "None found: plug one in, then press Refresh."),
            SourceGroup(MEETING_AUDIO, tuple(monitors), "None found (a monitor of an output needs PulseAudio or "
                                                        "PipeWire)."),
            SourceGroup(FILES, tuple(files)),
        ], previous)
        first = not self._listed and checked_keys is None
        self._listed = True
        self._has_inputs = bool(devices)
        if first:  # the remembered sources that are not here now (a headset unplugged)
            self._missing = sorted(previous - {c.key() for c in self.selected_sources()})
        if not self.selected_sources() and devices:
            self.source_list.set_checked([DEFAULT_INPUT.key()])

    def take_missing_sources(self) -> list[str]:
        """The keys of the remembered sources the first listing did not find (once)."""
        missing, self._missing = self._missing, []
        return missing

    def add_file(self, path: str, checked: bool = True) -> SourceChoice:
        choice = _file_choice(path)
        self.source_list.add_choice(choice, checked, group_title=FILES)
        return choice

    def add_demo(self, path: str, title: str) -> SourceChoice:
        """Adds (ticked) the bundled sample ``path``, named ``title``, as the demo source."""
        choice = SourceChoice("file", DEMO_STREAM, f"Demo: {title}", path=path, demo=True)
        if all(c.key() != choice.key() for c in self.source_list.choices()):
            self.source_list.add_choice(choice, True, group_title=FILES)
        return choice

    def select_only(self, keys: Iterable[str]) -> None:
        self.source_list.set_checked(keys)

    def selected_sources(self) -> list[SourceChoice]:
        return self.source_list.checked()

    def remembered_sources(self) -> list[str]:
        """The keys to remember of the ticked sources: the demo is never the user's choice."""
        return [c.key() for c in self.selected_sources() if not c.demo]

    def _pick_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Caption an audio file", "", AUDIO_FILE_FILTER)
        if path:
            self.add_file(path)

    # -- model -----------------------------------------------------------------------------

    def model(self) -> str:
        return self.model_combo.currentData() or "tiny.en"

    def set_model(self, name_or_path: str) -> None:
        index = self.model_combo.findData(name_or_path)
        if index < 0:
            index = self.model_combo.count() - 1  # before "Folder…"
            self.model_combo.insertItem(index, Path(name_or_path).name or name_or_path, name_or_path)
            self.model_combo.setItemData(index, name_or_path, Qt.ItemDataRole.ToolTipRole)
        self.model_combo.setCurrentIndex(index)

    def _on_model_activated(self, index: int) -> None:
        if self.model_combo.itemData(index) is not None:
            return
        folder = QFileDialog.getExistingDirectory(self, "A CTranslate2 Whisper model folder")
        if folder:
            self.set_model(folder)
        else:
            self.model_combo.setCurrentIndex(0)

    def _update_language_enabled(self) -> None:
        english_only = self.model().endswith(ENGLISH_ONLY_SUFFIX)
        self.language_combo.setEnabled(not english_only)
        self.translate_check.setEnabled(not english_only)
        tip = "This model knows English only." if english_only else ""
        self.language_combo.setToolTip(tip)
        self.translate_check.setToolTip(tip)

    def language(self) -> str:
        return self.language_combo.currentData() if self.language_combo.isEnabled() else "en"

    def set_language(self, code: str) -> None:
        index = self.language_combo.findData(code)
        self.language_combo.setCurrentIndex(max(0, index))

    def translate(self) -> bool:
        return self.translate_check.isEnabled() and self.translate_check.isChecked()

    def policy(self) -> str:
        return self.policy_combo.currentData() or "auto"

    def set_policy(self, name: str) -> None:
        """Select policy ``name``; an unknown one (a hand-edited settings file) selects auto."""
        self.policy_combo.setCurrentIndex(max(0, self.policy_combo.findData(name)))

    def speakers(self) -> str:
        return self.speakers_combo.currentData() or "auto"

    def set_speakers(self, mode: str) -> None:
        """Select speaker labels ``mode`` (auto, on, off); an unknown one selects auto."""
        self.speakers_combo.setCurrentIndex(max(0, self.speakers_combo.findData(mode)))

    def server(self) -> str:
        return self.server_edit.text().strip()

    def set_server(self, url: str) -> None:
        self.server_edit.setText(url.strip())

    # -- run -------------------------------------------------------------------------------

    def run_config(self) -> RunConfig:
        return RunConfig(
            sources=tuple(self.selected_sources()),
            model=self.model(),
            language=self.language(),
            translate=self.translate(),
            server=self.server(),
            policy=self.policy(),
            speakers=self.speakers(),
        )

    @property
    def running(self) -> bool:
        return self._running

    def set_running(self, running: bool) -> None:
        self._running = running
        self.start_button.setText("Stop" if running else "Start")
        for widget in (self.source_list, self.add_file_button, self.refresh_button, self.model_combo,
                       self.language_combo, self.translate_check, self.server_edit, self.policy_combo,
                       self.speakers_combo):
            widget.setEnabled(not running)
        if not running:
            self._update_language_enabled()

    def _on_start_stop(self) -> None:
        if self._running:
            self.stop_requested.emit()
        else:
            self.start_requested.emit(self.run_config())

    def toggle(self) -> None:
        self._on_start_stop()


def _file_choice(path: str) -> SourceChoice:
    # Captions are labelled with the stem; the list names the file once, in full.
    stem = Path(path).stem or "file"
    return SourceChoice("file", stem, os.path.basename(path) or path, path=path)


def _choice_combo(object_name: str, choices, tooltip: str) -> QComboBox:
    """A box of ``(code, name)`` choices: shows the names, keeps the codes as item data."""
    combo = QComboBox()
    combo.setObjectName(object_name)
    for code, name in choices:
        combo.addItem(name, code)
    combo.setToolTip(tooltip)
    return combo
