"""The overlay: a frameless, always-on-top, translucent caption bar to float over a meeting.

It shows the last two or three lines of the captions (committed white, partial grey italic), as
the caption view lays them out (:mod:`captioner.layout`: lines of at most 42 characters broken
at sentences, pauses and punctuation first). Drag it anywhere to move it, drag the corner grip
to resize it; a line wider than the bar still wraps rather than being cut.

Who speaks is said compactly, before the line's words: "Anna:" in a colour of its own, on a
line whose speaker (or stream) is not the one of the line above it, and on the top line shown
whenever it has one, so the bar always says whose words it shows.
"""

from __future__ import annotations

import html

from PySide6.QtCore import QPoint, QRect, Qt, Signal
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPainter
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSizeGrip, QVBoxLayout, QWidget

DEFAULT_LINES = 3
DEFAULT_FONT_PT = 22
_BACKGROUND = QColor(12, 14, 18, 185)
_NAME_COLOR = "#9fd0ff"
_PARTIAL_COLOR = "#b8bec8"


Line = list[tuple[str, bool]]
"""A laid-out line: its words, each with the space before it where there is one, and whether it
is provisional (a partial word)."""


class CaptionOverlay(QWidget):
    """GUI thread only."""

    moved_by_user = Signal()  # dragged: from now on it stays where the user put it

    def __init__(self, font_pt: int = DEFAULT_FONT_PT, n_lines: int = DEFAULT_LINES, parent=None) -> None:
        super().__init__(
            parent,
            Qt.WindowType.Window
            | Qt.WindowType.FramelessWindowHint
            | Qt.WindowType.WindowStaysOnTopHint
            | Qt.WindowType.Tool,
        )
        self.setObjectName("captionOverlay")
        self.setWindowTitle("captioner overlay")
        self.setAttribute(Qt.WidgetAttribute.WA_TranslucentBackground)
        self.setAttribute(Qt.WidgetAttribute.WA_ShowWithoutActivating)
        self.setMinimumSize(320, 80)
        self.n_lines = n_lines
        self._lines: list[Line] = []
        self._who: list[str] = []
        self._drag_offset: QPoint | None = None

        self.label = QLabel(self)
        self.label.setTextFormat(Qt.TextFormat.RichText)
        self.label.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignBottom)
        self.label.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)
        self.label.setWordWrap(True)
        self.label.setStyleSheet("color: #ffffff; background: transparent;")
        grip = QSizeGrip(self)
        grip.setStyleSheet("background: transparent;")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(18, 10, 6, 6)
        layout.setSpacing(0)
        layout.addWidget(self.label, 1)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(grip, 0, Qt.AlignmentFlag.AlignBottom | Qt.AlignmentFlag.AlignRight)
        layout.addLayout(row)
        self.resize(900, 130)
        self.set_font_pt(font_pt)

    def set_font_pt(self, pt: int) -> None:
        font = QFont(self.label.font())
        font.setPointSize(int(pt))
        font.setWeight(QFont.Weight.DemiBold)
        self.label.setFont(font)
        # Room for the lines at this size: margins (10 + 6), the grip row and the text.
        needed_px = QFontMetrics(font).lineSpacing() * self.n_lines + 16 + 18
        self.setMinimumHeight(min(needed_px, 600))
        if self.height() < needed_px:
            self.resize(self.width(), needed_px)
        self._relayout()

    def set_lines(self, lines: list[Line], who: list[str] | None = None) -> None:
        """The caption lines so far, laid out (only the last ones are shown); ``who``: whose
        each line is ("Anna", "Meeting · Speaker 2"; "" where it needs no name), one per line."""
        keep = max(self.n_lines, 8)
        who = list(who) if who is not None else []
        who += [""] * (len(lines) - len(who))
        self._lines = list(lines[-keep:])
        self._who = who[:len(lines)][-keep:] if lines else []
        self._relayout()

    def shown_text(self) -> str:
        return self.label.text()

    def _relayout(self) -> None:
        metrics = QFontMetrics(self.label.font())
        # As many lines as fit (the user may have made the bar shorter), at most n_lines.
        fit = max(1, self.label.height() // max(1, metrics.lineSpacing())) if self.label.height() > 0 else self.n_lines
        shown = min(self.n_lines, fit)
        rendered = []
        above = None
        for line, who in zip(self._lines[-shown:], self._who[-shown:]):
            parts = []
            if who and who != above:
                parts.append(f'<span style="color:{_NAME_COLOR}">{html.escape(who)}:</span> ')
            above = who
            for word, partial in line:
                text = html.escape(word)
                parts.append(f'<i><span style="color:{_PARTIAL_COLOR}">{text}</span></i>' if partial else text)
            rendered.append("".join(parts).strip())
        self.label.setText("<br>".join(rendered))

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt name)
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(_BACKGROUND)
        painter.drawRoundedRect(QRect(0, 0, self.width(), self.height()), 12, 12)
        painter.end()

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._relayout()

    def mousePressEvent(self, event) -> None:  # noqa: N802
        if event.button() == Qt.MouseButton.LeftButton:
            self._drag_offset = event.globalPosition().toPoint() - self.frameGeometry().topLeft()
            event.accept()

    def mouseMoveEvent(self, event) -> None:  # noqa: N802
        if self._drag_offset is not None and event.buttons() & Qt.MouseButton.LeftButton:
            self.move(event.globalPosition().toPoint() - self._drag_offset)
            self.moved_by_user.emit()
            event.accept()

    def mouseReleaseEvent(self, event) -> None:  # noqa: N802
        self._drag_offset = None
