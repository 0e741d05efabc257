"""The main window: captions in the middle under a banner, controls and history on the left, the
performance dashboard below, an optional overlay, status bar with provider, model, streams and
the captions' language.

Nothing a session reports opens a dialog: the banner at the top (:mod:`captioner.ui.banner`)
says it in the window, from a demo running because there is no microphone to a failed start or a
lost input, and the model's preparation shows as a progress bar in the status bar.

The window pulls: a ~30 Hz QTimer drains the engine's outboxes through a *feed* (anything with
``drain_captions()``, ``latest_status()`` and ``latest_telemetry()``), so no engine thread ever
touches a widget. Everything it shows is also kept as the run's record, which "Save trace…"
writes as a :mod:`captioner.trace` file and "Load trace…" opens again.

Sessions are run by the app's controller, which the window knows only by its requests (the
``start_requested``, ``stop_requested`` and ``refresh_devices_requested`` signals) and by what
it is told through :attr:`MainWindow.session`, a
:class:`~captioner.ui.session_view.SessionView` whose calls reach the ``show_*`` slots below on
the GUI thread.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QFileDialog,
    QLabel,
    QMainWindow,
    QProgressBar,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from captioner.errors import UserError
from captioner.events import CaptionUpdate, PipelineStatus, TelemetrySample
from captioner.trace import load_trace, save_trace
from captioner.ui.banner import Banner
from captioner.ui.caption_view import DEFAULT_FONT_PT, SEPARATOR, CaptionView
from captioner.ui.collector import GuiThreadCollector
from captioner.ui.controls import AUDIO_FILE_FILTER, DEFAULT_INPUT, ControlPanel
from captioner.ui.dashboard import Dashboard
from captioner.ui.history import HistoryPanel
from captioner.ui.notices import (
    demo_notice,
    engine_notice,
    failure_notice,
    fallback_notice,
    language_text,
)
from captioner.ui.overlay import CaptionOverlay
from captioner.ui.overlay_place import default_overlay_rect
from captioner.ui.run_config import RunConfig
from captioner.ui.session_bridge import SessionBridge
from captioner.ui.settings import (
    AppSettings,
    ChosenSettings,
    load_settings,
    save_settings,
)
from captioner.ui.theme import apply_theme, theme_named

PUMP_INTERVAL_MS = 33  # ~30 Hz: smooth enough for text, cheap enough for a laptop
MAX_RECORD_EVENTS = 1_000_000
TRACE_FILTER = "captioner traces (*.jsonl *.trace);;All files (*)"
TRACE_DOCK_SHARE = 0.75
PLACEHOLDER = "Captions appear here. Pick a source and press Start (F5)."
LISTENING_PLACEHOLDER = "Listening… captions appear here as the words are heard."
"""While a session runs and nothing was said yet: not "press Start", which it already is."""
OVERLAY_IDLE_S = 10.0
"""The overlay hides once nothing new was said for this long: over a meeting, old captions only
hide what is behind them (a subtitle's cue lasts at most 7 s)."""
FALLBACK_TEXT = {"server": "this computer", "model": "the default model, tiny.en"}
"""What a saved setting that failed at start falls back to, in the banner's words."""


class Feed(Protocol):
    def drain_captions(self) -> list[CaptionUpdate]: ...
    def latest_status(self) -> PipelineStatus | None: ...
    def latest_telemetry(self) -> TelemetrySample | None: ...
    # Optional: def drain_notices(self) -> list[str] (language notices, each once)


class MainWindow(QMainWindow):
    """GUI thread only, except :attr:`session`, which any thread may call."""

    start_requested = Signal(object)  # RunConfig
    stop_requested = Signal()
    speaker_renamed = Signal(str, str, str)  # stream, speaker ("Speaker 2"), the name given
    refresh_devices_requested = Signal()
    closing = Signal()

    def __init__(self, settings_store: QSettings | None = None, parent=None) -> None:
        super().__init__(parent)
        # No thread but this one may destroy a Qt object: garbage is collected here (collector.py).
        self.collector = GuiThreadCollector(self)
        self.setWindowTitle("captioner")
        self.setObjectName("mainWindow")
        self._store = settings_store
        self.settings = load_settings(settings_store) if settings_store is not None else AppSettings()
        self.chosen = ChosenSettings(self.settings)  # what is saved: the user's choices in the app
        self._first_start = True  # the launch's own start is still to come (see show_session_failed)
        self._overlay_placed = self.settings.overlay_placed  # the user dragged it: it stays there
        self._last_caption_s = float("-inf")
        self.theme = theme_named(self.settings.theme)
        self._feed: Feed | None = None
        self._last_status: PipelineStatus | None = None
        self._last_sample: TelemetrySample | None = None
        self.record: list[Any] = []
        self.remember_sources = True  # False for one-off command-line sources (`--file`)
        self.record_meta: dict[str, Any] = {}
        self._requested: RunConfig | None = None  # the run asked for last
        self._start_after_stop: RunConfig | None = None
        self._devices_error: str | None = None
        self._engine_message = ""
        self._finishing = False  # the session stopping is one whose files all played to the end
        self._languages: dict[str, str] = {}
        self.session = SessionBridge(self, parent=self)  # hand this to the controller
        self.start_requested.connect(self._note_request)

        self.banner = Banner(self.theme)
        self.caption_view = CaptionView(self.theme, self.settings.font_pt)
        self.caption_view.setPlaceholderText(PLACEHOLDER)
        central = QWidget()
        central_layout = QVBoxLayout(central)
        central_layout.setContentsMargins(6, 6, 0, 0)
        central_layout.setSpacing(6)
        central_layout.addWidget(self.banner)
        central_layout.addWidget(self.caption_view, 1)
        self.setCentralWidget(central)

        self.controls = ControlPanel()
        self.controls.start_requested.connect(self.start_requested)
        self.controls.stop_requested.connect(self.stop_requested)
        self.controls.refresh_requested.connect(self.refresh_devices_requested)
        self.controls.clear_requested.connect(self.clear_captions)
        self.history = HistoryPanel()
        self.history.speaker_name = self.caption_view.speaker_name  # a renamed speaker, by name
        self.history.exported.connect(lambda path: self.statusBar().showMessage(f"Exported {path}", 5000))
        self.side_tabs = QTabWidget()
        self.side_tabs.addTab(self.controls, "Captioning")
        self.side_tabs.addTab(self.history, "History")
        left = QDockWidget("Controls", self)
        left.setObjectName("controlsDock")
        left.setWidget(self.side_tabs)
        left.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable | QDockWidget.DockWidgetFeature.DockWidgetFloatable)
        self.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, left)
        # The controls run the full height: the source list has room for every group.
        self.setCorner(Qt.Corner.BottomLeftCorner, Qt.DockWidgetArea.LeftDockWidgetArea)

        self.dashboard = Dashboard(self.theme)
        self.dashboard_dock = QDockWidget("Performance", self)
        self.dashboard_dock.setObjectName("dashboardDock")
        self.dashboard_dock.setWidget(self.dashboard)
        self.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, self.dashboard_dock)

        self.overlay = CaptionOverlay(self.settings.overlay_font_pt, self.settings.overlay_lines)

        self.provider_label = QLabel("Provider: –")
        self.model_label = QLabel("Model: –")
        self.streams_label = QLabel("Streams: 0")
        self.language_label = QLabel("")
        self.state_label = QLabel("Stopped")
        self.progress_bar = QProgressBar()
        self.progress_bar.setObjectName("modelProgress")
        self.progress_bar.setMaximumWidth(160)
        self.progress_bar.setMaximumHeight(16)
        self.progress_bar.setVisible(False)
        # All permanent: a temporary message (showMessage) then has the left part to itself
        # instead of being drawn over a normal widget.
        for label in (self.progress_bar, self.state_label, self.provider_label, self.model_label,
                      self.streams_label, self.language_label):
            self.statusBar().addPermanentWidget(label)
        self.caption_view.following_changed.connect(self._on_following_changed)
        self.caption_view.speaker_renamed.connect(self._on_speaker_renamed)

        self._build_actions()
        self._apply_settings()

        self.timer = QTimer(self)
        self.timer.setInterval(PUMP_INTERVAL_MS)
        self.timer.timeout.connect(self.pump)
        self.timer.start()

    # -- actions ---------------------------------------------------------------------------

    def _action(self, menu, text: str, slot, shortcut=None, checkable: bool = False) -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
            # Application-wide, so the overlay shortcut works while the overlay has the focus.
            action.setShortcutContext(Qt.ShortcutContext.ApplicationShortcut)
        action.setCheckable(checkable)
        action.triggered.connect(slot)
        menu.addAction(action)
        self.addAction(action)
        return action

    def _build_actions(self) -> None:
        bar = self.menuBar()
        file_menu = bar.addMenu("&File")
        self.load_trace_action = self._action(file_menu, "Load trace…", self.load_trace_dialog, "Ctrl+T")
        self.compare_trace_action = self._action(file_menu, "Compare with trace…", self.compare_trace_dialog)
        self.save_trace_action = self._action(file_menu, "Save trace…", self.save_trace_dialog, "Ctrl+Shift+S")
        file_menu.addSeparator()
        for fmt in ("txt", "srt", "vtt"):
            self._action(file_menu, f"Export {fmt.upper()}…", lambda _=False, f=fmt: self.history.export_dialog(f))
        file_menu.addSeparator()
        self._action(file_menu, "Quit", self.close, QKeySequence.StandardKey.Quit)

        run_menu = bar.addMenu("&Captions")
        self.start_stop_action = self._action(run_menu, "Start / stop", self.controls.toggle, "F5")
        self._action(run_menu, "Clear", self.clear_captions, "Ctrl+L")
        self._action(run_menu, "Search history", self._focus_search, QKeySequence.StandardKey.Find)
        self.rename_action = self._action(run_menu, "Rename speaker…", self.rename_speaker, "F2")

        view_menu = bar.addMenu("&View")
        self.overlay_action = self._action(view_menu, "Overlay", self.set_overlay_visible, "Ctrl+Shift+O", True)
        self.dashboard_action = self.dashboard_dock.toggleViewAction()
        self.dashboard_action.setShortcut(QKeySequence("Ctrl+D"))
        view_menu.addAction(self.dashboard_action)
        self.dark_action = self._action(view_menu, "Dark theme", self._on_dark_toggled, None, True)
        view_menu.addSeparator()
        self._action(view_menu, "Larger text", lambda: self.change_font(+2), QKeySequence.StandardKey.ZoomIn)
        self._action(view_menu, "Larger text", lambda: self.change_font(+2), "Ctrl+=").setVisible(False)
        self._action(view_menu, "Smaller text", lambda: self.change_font(-2), QKeySequence.StandardKey.ZoomOut)
        self._action(view_menu, "Default text size", lambda: self.set_font_pt(DEFAULT_FONT_PT), "Ctrl+0")
        self._action(view_menu, "Follow live captions", self.caption_view.scroll_to_live, "End")

    def _apply_settings(self) -> None:
        s = self.settings
        self.dark_action.setChecked(s.theme == "dark")
        self.set_theme(s.theme)
        self.controls.set_model(s.model)
        self.controls.set_language(s.language)
        self.controls.translate_check.setChecked(s.translate)
        self.controls.set_policy(s.policy)
        self.controls.set_speakers(s.speakers)
        self.controls.set_server(s.server)
        self.controls.want_sources(s.sources)  # ticked once the device listing shows they exist
        if s.window_geometry:
            self.restoreGeometry(QByteArray(s.window_geometry))
        else:
            self.resize(1500, 1000)
        if s.window_state:
            self.restoreState(QByteArray(s.window_state))
        self.dashboard_dock.setVisible(s.dashboard_visible)
        if s.overlay_geometry:
            self.overlay.restoreGeometry(QByteArray(s.overlay_geometry))
            if not self._overlay_placed or self.overlay.screen() is None:
                self._overlay_placed = False  # its size is kept; where it goes is worked out at show
        self.overlay.moved_by_user.connect(self._on_overlay_dragged)
        self.overlay_action.setChecked(s.overlay_visible)

    def collect_settings(self) -> AppSettings:
        s = self.settings
        s.theme = self.theme.name
        s.font_pt = self.caption_view.font_pt
        s.overlay_visible = self.overlay_action.isChecked()
        s.model = self.controls.model()
        s.language = self.controls.language_combo.currentData()
        s.translate = self.controls.translate_check.isChecked()
        s.policy = self.controls.policy()
        s.speakers = self.controls.speakers()
        s.server = self.controls.server()
        if self.remember_sources:
            s.sources = self.controls.remembered_sources()
        s.dashboard_visible = not self.dashboard_dock.isHidden()
        s.window_geometry = bytes(self.saveGeometry().data())
        s.window_state = bytes(self.saveState().data())
        s.overlay_geometry = bytes(self.overlay.saveGeometry().data())
        s.overlay_placed = self._overlay_placed
        return s

    def save_settings(self) -> None:
        if self._store is not None:
            save_settings(self._store, self.chosen.to_save(self.collect_settings()))

    def apply_command_line(self, **values: Any) -> None:
        """Options given on the command line (``model``, ``language``, ``policy``, ``speakers``,
        ``server``, ``theme``, ``overlay_visible``; ``None``: not given): shown and used for this
        run, not saved (:class:`~captioner.ui.settings.ChosenSettings`)."""
        setters = {"model": self.controls.set_model, "language": self.controls.set_language,
                   "policy": self.controls.set_policy, "speakers": self.controls.set_speakers,
                   "server": self.controls.set_server,
                   "theme": self._set_theme_checked, "overlay_visible": self.set_overlay_visible}
        for name, value in values.items():
            if value is None:
                continue
            setters[name](value)
            self.chosen.run_only(name, getattr(self.collect_settings(), name))

    def _set_theme_checked(self, name: str) -> None:
        self.dark_action.setChecked(name == "dark")
        self.set_theme(name)

    def showEvent(self, event) -> None:  # noqa: N802 (Qt name)
        super().showEvent(event)
        if self.overlay_action.isChecked():
            self.set_overlay_visible(True)

    def closeEvent(self, event) -> None:  # noqa: N802
        self.save_settings()
        self.timer.stop()
        self.closing.emit()
        self.overlay.close()
        super().closeEvent(event)

    # -- appearance ------------------------------------------------------------------------

    def set_theme(self, name: str) -> None:
        self.theme = theme_named(name)
        app = QApplication.instance()
        if app is not None:
            apply_theme(app, self.theme)
        self.caption_view.set_theme(self.theme)
        self.dashboard.set_theme(self.theme)
        self.banner.set_theme(self.theme)

    def _on_dark_toggled(self, checked: bool) -> None:
        self.set_theme("dark" if checked else "light")

    def set_font_pt(self, pt: int) -> None:
        self.caption_view.set_font_pt(pt)
        self.statusBar().showMessage(f"Text size {self.caption_view.font_pt} pt", 2000)

    def change_font(self, delta_pt: int) -> None:
        self.set_font_pt(self.caption_view.font_pt + delta_pt)

    def set_overlay_visible(self, visible: bool) -> None:
        """Turns the overlay on or off. On, it shows only while there is a caption to show."""
        self.overlay_action.setChecked(bool(visible))
        if visible:
            self._update_overlay()
        else:
            self.overlay.hide()

    def _show_overlay(self, show: bool) -> None:
        if not show:
            self.overlay.hide()
            return
        if not self.overlay.isVisible():
            if not self._overlay_placed:
                self.place_overlay()
            self.overlay.show()
            self.overlay.raise_()

    def place_overlay(self) -> None:
        """The overlay's default place: the bottom edge of this window's screen, off the window."""
        screen = self.screen()
        if screen is None:
            return
        self.overlay.setGeometry(default_overlay_rect(screen.availableGeometry(), self.frameGeometry(),
                                                      self.overlay.size(), self.overlay.minimumWidth()))

    def _on_overlay_dragged(self) -> None:
        self._overlay_placed = True

    def _on_speaker_renamed(self, session: int, stream: str, speaker: str, name: str) -> None:
        """A speaker was named in the caption view: the overlay says it too, and for a speaker of
        this session (not of one before it, whose transcript is closed) the controller,
        connected to :attr:`speaker_renamed`, has the transcript say it."""
        if self.overlay_action.isChecked() and self.overlay.isVisible():
            self._update_overlay()
        self.history.refresh_names()
        self.statusBar().showMessage(f"{speaker} of {stream} is now {name}" if name != speaker
                                     else f"{stream}: {speaker} has its label back", 5000)
        if session == self.caption_view.session:
            self.speaker_renamed.emit(stream, speaker, name)

    def rename_speaker(self) -> None:
        """The keyboard's way to rename (F2): the editor opens over the last speaker heard; Up and
        Down in it reach the others."""
        self.raise_()
        self.activateWindow()
        if not self.caption_view.rename_last_speaker():
            self.statusBar().showMessage("No speaker to rename yet: labels come with a meeting's audio or a file "
                                         "(Speakers: auto or on)", 5000)

    def _focus_search(self) -> None:
        self.side_tabs.setCurrentWidget(self.history)
        self.history.search_edit.setFocus()

    def _on_following_changed(self, following: bool) -> None:
        if following:
            self.statusBar().clearMessage()
        else:
            self.statusBar().showMessage("Scrolled back: auto-scroll paused (End follows the live captions)")

    # -- engine side -----------------------------------------------------------------------

    def set_feed(self, feed: Feed | None) -> None:
        self._feed = feed

    def set_running(self, running: bool, message: str = "") -> None:
        self.controls.set_running(running)
        self.state_label.setText(message or ("Captioning" if running else "Stopped"))

    # -- session (slots of self.session: GUI thread, in the order the controller called) ---------

    def show_devices(self, devices: Sequence[Any], error: str | None) -> None:
        self._devices_error = error
        if error:
            self.statusBar().showMessage(error, 10000)
        self.controls.set_devices(devices)
        missing = self.controls.take_missing_sources()
        if missing and self.controls.selected_sources() and self.remember_sources:
            # A remembered input that is not here now: this run takes what is ticked instead,
            # and the saved choice stays for when it is plugged in again (unless reset).
            self.chosen.run_only("sources", self.controls.remembered_sources())
            names = ", ".join(key.split(":", 1)[1] or "the default input" for key in missing)
            self.banner.show_message(
                fallback_notice("source", names, "not found among the audio inputs now",
                                ", ".join(c.label for c in self.controls.selected_sources())),
                "warning", kind="fallback",
                actions=(("Reset it (forget the saved sources)", lambda: self.forget_setting("sources")),))
        if self.banner.kind == "demo" and self.controls.has_inputs:
            # The demo's "Refresh" found something: offer it in one click.
            self.banner.show_message("Found an audio input (listed in Sources).", "info", kind="inputs",
                                     actions=(("Caption the default input", self.caption_default_input),))

    def show_session_starting(self, model: str) -> None:
        # Speakers are numbered afresh by each session's engine: a name given now is this one's.
        self.caption_view.begin_session()
        self.set_running(True, f"Preparing {model}…")
        self.controls.start_button.setEnabled(False)  # no stop until the model is up
        # In the status bar, not a dialog: the window stays readable and usable meanwhile.
        self.progress_bar.setRange(0, 0)  # busy until a fraction is known
        self.progress_bar.setVisible(True)
        self.progress_bar.setToolTip(f"Preparing the model {model} (the first launch builds it: a minute or two)")
        self.caption_view.setPlaceholderText(f"Preparing the model {model}… captions appear here in a few seconds.")
        self._languages.clear()
        self._show_languages()

    def show_session_progress(self, message: str, fraction: float) -> None:
        self.state_label.setText(f"{message} ({100 * fraction:.0f}%)")
        self.progress_bar.setRange(0, 100)
        self.progress_bar.setValue(int(100 * max(0.0, min(1.0, fraction))))

    def show_session_started(self, transcript_path: str | None, meta: Mapping[str, Any]) -> None:
        self._end_progress()
        self._first_start = False
        self.controls.start_button.setEnabled(True)
        self.history.set_transcript_path(transcript_path)
        self.set_running(True)
        self.caption_view.setPlaceholderText(LISTENING_PLACEHOLDER)
        self.record_meta.update(meta)
        self.banner.clear("error")
        self.banner.clear("language")  # about the session before; this one says its own
        if not self._running_demo():
            self.banner.clear("demo")  # the user's own audio now
            self.banner.clear("inputs")

    def show_session_failed(self, message: str, setting: str = "") -> None:
        self._end_progress()
        self.controls.start_button.setEnabled(True)
        first, self._first_start = self._first_start, False
        if first and self._falls_back(setting, message):
            return
        self.set_running(False, f"Error: {message}")
        self.banner.show_message(failure_notice(message, setting=setting), "error", kind="error")

    def _falls_back(self, setting: str, message: str) -> bool:
        """At launch, a saved ``setting`` (the server, the model) that failed: this run uses the
        default instead and starts again, under a banner that names the setting and offers to
        forget it; the saved value stays until the user changes the field or resets it."""
        config = self._requested
        if setting not in FALLBACK_TEXT or config is None or self.chosen.is_run_only(setting):
            return False
        saved, default = getattr(self.chosen.saved, setting), getattr(AppSettings(), setting)
        if getattr(config, setting) != saved or saved == default:
            return False  # not the saved value that failed
        {"server": self.controls.set_server, "model": self.controls.set_model}[setting](default)
        self.chosen.run_only(setting, default)
        self.banner.show_message(fallback_notice(setting, saved, message, FALLBACK_TEXT[setting]), "warning",
                                 kind="fallback", actions=((f"Reset it (forget the saved {setting})",
                                                            lambda: self.forget_setting(setting)),))
        self.start_requested.emit(self.controls.run_config())
        return True

    def forget_setting(self, name: str) -> None:
        """The user's "reset it": the saved ``name`` goes back to its default, on disk at once."""
        self.chosen.forget(name)
        if self._store is not None:
            save_settings(self._store, self.chosen.saved, names=(name,))
        self.banner.clear("fallback")
        self.statusBar().showMessage(f"The saved {name} was reset", 5000)

    def show_session_stopping(self, finished: bool) -> None:
        self._finishing = finished
        self.controls.start_button.setEnabled(False)
        self.state_label.setText("Finishing: committing the last words…" if finished else "Stopping…")

    def show_session_stopped(self, leftovers: Sequence[CaptionUpdate], status: PipelineStatus | None,
                             error: str | None) -> None:
        # The last committed words arrive while stopping: show them before saying "Stopped".
        self.apply_captions(list(leftovers))
        if status is not None:
            self.apply_status(status)
        self.controls.start_button.setEnabled(True)
        if error:
            state = f"Stopped: {error}"
        elif self._finishing:
            state = "Demo finished: Start (F5) plays it again" if self._running_demo() else "Finished: every file has played"
        else:
            state = "Stopped"
        self._finishing = False
        self.set_running(False, state)
        self.caption_view.setPlaceholderText(PLACEHOLDER)
        if error:
            self.banner.show_message(failure_notice(error), "error", kind="error")
        self.banner.clear("engine")  # its message was about the session that ended
        self._engine_message = ""
        follow_up, self._start_after_stop = self._start_after_stop, None
        if follow_up is not None:
            self.start_requested.emit(follow_up)

    def _end_progress(self) -> None:
        self.progress_bar.setVisible(False)
        self.caption_view.setPlaceholderText(PLACEHOLDER)

    def _note_request(self, config: RunConfig) -> None:
        self._requested = config

    def _running_demo(self) -> bool:
        config = self._requested
        return config is not None and any(c.demo for c in config.sources)

    # -- the first run: a demo when there is nothing to caption --------------------------------

    def use_demo(self, path: str, title: str) -> None:
        """Ticks the bundled sample ``path`` (called ``title``) as the source, and says in the
        banner that it is a demo and how to caption one's own audio instead."""
        self.controls.add_demo(path, title)
        self.banner.show_message(demo_notice(title, self._devices_error), "info", kind="demo", actions=(
            ("Add file…", self.caption_file_dialog),
            ("Refresh", self.refresh_devices_requested.emit),
        ))

    def caption_file_dialog(self) -> None:
        """Asks for an audio file and captions it instead of what runs now."""
        path, _ = QFileDialog.getOpenFileName(self, "Caption an audio file", "", AUDIO_FILE_FILTER)
        if path:
            self.caption_only(self.controls.add_file(path).key())

    def caption_only(self, key: str) -> None:
        """Captions the listed source ``key`` alone: ticks only it and starts (after stopping what
        runs now, if anything does)."""
        self.controls.select_only([key])
        config = self.controls.run_config()
        if self.controls.running:
            self._start_after_stop = config
            self.stop_requested.emit()
        else:
            self.start_requested.emit(config)

    def caption_default_input(self) -> None:
        """Captions the default input alone, when there is one."""
        if self.controls.has_inputs:
            self.caption_only(DEFAULT_INPUT.key())

    def pump(self) -> None:
        """Timer tick: drain the feed into the widgets; redraw the plots if anything changed."""
        feed = self._feed
        if feed is not None:
            now_s = time.monotonic()
            self.apply_captions(feed.drain_captions(), now_s)
            status = feed.latest_status()
            if status is not None and status is not self._last_status:
                self.apply_status(status)
            sample = feed.latest_telemetry()
            if sample is not None and sample is not self._last_sample:
                self.apply_telemetry(sample)
            drain_notices = getattr(feed, "drain_notices", None)
            for message in drain_notices() if drain_notices is not None else ():
                self.show_language_notice(message)
        if self.overlay.isVisible() and time.monotonic() - self._last_caption_s >= OVERLAY_IDLE_S:
            self.overlay.hide()
        self.dashboard.refresh()

    def _keep(self, event: Any) -> None:
        if len(self.record) < MAX_RECORD_EVENTS:
            self.record.append(event)

    def apply_captions(self, updates: list[CaptionUpdate], now_s: float | None = None) -> None:
        if not updates:
            return
        self.caption_view.apply_updates(updates)
        self.history.add_updates(updates, self.caption_view.session)
        self.dashboard.add_captions(updates, time.monotonic() if now_s is None else now_s)
        languages = dict(self._languages)
        for update in updates:
            self._keep(update)
            if update.language and update.text.strip():
                languages[update.stream] = update.language
        if languages != self._languages:
            self._languages = languages
            self._show_languages()
        self._last_caption_s = time.monotonic() if now_s is None else now_s
        if self.overlay_action.isChecked():
            self._update_overlay()

    def _show_languages(self) -> None:
        config = self._requested
        detected = config is not None and config.language in ("", "auto")
        self.language_label.setText(language_text(self._languages, detected))

    def _update_overlay(self) -> None:
        """The overlay's lines: those of the last cues and of the cues being spoken, as the
        caption view lays them out, each with whose it is: the speaker's name where the stream's
        speakers are labelled (as the view names them, renamed or not), with the stream's label
        where several streams speak ("Meeting · Anna"), the stream alone for an unlabelled one
        among several, nothing with one unlabelled stream."""
        view = self.caption_view
        open_streams = view.open_streams()
        several = len({c.stream for c in view.cues()[-20:]} | set(open_streams)) > 1
        lines, who = [], []
        for (session, stream, speaker), words in view.recent_lines(4):
            name = view.speaker_name(stream, speaker, session) if speaker else ""
            who.append(stream + SEPARATOR + name if several and name else name or (stream if several else ""))
            lines.append(words)
        self.overlay.set_lines(lines, who)
        idle = time.monotonic() - self._last_caption_s >= OVERLAY_IDLE_S
        self._show_overlay(self.overlay_action.isChecked() and bool(lines) and not idle)

    def apply_status(self, status: PipelineStatus) -> None:
        self._last_status = status
        self._keep(status)
        self.dashboard.add_status(status)
        gpu = "CUDA" in status.provider or status.provider.lower().startswith("cuda")
        self.provider_label.setText(f"Provider: {'GPU ' + status.device_name if gpu else 'CPU'}")
        self.provider_label.setToolTip(status.provider)
        self.model_label.setText(f"Model: {status.model}")
        self.streams_label.setText(f"Streams: {len(status.streams)}")
        self._show_engine_message(status.message)
        self.record_meta.setdefault("model", status.model)
        self.record_meta.setdefault("provider", status.provider)
        self.record_meta.setdefault("device", status.device_name)

    def show_language_notice(self, message: str) -> None:
        """A language notice ("this sounds like German; tiny.en is English-only — try --model
        base"): in the banner until dismissed or the next session starts, not only while the
        session that made it runs (a file may have ended by the time the check spoke)."""
        self.banner.show_message(engine_notice(message), "warning", kind="language")

    def _show_engine_message(self, message: str) -> None:
        # Statuses repeat a message several times a second: show it when it changes, so that a
        # message the user dismissed stays dismissed.
        if message == self._engine_message:
            return
        self._engine_message = message
        if message:
            self.banner.show_message(engine_notice(message), "warning", kind="engine")
        else:
            self.banner.clear("engine")

    def apply_telemetry(self, sample: TelemetrySample) -> None:
        self._last_sample = sample
        self._keep(sample)
        self.dashboard.add_telemetry(sample)
        if sample.gpu_name:
            self.record_meta.setdefault("gpu", sample.gpu_name)

    def clear_captions(self) -> None:
        self.caption_view.clear_captions()
        self.history.clear()
        self.overlay.set_lines([])
        self._show_overlay(False)

    # -- traces ----------------------------------------------------------------------------

    def open_trace(self, path: str | Path) -> None:
        """Shows a recorded run in the dashboard; raises UserError for a bad file."""
        trace = load_trace(path)
        self.dashboard.show_trace(trace, Path(path).name)
        self.dashboard_dock.show()
        # A recorded run is about its plots and captions, not the live view: give it the room.
        self.resizeDocks([self.dashboard_dock], [int(self.height() * TRACE_DOCK_SHARE)], Qt.Orientation.Vertical)
        self.statusBar().showMessage(
            f"Trace {Path(path).name}: {len(trace.telemetry)} telemetry samples, {len(trace.statuses)} statuses, "
            f"{len(trace.captions)} caption updates", 10000)

    def compare_trace(self, path: str | Path) -> None:
        """Overlays a second recorded run on the trace shown (or shows it, if none is)."""
        if self.dashboard.trace is None:
            self.open_trace(path)
            return
        self.dashboard.compare_trace(load_trace(path), Path(path).name)
        self.dashboard_dock.show()

    def compare_trace_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Compare with another recorded run", "", TRACE_FILTER)
        if not path:
            return
        try:
            self.compare_trace(path)
        except UserError as exc:
            self.banner.show_message(failure_notice(str(exc), hint=False), "error", kind="trace")

    def load_trace_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a recorded run", "", TRACE_FILTER)
        if not path:
            return
        try:
            self.open_trace(path)
        except UserError as exc:
            self.banner.show_message(failure_notice(str(exc), hint=False), "error", kind="trace")

    def save_trace(self, path: str | Path) -> int:
        return save_trace(path, list(self.record), meta=dict(self.record_meta, saved_by="captioner gui"))

    def save_trace_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save this run as a trace", "run.trace.jsonl", TRACE_FILTER)
        if not path:
            return
        try:
            count = self.save_trace(path)
        except (OSError, UserError) as exc:
            self.banner.show_message(failure_notice(f"save failed: {exc}", hint=False), "error", kind="trace")
            return
        self.statusBar().showMessage(f"Saved {count} events to {path}", 5000)
