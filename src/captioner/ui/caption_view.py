"""The caption view: committed text in full colour, partial text grey and italic after it.

Captions are laid out as captions (:mod:`captioner.layout`, the rules every output follows):
cues of at most two lines of at most 42 characters, broken at a sentence's end, a pause or
punctuation first. A cue no later word can change is appended and never rewritten; the cue being
spoken (one per stream: its committed words, then the partial ones) lives in a "tail" after the
last committed character, which is deleted and written again on each update, so an update costs
the size of the tail, not of the whole session. Like a chat, the stream's name ("Me",
"Meeting", a file's name) stands on a line of its own above a run of cues from that stream,
once, not before every cue. Long names and words wrap: nothing is cut off and there is no
sideways scrolling.

Auto-scroll: if the view was at the bottom before an update it follows the new text; once the user
scrolls back it stays where they put it until they scroll to the bottom again.
"""

from __future__ import annotations

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

from captioner import layout
from captioner.events import CaptionUpdate
from captioner.ui.theme import DARK, Theme

MIN_FONT_PT = 9
MAX_FONT_PT = 72
DEFAULT_FONT_PT = 20
_BOTTOM_SLACK_PX = 4
LABEL_SCALE = 0.6  # the stream's name is smaller than the captions: it labels, it is not read


_LINE_BREAK = "\u2028"  # a line break inside a block: a cue's lines stay one paragraph


class CaptionView(QTextEdit):
    """GUI thread only."""

    following_changed = Signal(bool)

    def __init__(self, theme: Theme = DARK, font_pt: int = DEFAULT_FONT_PT, parent=None, pause_s: float = 0.5) -> None:
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
        self._pause_s = pause_s
        self._layout = layout.LiveLayout(pause_s)
        self._cues: list[layout.Cue] = []
        self._finals: list[CaptionUpdate] = []  # what the layout was given (a re-render replays it)
        self._partials: dict[str, CaptionUpdate] = {}
        self._recent: dict[str, None] = {}  # streams, the one updated last last
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
        """The committed captions, ``stream: text`` per cue (the cue being spoken included)."""
        lines = [f"{c.stream}: {' '.join(c.lines)}" for c in self._cues]
        for stream in self._open_streams():
            words = self._layout.open_words(stream)
            if words:
                lines.append(f"{stream}: {layout.join(words)}")
        return "\n".join(lines)

    def partial_text(self, stream: str) -> str:
        update = self._partials.get(stream)
        return update.text if update is not None else ""

    def cues(self) -> list[layout.Cue]:
        """The cues shown so far that no later word can change."""
        return list(self._cues)

    def open_lines(self, stream: str) -> list[list[layout.Word]]:
        """The lines of ``stream``'s cue being spoken, its partial words ``provisional``."""
        update = self._partials.get(stream)
        return self._layout.open_lines(stream, update.text if update is not None else "")

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
                self._recent.pop(update.stream, None)
                self._recent[update.stream] = None
                if update.kind == "final":
                    self._partials.pop(update.stream, None)  # a final takes the partial off
                    if update.text.strip():
                        self._finals.append(update)
                        for cue in self._layout.add([update]):
                            self._append_cue(cursor, cue)
                elif update.kind == "partial" and update.text.strip():
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
        self._layout = layout.LiveLayout(self._pause_s)
        self._cues.clear()
        self._finals.clear()
        self._partials.clear()
        self._recent.clear()
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

    def _last_stream(self) -> str | None:
        return self._cues[-1].stream if self._cues else None

    def _append_cue(self, cursor: QTextCursor, cue: layout.Cue) -> None:
        cursor.movePosition(QTextCursor.MoveOperation.End)
        self._start_paragraph(cursor, cue.stream, self._last_stream())
        cursor.insertText(_LINE_BREAK.join(cue.lines), self._fmt_committed())
        self._cues.append(cue)
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

    def _open_streams(self) -> list[str]:
        """Streams with a cue being spoken (committed words no cue holds yet, or a partial), in
        the order those cues began."""
        def began_s(stream: str) -> float:
            words = self._layout.open_words(stream)
            return words[0].start_s if words else self._partials[stream].start_s

        return sorted((s for s in self._recent if self._layout.open_words(s) or s in self._partials), key=began_s)

    def _write_tail(self, cursor: QTextCursor) -> None:
        cursor.movePosition(QTextCursor.MoveOperation.End)
        self._tail_pos = cursor.position()
        previous = self._last_stream()
        for stream in self._open_streams():
            lines = self.open_lines(stream)
            if not lines:
                continue
            self._start_paragraph(cursor, stream, previous)
            for n, line in enumerate(lines):
                if n:
                    cursor.insertText(_LINE_BREAK, self._fmt_committed())
                for k, word in enumerate(line):
                    sep = "" if not k or word.joined else " "
                    cursor.insertText(sep + word.text, self._fmt_partial() if word.provisional else self._fmt_committed())
            previous = stream

    def _rerender(self) -> None:
        finals, partials = list(self._finals), dict(self._partials)
        bar = self.verticalScrollBar()
        old_value, follow = bar.value(), self._following
        self._updating = True
        try:
            self.document().clear()
            self._tail_pos = 0
            self._layout = layout.LiveLayout(self._pause_s)
            self._cues, self._finals, self._partials = [], [], {}
            cursor = QTextCursor(self.document())
            for update in finals:
                self._finals.append(update)
                for cue in self._layout.add([update]):
                    self._append_cue(cursor, cue)
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
