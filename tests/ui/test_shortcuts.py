"""Keyboard shortcuts, sent as key presses to the window."""

from __future__ import annotations

from fakes import final
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

CTRL_SHIFT = Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier


def test_shortcuts(window, qtbot):
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is window, timeout=2000)
    qtbot.keyClick(window.caption_view, Qt.Key.Key_O, CTRL_SHIFT)
    assert window.overlay_action.isChecked()
    window.apply_captions([final("Me", "Shown in the overlay.", 0, 1)])
    assert window.overlay.isVisible()
    qtbot.keyClick(window.caption_view, Qt.Key.Key_O, CTRL_SHIFT)
    assert not window.overlay.isVisible() and not window.overlay_action.isChecked()

    size = window.caption_view.font_pt
    qtbot.keyClick(window.caption_view, Qt.Key.Key_Plus, Qt.KeyboardModifier.ControlModifier)
    assert window.caption_view.font_pt == size + 2
    qtbot.keyClick(window.caption_view, Qt.Key.Key_Minus, Qt.KeyboardModifier.ControlModifier)
    assert window.caption_view.font_pt == size

    class Microphone:
        name, is_monitor, open_as = "USB headset", False, "3"

    window.show_devices([Microphone()], None)  # the default input is there, and ticked
    requested = []
    window.start_requested.connect(requested.append)
    qtbot.keyClick(window.caption_view, Qt.Key.Key_F5)
    assert len(requested) == 1 and requested[0].sources
