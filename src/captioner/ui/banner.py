"""A message bar across the top of the window: what the user should know now, never in the way.

It replaces modal dialogs for everything a session reports (a demo running because there is no
microphone, a start that failed, an input lost, a notice from the engine): a dialog would block a
window that is meant to keep showing captions, and a headless or scripted run would hang behind
it. One message at a time; each is put up by a *kind* ("demo", "error", "engine", ...), so whoever
put it up can take it down again without clearing someone else's. The × dismisses it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QTextDocumentFragment
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QToolButton,
    QVBoxLayout,
)

from captioner.ui.theme import DARK, Theme

LEVELS = ("info", "warning", "error")
_WARNING_COLOR = "#e8a33d"


def _level_color(theme: Theme, level: str) -> str:
    return {"info": theme.accent, "warning": _WARNING_COLOR, "error": theme.alarm}.get(level, theme.accent)


def _tinted(base: str, color: str, amount: float) -> str:
    """``color`` mixed into ``base`` by ``amount`` (0..1): a background that stays readable."""
    a, b = QColor(base), QColor(color)
    mix = [round(x + (y - x) * amount) for x, y in zip((a.red(), a.green(), a.blue()), (b.red(), b.green(), b.blue()))]
    return QColor(*mix).name()


class Banner(QFrame):
    """GUI thread only."""

    dismissed = Signal(str)  # the kind of the message the user closed

    def __init__(self, theme: Theme = DARK, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("banner")
        self._theme = theme
        self._level = "info"
        self.kind = ""
        self.text_label = QLabel()
        self.text_label.setObjectName("bannerText")
        self.text_label.setWordWrap(True)
        self.text_label.setTextFormat(Qt.TextFormat.RichText)
        self.text_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.close_button = QToolButton()
        self.close_button.setObjectName("bannerClose")
        self.close_button.setText("✕")
        self.close_button.setToolTip("Dismiss")
        self.close_button.setAutoRaise(True)
        self.close_button.clicked.connect(self.dismiss)
        self._buttons = QHBoxLayout()
        self._buttons.setContentsMargins(0, 0, 0, 0)
        self._buttons.setSpacing(6)
        text_column = QVBoxLayout()
        text_column.setContentsMargins(0, 0, 0, 0)
        text_column.setSpacing(6)
        text_column.addWidget(self.text_label)
        text_column.addLayout(self._buttons)
        row = QHBoxLayout(self)
        row.setContentsMargins(12, 8, 6, 8)
        row.addLayout(text_column, 1)
        row.addWidget(self.close_button, 0, Qt.AlignmentFlag.AlignTop)
        self.set_theme(theme)
        self.hide()

    @property
    def level(self) -> str:
        return self._level

    def text(self) -> str:
        """The message shown, as plain text ("" when the banner is hidden)."""
        if self.isHidden():
            return ""
        return QTextDocumentFragment.fromHtml(self.text_label.text()).toPlainText()

    def show_message(self, html: str, level: str = "info", kind: str = "",
                     actions: Sequence[tuple[str, Callable[[], None]]] = ()) -> None:
        """Shows ``html`` (a sentence or two, rich text) with a button per ``(text, callback)`` in
        ``actions``; ``kind`` says who put it up (see :meth:`clear`)."""
        if level not in LEVELS:
            raise ValueError(f"unknown banner level {level!r}")
        self.kind = kind
        self._level = level
        self.text_label.setText(html)
        while self._buttons.count():
            widget = self._buttons.takeAt(0).widget()
            if widget is not None:
                widget.hide()  # at once: deleteLater waits for the event loop
                widget.deleteLater()
        for text, callback in actions:
            button = QPushButton(text)
            button.clicked.connect(callback)
            self._buttons.addWidget(button)
        self._buttons.addStretch(1)
        self._restyle()
        self.show()

    def clear(self, kind: str | None = None) -> None:
        """Hides the message if it is of ``kind`` (any message when ``kind`` is None)."""
        if kind is None or kind == self.kind:
            self.kind = ""
            self.hide()

    def dismiss(self) -> None:
        kind = self.kind
        self.clear()
        self.dismissed.emit(kind)

    def set_theme(self, theme: Theme) -> None:
        self._theme = theme
        self._restyle()

    def _restyle(self) -> None:
        color = _level_color(self._theme, self._level)
        background = _tinted(self._theme.window, color, 0.18)
        self.setStyleSheet(
            f"QFrame#banner {{ background: {background}; border: 1px solid {color}; border-left: 4px solid {color};"
            f" border-radius: 4px; }}"
            f" QLabel#bannerText {{ color: {self._theme.text}; background: transparent; }}"
        )
