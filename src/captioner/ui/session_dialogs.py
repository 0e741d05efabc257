"""The dialogs a session start may show: the model's progress, and a warning when it failed.

GUI thread only. Both leave the window usable: the progress dialog is window-modal only while a
model is prepared (nothing else can be done then anyway), and the warning is non-modal so a
headless or scripted run is never stuck behind it.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox, QProgressDialog, QWidget

APP_TITLE = "captioner"
SHOW_AFTER_MS = 400  # a warm start (cached graphs) finishes before the dialog would flash up


class ModelProgress:
    """A progress dialog over ``parent`` while the model ``model`` is prepared."""

    def __init__(self, parent: QWidget, model: str) -> None:
        dialog = QProgressDialog(f"Preparing the model {model}…", "", 0, 0, parent)
        dialog.setWindowTitle(APP_TITLE)
        dialog.setCancelButton(None)  # a model load cannot be interrupted halfway
        dialog.setMinimumDuration(SHOW_AFTER_MS)
        dialog.setWindowModality(Qt.WindowModality.WindowModal)
        self.dialog: QProgressDialog | None = dialog

    def update(self, message: str, fraction: float) -> None:
        if self.dialog is None:
            return
        self.dialog.setMaximum(100)  # from "busy" (0..0) to a real bar once a fraction is known
        self.dialog.setLabelText(message)
        self.dialog.setValue(int(100 * max(0.0, min(1.0, fraction))))

    def close(self) -> None:
        if self.dialog is not None:
            self.dialog.reset()
            self.dialog.deleteLater()
            self.dialog = None


def show_warning(parent: QWidget, message: str) -> QMessageBox:
    """A non-modal warning box over ``parent`` (returned, so a test can find and close it)."""
    box = QMessageBox(QMessageBox.Icon.Warning, APP_TITLE, message, QMessageBox.StandardButton.Ok, parent)
    box.setModal(False)
    box.show()
    return box
