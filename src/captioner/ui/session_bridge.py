"""The window's side of :class:`~captioner.ui.session_view.SessionView`: calls become signals.

The controller calls a :class:`SessionBridge` from the GUI thread or from its start/stop helper
threads; each call only emits a signal, which is delivered *queued* to the window's
``show_*`` slot, so the widgets are touched on the GUI thread alone, in the order the calls were
made (one queue for all of them), and the calling thread never waits for the GUI.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from PySide6.QtCore import QObject, Qt, Signal

from captioner.events import CaptionUpdate, PipelineStatus


class SessionSlots(Protocol):
    """What the window shows for each :class:`SessionView` call (GUI thread only)."""

    def show_devices(self, devices: Sequence[Any], error: str | None) -> None: ...
    def show_session_starting(self, model: str) -> None: ...
    def show_session_progress(self, message: str, fraction: float) -> None: ...
    def show_session_started(self, transcript_path: str | None, meta: Mapping[str, Any]) -> None: ...
    def show_session_failed(self, message: str, setting: str = "") -> None: ...
    def show_session_stopping(self, finished: bool) -> None: ...
    def show_session_stopped(self, leftovers: Sequence[CaptionUpdate], status: PipelineStatus | None,
                             error: str | None) -> None: ...


class SessionBridge(QObject):
    """Implements :class:`~captioner.ui.session_view.SessionView` for ``slots`` (the window).

    Created on the GUI thread (it lives there, with the window as its parent); its methods may be
    called from any thread.
    """

    devices = Signal(object, object)  # Sequence of devices, error (str | None)
    starting = Signal(str)
    progress = Signal(str, float)
    started = Signal(object, object)  # transcript path (str | None), meta (Mapping)
    failed = Signal(str, str)  # message, the setting it is about
    stopping = Signal(bool)
    stopped = Signal(object, object, object)  # leftovers, PipelineStatus | None, error (str | None)

    def __init__(self, slots: SessionSlots, parent: QObject | None = None) -> None:
        super().__init__(parent)
        queued = Qt.ConnectionType.QueuedConnection
        # Queued even for calls made on the GUI thread: a start's "starting" and a stop's
        # "stopping" then stay behind whatever a helper thread posted before them.
        self.starting.connect(slots.show_session_starting, queued)
        self.progress.connect(slots.show_session_progress, queued)
        self.started.connect(slots.show_session_started, queued)
        self.failed.connect(slots.show_session_failed, queued)
        self.stopping.connect(slots.show_session_stopping, queued)
        self.stopped.connect(slots.show_session_stopped, queued)
        # The device list answers a GUI-thread request and is ordered with no session call, so
        # it is applied at once there: the app picks its sources from that list right after
        # asking for it (a call from another thread would still be queued).
        self.devices.connect(slots.show_devices, Qt.ConnectionType.AutoConnection)

    # -- SessionView (any thread) --------------------------------------------------------------

    def devices_listed(self, devices: Sequence[Any], error: str | None) -> None:
        self.devices.emit(list(devices), error)

    def session_starting(self, model: str) -> None:
        self.starting.emit(model)

    def session_progress(self, message: str, fraction: float) -> None:
        self.progress.emit(str(message), float(fraction))

    def session_started(self, transcript_path: str | None, meta: Mapping[str, Any]) -> None:
        self.started.emit(transcript_path, dict(meta))  # a copy: the GUI reads it later

    def session_failed(self, message: str, setting: str = "") -> None:
        self.failed.emit(message, setting)

    def session_stopping(self, finished: bool) -> None:
        self.stopping.emit(bool(finished))

    def session_stopped(self, leftovers: Sequence[CaptionUpdate], status: PipelineStatus | None,
                        error: str | None) -> None:
        self.stopped.emit(list(leftovers), status, error)
