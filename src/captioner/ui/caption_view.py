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

Speakers: where a stream's lines carry speaker labels (``CaptionUpdate.speaker``), the heading
names the speaker too ("Meeting · Speaker 2") and comes back wherever the speaker changes.
Clicking the name opens a small editor over it: Enter (or clicking elsewhere) keeps the typed
name, Escape cancels, an empty name keeps the old one. Without a mouse, F2 opens it on the last
speaker heard, and Up/Down in the editor move it to the session's other speakers. The name then heads every line of that
speaker of that stream in this session, those already shown included (:meth:`rename_speaker`,
:attr:`speaker_renamed`). A session's speakers are its own: the engine numbers them afresh each
time it starts, so "Speaker 1" of the next session is not renamed with this one's
(:meth:`begin_session`).

Auto-scroll: if the view was at the bottom before an update it follows the new text; once the user
scrolls back it stays where they put it until they scroll to the bottom again.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QRect, Qt, Signal
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontMetrics,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextOption,
)
from PySide6.QtWidgets import QLineEdit, QTextEdit, QToolTip

from captioner import layout
from captioner.events import CaptionUpdate
from captioner.ui.theme import DARK, Theme

MIN_FONT_PT = 9
MAX_FONT_PT = 72
DEFAULT_FONT_PT = 20
_BOTTOM_SLACK_PX = 4
LABEL_SCALE = 0.6  # the stream's name is smaller than the captions: it labels, it is not read


_LINE_BREAK = "\u2028"  # a line break inside a block: a cue's lines stay one paragraph
_SPEAKER_HREF = "speaker:"  # the anchor of a speaker's name in a heading: "speaker:N", N in _voices
SEPARATOR = " \u00b7 "  # between the stream and the speaker in a heading: "Meeting · Speaker 2"

Voice = tuple[int, str, str]
"""Whose a line is: ``(session, stream, speaker)``; ``speaker`` is "" where the stream's speakers
are not labelled."""


class _NameEditor(QLineEdit):
    """The inline editor of a speaker's name: Escape cancels (``cancelled``), Up and Down ask for
    the speaker before or after (``step``: -1 or +1)."""

    cancelled = Signal()
    step = Signal(int)

    def keyPressEvent(self, event) -> None:  # noqa: N802 (Qt name)
        steps = {Qt.Key.Key_Up: -1, Qt.Key.Key_Down: +1}
        if event.key() == Qt.Key.Key_Escape:
            event.accept()
            self.cancelled.emit()
            return
        if event.key() in steps:
            event.accept()
            self.step.emit(steps[event.key()])
            return
        super().keyPressEvent(event)


class CaptionView(QTextEdit):
    """GUI thread only."""

    following_changed = Signal(bool)
    speaker_renamed = Signal(int, str, str, str)
    """``(session, stream, speaker, name)``: the person named a speaker; ``name`` is the label
    itself when they gave the label back. ``session`` is :attr:`session` for one of the session
    running (or last run)."""

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
        self._layout = _new_layout(pause_s)
        self._cues: list[layout.Cue] = []
        self._cue_sessions: list[int] = []  # the session of each of _cues
        # What the layout was given, with the session of each (a re-render replays it).
        self._finals: list[tuple[int, CaptionUpdate]] = []
        self._session = 0
        self._open_speaker: dict[str, str] = {}  # per stream: the speaker of its open cue's words
        self._names: dict[Voice, str] = {}  # speakers the person named
        self._voices: list[Voice] = []  # every labelled speaker seen: the anchors' numbers
        self._voice_numbers: dict[Voice, int] = {}
        self._editing: Voice | None = None
        self._edit_pos = 0  # where the name being edited starts in the document
        self._pressed_href = ""
        self._partials: dict[str, CaptionUpdate] = {}
        self._recent: dict[str, None] = {}  # streams, the one updated last last
        self._stream_order: list[str] = []
        self._tail_pos = 0
        self._following = True
        self._updating = False
        self.viewport().setMouseTracking(True)  # a hand over a speaker's name: it can be clicked
        self.name_editor = _NameEditor(self.viewport())
        self.name_editor.setObjectName("speakerNameEditor")
        self.name_editor.setPlaceholderText("Name")
        self.name_editor.hide()
        self.name_editor.editingFinished.connect(self._save_edit)
        self.name_editor.cancelled.connect(self.cancel_rename)
        self.name_editor.step.connect(self._step_rename)
        self.document().setDocumentMargin(16)
        self.set_font_pt(font_pt)
        self.verticalScrollBar().valueChanged.connect(self._on_user_scroll)

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

    def _label_pt(self) -> int:
        return max(MIN_FONT_PT, round(self._font_pt * LABEL_SCALE))

    def _fmt_label(self, stream: str) -> QTextCharFormat:
        fmt = QTextCharFormat()
        fmt.setForeground(QColor(self.stream_color(stream)))
        fmt.setFontWeight(QFont.Weight.Bold)
        fmt.setFontPointSize(self._label_pt())
        return fmt

    def _fmt_name(self, voice: Voice) -> QTextCharFormat:
        """A speaker's name in a heading: the stream's label format, underlined with dots (it can
        be clicked), an anchor that says whose name it is."""
        fmt = self._fmt_label(voice[1])
        fmt.setAnchor(True)
        fmt.setAnchorHref(f"{_SPEAKER_HREF}{self._voice_number(voice)}")
        fmt.setFontUnderline(True)
        fmt.setUnderlineStyle(QTextCharFormat.UnderlineStyle.DotLine)
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
        """The committed captions, ``stream: text`` per cue (the cue being spoken included);
        ``stream (name): text`` where the speaker is labelled."""
        lines = [f"{self._prefix((session, c.stream, c.speaker))}: {' '.join(c.lines)}"
                 for session, c in zip(self._cue_sessions, self._cues)]
        for stream in self._open_streams():
            words = self._layout.open_words(stream)
            if words:
                lines.append(f"{self._prefix(self._open_voice(stream))}: {layout.join(words)}")
        return "\n".join(lines)

    def _prefix(self, voice: Voice) -> str:
        return f"{voice[1]} ({self.speaker_name(*voice[1:], session=voice[0])})" if voice[2] else voice[1]

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

    def open_streams(self) -> list[str]:
        """Streams with a cue being spoken, in the order those cues began."""
        return self._open_streams()

    def recent_lines(self, last_cues: int = 4) -> list[tuple[Voice, list[tuple[str, bool]]]]:
        """The lines of the last ``last_cues`` cues, then those of the cues being spoken, each with
        whose it is: ``(voice, [(word with the space before it, provisional), ...])`` (the
        overlay's lines)."""
        out: list[tuple[Voice, list[tuple[str, bool]]]] = []
        first = max(0, len(self._cues) - last_cues)
        for session, cue in zip(self._cue_sessions[first:], self._cues[first:]):
            voice = (session, cue.stream, cue.speaker)
            out += [(voice, [((" " if k else "") + word, False) for k, word in enumerate(line.split(" "))])
                    for line in cue.lines]
        for stream in self._open_streams():
            voice = self._open_voice(stream)
            out += [(voice, [(("" if not k or w.joined else " ") + w.text, w.provisional) for k, w in enumerate(line)])
                    for line in self.open_lines(stream)]
        return out

    # -- speakers --------------------------------------------------------------------------

    @property
    def session(self) -> int:
        """The number of the session whose captions come now (0 before the first)."""
        return self._session

    def begin_session(self) -> None:
        """A new session starts: its speakers are new (the engine numbers them from 1 again, so a
        name given to one of the last session's stays with that session's lines), and the cues
        still open are closed (their words will not go on)."""
        self.cancel_rename()
        self._updating = True
        try:
            cursor = QTextCursor(self.document())
            self._delete_tail(cursor)
            for cue in self._layout.flush():
                self._append_cue(cursor, cue, self._session)
            self._open_speaker.clear()
            self._partials.clear()
            self._session += 1
            self._write_tail(cursor)
        finally:
            self._updating = False
        self._keep_bottom()

    def speaker_name(self, stream: str, speaker: str, session: int | None = None) -> str:
        """What the view calls ``speaker`` of ``stream`` (in ``session``, by default the one
        running): the name the person gave, else the label ("Speaker 2")."""
        return self._names.get((self._session if session is None else session, stream, speaker), speaker)

    def heading(self, voice: Voice) -> str:
        """The text heading a run of ``voice``'s lines: the stream's label, and the speaker's
        name where there is one ("Meeting · Speaker 2")."""
        session, stream, speaker = voice
        return stream + SEPARATOR + self.speaker_name(stream, speaker, session) if speaker else stream

    def rename_speaker(self, stream: str, speaker: str, name: str, session: int | None = None) -> bool:
        """Calls ``speaker`` of ``stream`` (in ``session``, by default the one running) ``name``
        in every line of theirs, those shown already too; an empty ``name`` changes nothing.
        Returns whether the name changed (:attr:`speaker_renamed` then says so)."""
        name = " ".join(name.split())
        if not name or not speaker:
            return False
        voice: Voice = (self._session if session is None else session, stream, speaker)
        if self._names.get(voice, speaker) == name:
            return False
        if name == speaker:
            self._names.pop(voice)
        else:
            self._names[voice] = name
        self._rerender()
        self.speaker_renamed.emit(voice[0], stream, speaker, name)
        return True

    def name_rect(self, stream: str, speaker: str, session: int | None = None) -> QRect | None:
        """Where the last heading naming ``speaker`` of ``stream`` shows the name, in the
        viewport's coordinates (click there to rename); ``None`` where no heading names them."""
        voice: Voice = (self._session if session is None else session, stream, speaker)
        number = self._voice_numbers.get(voice)
        if number is None:
            return None
        href = f"{_SPEAKER_HREF}{number}"
        block = self.document().lastBlock()
        while block.isValid():
            span = _anchor_span(block, href)
            if span is not None:
                return self._span_rect(*span)
            block = block.previous()
        return None

    def rename_last_speaker(self) -> bool:
        """Opens the name editor over the last heading that names a speaker (the keyboard's way
        to rename: F2); returns whether there was one."""
        for voice, position in self._named_headings(reverse=True):
            self.start_rename(voice, position)
            return True
        return False

    def _step_rename(self, step: int) -> None:
        """Moves the open editor to the speaker before (-1) or after (+1) the one edited, in the
        order the session's speakers were first heard; what was typed is dropped."""
        if self._editing is None:
            return
        last_heading: dict[Voice, int] = {}
        for voice, position in self._named_headings():
            last_heading[voice] = position
        voices = [v for v in self._voices if v in last_heading and v[0] == self._editing[0]]
        if len(voices) < 2 or self._editing not in voices:
            return
        voice = voices[(voices.index(self._editing) + step) % len(voices)]
        self.start_rename(voice, last_heading[voice])

    def _named_headings(self, reverse: bool = False):
        """``(voice, position)`` of every speaker's name in a heading, in document order (or
        from the end)."""
        block = self.document().lastBlock() if reverse else self.document().firstBlock()
        while block.isValid():
            it = block.begin()
            found = []
            while not it.atEnd():
                fragment = it.fragment()
                href = fragment.charFormat().anchorHref() if fragment.isValid() else ""
                if href.startswith(_SPEAKER_HREF):
                    found.append((self._voices[int(href[len(_SPEAKER_HREF):])], fragment.position()))
                it += 1
            yield from (reversed(found) if reverse else found)
            block = block.previous() if reverse else block.next()

    def start_rename(self, voice: Voice, position: int) -> None:
        """Opens the name editor over the name of ``voice`` starting at document ``position``."""
        self._editing, self._edit_pos = voice, position
        editor = self.name_editor
        font = QFont(self.document().defaultFont())
        font.setPointSize(max(MIN_FONT_PT, self._label_pt()))
        editor.setFont(font)
        editor.setText(self.speaker_name(*voice[1:], session=voice[0]))
        editor.selectAll()
        self._show_position(position)
        self._place_editor()
        editor.show()
        editor.raise_()
        editor.setFocus(Qt.FocusReason.MouseFocusReason)

    @property
    def renaming(self) -> Voice | None:
        """The speaker whose name is being edited, if any."""
        return self._editing

    def cancel_rename(self) -> None:
        """Closes the name editor and keeps the name as it was."""
        self._editing = None
        if self.name_editor.isVisible():
            self.name_editor.hide()
            self.setFocus(Qt.FocusReason.OtherFocusReason)

    def _save_edit(self) -> None:
        voice, text = self._editing, self.name_editor.text()
        if voice is None:
            return  # Escape closed it already: the focus it gives up finishes nothing
        self.cancel_rename()
        self.rename_speaker(voice[1], voice[2], text, session=voice[0])

    def _place_editor(self) -> None:
        if self._editing is None:
            return
        cursor = QTextCursor(self.document())
        cursor.setPosition(min(self._edit_pos, self.document().characterCount() - 1))
        rect = self.cursorRect(cursor)
        editor = self.name_editor
        metrics = QFontMetrics(editor.font())
        width = max(metrics.horizontalAdvance(editor.text()) + 4 * metrics.averageCharWidth(), 14 * metrics.averageCharWidth())
        width = min(width, max(80, self.viewport().width() - rect.left() - 8))
        height = editor.sizeHint().height()
        editor.setGeometry(max(0, rect.left() - 4), rect.center().y() - height // 2, width, height)

    def _show_position(self, position: int) -> None:
        """Scrolls so that document ``position`` is in view (a heading reached by the keyboard
        may lie above what is shown)."""
        cursor = QTextCursor(self.document())
        cursor.setPosition(min(position, self.document().characterCount() - 1))
        rect = self.cursorRect(cursor)
        if rect.top() < 0 or rect.bottom() > self.viewport().height():
            bar = self.verticalScrollBar()
            bar.setValue(bar.value() + rect.top() - self.viewport().height() // 3)

    def _span_rect(self, start: int, length: int) -> QRect:
        cursor = QTextCursor(self.document())
        cursor.setPosition(start)
        first = self.cursorRect(cursor)
        cursor.setPosition(start + length)
        last = self.cursorRect(cursor)
        return QRect(first.topLeft(), last.bottomRight()).normalized() if last.top() == first.top() else first

    def _voice_number(self, voice: Voice) -> int:
        number = self._voice_numbers.get(voice)
        if number is None:
            number = self._voice_numbers[voice] = len(self._voices)
            self._voices.append(voice)
        return number

    def _voice_at(self, pos) -> tuple[Voice, int] | None:
        """The speaker whose name is under viewport point ``pos``, and where the name starts."""
        href = self.anchorAt(pos)
        if not href.startswith(_SPEAKER_HREF):
            return None
        try:
            voice = self._voices[int(href[len(_SPEAKER_HREF):])]
        except (ValueError, IndexError):
            return None
        span = _anchor_span(self.cursorForPosition(pos).block(), href)
        return voice, (span[0] if span is not None else self.cursorForPosition(pos).position())

    # -- updates ---------------------------------------------------------------------------

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
                        self._add_final(cursor, self._session, update)
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
        self._place_editor()

    def _add_final(self, cursor: QTextCursor, session: int, update: CaptionUpdate) -> None:
        self._finals.append((session, update))
        cues = self._layout.add([update])
        self._open_speaker[update.stream] = update.speaker or ""
        for cue in cues:
            self._append_cue(cursor, cue, session)

    def clear_captions(self) -> None:
        self.cancel_rename()
        self._layout = _new_layout(self._pause_s)
        self._cues.clear()
        self._cue_sessions.clear()
        self._finals.clear()
        self._partials.clear()
        self._recent.clear()
        self._open_speaker.clear()
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

    def _last_voice(self) -> Voice | None:
        return (self._cue_sessions[-1], self._cues[-1].stream, self._cues[-1].speaker) if self._cues else None

    def _open_voice(self, stream: str) -> Voice:
        """Whose the cue being spoken on ``stream`` is: the speaker of its committed words, or
        where there are none yet, the speaker its partial is given (the stream's last one)."""
        if self._layout.open_words(stream):
            return self._session, stream, self._open_speaker.get(stream, "")
        update = self._partials.get(stream)
        return self._session, stream, update.speaker if update is not None else ""

    def _append_cue(self, cursor: QTextCursor, cue: layout.Cue, session: int) -> None:
        cursor.movePosition(QTextCursor.MoveOperation.End)
        self._start_paragraph(cursor, (session, cue.stream, cue.speaker), self._last_voice())
        cursor.insertText(_LINE_BREAK.join(cue.lines), self._fmt_committed())
        self._cues.append(cue)
        self._cue_sessions.append(session)
        self._tail_pos = cursor.position()

    def _start_paragraph(self, cursor: QTextCursor, voice: Voice, previous: Voice | None) -> None:
        """Opens a new paragraph of ``voice`` at the end; ``previous`` is the voice of the
        paragraph before it (None at the top of the view). The heading comes first only when
        the stream or its speaker changes (an unlabelled stream's lines of the next session go
        on under the same heading)."""
        at_top = cursor.position() == 0
        if previous is None or _heading_key(voice) != _heading_key(previous):
            if at_top:
                cursor.setBlockFormat(self._block_label(first=True))
            else:
                cursor.insertBlock(self._block_label(first=False))
            session, stream, speaker = voice
            if speaker:
                cursor.insertText(stream + SEPARATOR, self._fmt_label(stream))
                cursor.insertText(self.speaker_name(stream, speaker, session), self._fmt_name(voice))
            else:
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
        previous = self._last_voice()
        for stream in self._open_streams():
            lines = self.open_lines(stream)
            if not lines:
                continue
            voice = self._open_voice(stream)
            self._start_paragraph(cursor, voice, previous)
            for n, line in enumerate(lines):
                if n:
                    cursor.insertText(_LINE_BREAK, self._fmt_committed())
                for k, word in enumerate(line):
                    sep = "" if not k or word.joined else " "
                    cursor.insertText(sep + word.text, self._fmt_partial() if word.provisional else self._fmt_committed())
            previous = voice

    def _rerender(self) -> None:
        self.cancel_rename()
        finals, partials, session = list(self._finals), dict(self._partials), self._session
        bar = self.verticalScrollBar()
        old_value, follow = bar.value(), self._following
        self._updating = True
        try:
            self.document().clear()
            self._tail_pos = 0
            self._layout = _new_layout(self._pause_s)
            self._cues, self._cue_sessions, self._finals, self._partials = [], [], [], {}
            self._open_speaker = {}
            cursor = QTextCursor(self.document())
            replayed = None
            for at, update in finals:
                if replayed is not None and at != replayed:
                    for cue in self._layout.flush():  # as begin_session closed them
                        self._append_cue(cursor, cue, replayed)
                    self._open_speaker.clear()
                replayed = at
                self._add_final(cursor, at, update)
            if replayed is not None and replayed != session:
                for cue in self._layout.flush():
                    self._append_cue(cursor, cue, replayed)
                self._open_speaker.clear()
            self._partials = partials
            self._write_tail(cursor)
        finally:
            self._updating = False
        bar.setValue(bar.maximum() if follow else min(old_value, bar.maximum()))

    def _keep_bottom(self) -> None:
        if self._following:
            bar = self.verticalScrollBar()
            bar.setValue(bar.maximum())

    # -- scrolling -------------------------------------------------------------------------

    def _on_user_scroll(self, value: int) -> None:
        self._place_editor()  # the editor stays over the name it edits
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
        self._keep_bottom()
        self._place_editor()

    # -- the mouse: a speaker's name is clicked to rename them -----------------------------------

    def mousePressEvent(self, event) -> None:  # noqa: N802
        self._pressed_href = self.anchorAt(event.position().toPoint())
        super().mousePressEvent(event)

    def mouseReleaseEvent(self, event) -> None:  # noqa: N802
        pressed, self._pressed_href = self._pressed_href, ""
        super().mouseReleaseEvent(event)
        pos = event.position().toPoint()
        if event.button() != Qt.MouseButton.LeftButton or not pressed or self.anchorAt(pos) != pressed:
            return
        if self.textCursor().hasSelection():
            return  # a drag that selected text, not a click
        found = self._voice_at(pos)
        if found is not None:
            self.start_rename(*found)

    def mouseMoveEvent(self, event) -> None:  # noqa: N802
        super().mouseMoveEvent(event)
        over_name = self.anchorAt(event.position().toPoint()).startswith(_SPEAKER_HREF)
        self.viewport().setCursor(Qt.CursorShape.PointingHandCursor if over_name else Qt.CursorShape.IBeamCursor)

    def viewportEvent(self, event) -> bool:  # noqa: N802
        if event.type() == QEvent.Type.ToolTip:
            found = self._voice_at(event.pos())
            if found is not None:
                (session, stream, speaker), _ = found
                name = self.speaker_name(stream, speaker, session)
                QToolTip.showText(event.globalPos(), f"Click to rename {name}" if name == speaker
                                  else f"{name} ({speaker}): click to rename", self.viewport())
                return True
        return super().viewportEvent(event)

    def keyPressEvent(self, event) -> None:  # noqa: N802
        if event.key() == Qt.Key.Key_End:
            self.scroll_to_live()
            return
        if event.key() == Qt.Key.Key_F2 and self.rename_last_speaker():
            return
        super().keyPressEvent(event)


def _new_layout(pause_s: float) -> layout.LiveLayout:
    """The view's layout: a speaker is named by a heading line of its own, so a cue's first line
    keeps its full width (no room for a "Speaker 2: " prefix)."""
    return layout.LiveLayout(pause_s, speaker_line=True)


def _heading_key(voice: Voice) -> tuple:
    """What a change of heading is decided on: the stream and, where labelled, the speaker of
    that session (an unlabelled stream keeps its heading from one session to the next)."""
    session, stream, speaker = voice
    return (stream, speaker, session) if speaker else (stream,)


def _anchor_span(block, href: str) -> tuple[int, int] | None:
    """Where the text anchored at ``href`` lies in ``block``: ``(position, length)``."""
    it = block.begin()
    while not it.atEnd():
        fragment = it.fragment()
        if fragment.isValid() and fragment.charFormat().anchorHref() == href:
            return fragment.position(), fragment.length()
        it += 1
    return None
