"""The caption view: committed text in full colour, partial text grey and italic after it.

Committed text is appended and never rewritten; the partial texts (one per stream) live in a
"tail" after the last committed character, which is deleted and written again on each update, so
an update costs the size of the tail, not of the whole session. A paragraph starts whenever the
stream or the segment changes (a pause) or a sentence ends; like a chat, the stream's name ("Me", "Meeting", a file's name)
stands on a line of its own above a run of paragraphs from that stream, once, not before every
line. Long names and words wrap: nothing is cut off and there is no sideways scrolling.

Auto-scroll: if the view was at the bottom before an update it follows the new text; once the user
scrolls back it stays where they put it until they scroll to the bottom again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import (
    QColor,
    QFont,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextOption,
)
from PySide6.QtWidgets import QTextEdit

from captioner.events import CaptionUpdate
from captioner.ui.theme import DARK, Theme

MIN_FONT_PT = 9
MAX_FONT_PT = 72
DEFAULT_FONT_PT = 20
_BOTTOM_SLACK_PX = 4
LABEL_SCALE = 0.6  # the stream's name is smaller than the captions: it labels, it is not read


@dataclass
class _Paragraph:
    stream: str
    segment: int
    text: str


_SENTENCE_END = re.compile(r"[.?!\u3002\uff01\uff1f][\"'\u201d\u2019)\]]*$")


def _continues(last: _Paragraph | None, stream: str, segment: int) -> bool:
    """Whether text of ``stream``/``segment`` goes on the paragraph ``last``: a line ends where
    the stream changes, at a pause (the segment moves on) or at a sentence end, so the view's
    lines do not depend on where commits happened to fall."""
    return (last is not None and last.stream == stream and last.segment == segment
            and not _SENTENCE_END.search(last.text))


class CaptionView(QTextEdit):
    """GUI thread only."""

    following_changed = Signal(bool)

    def __init__(self, theme: Theme = DARK, font_pt: int = DEFAULT_FONT_PT, parent=None) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setUndoRedoEnabled(False)
        self.setAcceptRichText(False)
        self.setLineWrapMode(QTextEdit.LineWrapMode.WidgetWidth)
        self.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setObjectName("captionView")
        self.setPlaceholderText("Captions appear here. Pick a source and press Start (F5).")
        self._theme = theme
        self._paragraphs: list[_Paragraph] = []
        self._partials: dict[str, CaptionUpdate] = {}
        self._stream_order: list[str] = []
        self._tail_pos = 0
        self._following = True
        self.document().setDocumentMargin(16)
        self.set_font_pt(font_pt)
        self.verticalScrollBar().valueChanged.connect(self._on_user_scroll)
        self._updating = False

    # -- appearance ------------------------------------------------------------------------

    @property
    def font_pt(self) -> int:
        return self._font_pt

    def set_font_pt(self, pt: int) -> None:
        self._font_pt = max(MIN_FONT_PT, min(MAX_FONT_PT, int(pt)))
        font = QFont(self.font())
        font.setPointSize(self._font_pt)
        self.document().setDefaultFont(font)
        self._rerender()

    def set_theme(self, theme: Theme) -> None:
        self._theme = theme
        self._rerender()

    def stream_color(self, stream: str) -> str:
        if stream not in self._stream_order:
            self._stream_order.append(stream)
        colors = self._theme.stream_colors
        return colors[self._stream_order.index(stream) % len(colors)]

    def _fmt_label(self, stream: str) -> QTextCharFormat:
        fmt = QTextCharFormat()
        fmt.setForeground(QColor(self.stream_color(stream)))
        fmt.setFontWeight(QFont.Weight.Bold)
        fmt.setFontPointSize(max(MIN_FONT_PT, round(self._font_pt * LABEL_SCALE)))
        return fmt

    def _block_label(self, first: bool) -> QTextBlockFormat:
        fmt = QTextBlockFormat()
        # A gap above a change of speaker, none above the first line of the view.
        fmt.setTopMargin(0 if first else round(self._font_pt * 0.5))
        return fmt

    def _block_text(self) -> QTextBlockFormat:
        fmt = QTextBlockFormat()
        fmt.setTopMargin(round(self._font_pt * 0.2))
        return fmt

    def _fmt_committed(self) -> QTextCharFormat:
        fmt = QTextCharFormat()
        fmt.setForeground(QColor(self._theme.text))
        return fmt

    def _fmt_partial(self) -> QTextCharFormat:
        fmt = QTextCharFormat()
        fmt.setForeground(QColor(self._theme.dim_text))
        fmt.setFontItalic(True)
        return fmt

    # -- content ---------------------------------------------------------------------------

    @property
    def following(self) -> bool:
        """True while the view sticks to the newest text."""
        return self._following

    def committed_text(self) -> str:
        return "\n".join(f"{p.stream}: {p.text}" for p in self._paragraphs)

    def partial_text(self, stream: str) -> str:
        update = self._partials.get(stream)
        return update.text if update is not None else ""

    def apply_updates(self, updates: list[CaptionUpdate]) -> None:
        """Applies a batch of updates (drained from the engine) with one redraw of the tail."""
        if not updates:
            return
        bar = self.verticalScrollBar()
        was_at_bottom = self._following
        old_value = bar.value()
        self._updating = True
        try:
            cursor = QTextCursor(self.document())
            self._delete_tail(cursor)
            for update in updates:
                if update.kind == "final":
                    self._partials.pop(update.stream, None)
                    self._append_committed(cursor, update)
                else:
                    if update.text.strip():
                        self._partials[update.stream] = update
                    else:
                        self._partials.pop(update.stream, None)
            self._write_tail(cursor)
        finally:
            self._updating = False
        if was_at_bottom:
            bar.setValue(bar.maximum())
        else:
            bar.setValue(min(old_value, bar.maximum()))

    def clear_captions(self) -> None:
        self._paragraphs.clear()
        self._partials.clear()
        self._updating = True
        try:
            self.document().clear()
        finally:
            self._updating = False
        self._tail_pos = 0
        self._set_following(True)

    def _delete_tail(self, cursor: QTextCursor) -> None:
        cursor.setPosition(self._tail_pos)
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()

    def _append_committed(self, cursor: QTextCursor, update: CaptionUpdate) -> None:
        text = " ".join(update.text.split())
        if not text:
            return
        cursor.movePosition(QTextCursor.MoveOperation.End)
        last = self._paragraphs[-1] if self._paragraphs else None
        if _continues(last, update.stream, update.segment):
            joiner = "" if not last.text or text[0] in ",.;:!?" else " "
            cursor.insertText(joiner + text, self._fmt_committed())
            last.text += joiner + text
        else:
            self._start_paragraph(cursor, update.stream, last.stream if last is not None else None)
            cursor.insertText(text, self._fmt_committed())
            self._paragraphs.append(_Paragraph(update.stream, update.segment, text))
        self._tail_pos = cursor.position()

    def _start_paragraph(self, cursor: QTextCursor, stream: str, previous: str | None) -> None:
        """Opens a new paragraph of ``stream`` at the end; ``previous`` is the stream of the
        paragraph before it (None at the top of the view). The label line comes first only when
        the stream changes."""
        at_top = cursor.position() == 0
        if stream != previous:
            if at_top:
                cursor.setBlockFormat(self._block_label(first=True))
            else:
                cursor.insertBlock(self._block_label(first=False))
            cursor.insertText(stream, self._fmt_label(stream))
            cursor.insertBlock(self._block_text())
        elif at_top:
            cursor.setBlockFormat(self._block_text())
        else:
            cursor.insertBlock(self._block_text())

    def _write_tail(self, cursor: QTextCursor) -> None:
        cursor.movePosition(QTextCursor.MoveOperation.End)
        self._tail_pos = cursor.position()
        last = self._paragraphs[-1] if self._paragraphs else None
        previous = last.stream if last is not None else None
        first = True
        for stream, update in self._partials.items():
            text = " ".join(update.text.split())
            inline = first and _continues(last, stream, update.segment)
            if inline:
                cursor.insertText(" " + text, self._fmt_partial())
            else:
                self._start_paragraph(cursor, stream, previous)
                cursor.insertText(text, self._fmt_partial())
            previous = stream
            first = False

    def _rerender(self) -> None:
        paragraphs, partials = self._paragraphs, dict(self._partials)
        self._paragraphs, self._partials = [], {}
        bar = self.verticalScrollBar()
        old_value, follow = bar.value(), self._following
        self._updating = True
        try:
            self.document().clear()
            self._tail_pos = 0
            cursor = QTextCursor(self.document())
            for p in paragraphs:
                self._append_committed(
                    cursor, CaptionUpdate(p.stream, "final", p.text, 0.0, 0.0, 0.0, 0.0, segment=p.segment)
                )
            self._partials = partials
            self._write_tail(cursor)
        finally:
            self._updating = False
        bar.setValue(bar.maximum() if follow else min(old_value, bar.maximum()))

    # -- scrolling -------------------------------------------------------------------------

    def _on_user_scroll(self, value: int) -> None:
        if self._updating:
            return  # our own edits move the bar; only the user's moves change following
        self._set_following(value >= self.verticalScrollBar().maximum() - _BOTTOM_SLACK_PX)

    def _set_following(self, following: bool) -> None:
        if following != self._following:
            self._following = following
            self.following_changed.emit(following)

    def scroll_to_live(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())
        self._set_following(True)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt name)
        super().resizeEvent(event)
        if self._following:
            bar = self.verticalScrollBar()
            bar.setValue(bar.maximum())

    def keyPressEvent(self, event) -> None:  # noqa: N802
        if event.key() == Qt.Key.Key_End:
            self.scroll_to_live()
            return
        super().keyPressEvent(event)
