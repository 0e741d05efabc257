"""History: the session's committed captions, searchable, exportable as TXT, SRT or VTT.

Export goes through :mod:`captioner.formats`, the same writers the CLI uses. (The transcript on
disk is written by the engine's transcript writer as each caption is committed; this panel only
exports on request.) A speaker the person named in the caption view is called by that name here
and in the exports (:attr:`HistoryPanel.speaker_name`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from captioner import formats
from captioner.events import CaptionUpdate

EXPORT_FORMATS = {"txt": "Plain text (*.txt)", "srt": "SubRip subtitles (*.srt)", "vtt": "WebVTT subtitles (*.vtt)"}


def _clock(seconds: float) -> str:
    s = int(max(0.0, seconds))
    return f"{s // 3600:d}:{s // 60 % 60:02d}:{s % 60:02d}"


class HistoryPanel(QWidget):
    """GUI thread only."""

    exported = Signal(str)

    def __init__(self, parent=None, pause_s: float = 0.5) -> None:
        super().__init__(parent)
        self.pause_s = pause_s
        """The engine's pause: where a cue may end (:mod:`captioner.layout`)."""
        self._finals: list[CaptionUpdate] = []
        self._sessions: list[int] = []  # the session of each of _finals
        self.speaker_name: Callable[[str, str, int], str] | None = None
        """``(stream, speaker, session) -> name``: what a labelled speaker is called (the caption
        view's names); ``None``: the labels."""
        self.search_edit = QLineEdit()
        self.search_edit.setPlaceholderText("Search the transcript…")
        self.search_edit.setClearButtonEnabled(True)
        self.search_edit.textChanged.connect(self._refilter)
        self.results = QListWidget()
        self.results.setWordWrap(True)
        self.results.setObjectName("historyList")
        self.count_label = QLabel()
        self.transcript_label = QLabel()
        self.transcript_label.setWordWrap(True)
        self.transcript_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        row = QHBoxLayout()
        for fmt in EXPORT_FORMATS:
            button = QPushButton(f"Export {fmt.upper()}…")
            button.clicked.connect(lambda _=False, f=fmt: self.export_dialog(f))
            row.addWidget(button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.search_edit)
        layout.addWidget(self.results, 1)
        layout.addWidget(self.count_label)
        layout.addLayout(row)
        layout.addWidget(self.transcript_label)
        self._refilter()

    @property
    def finals(self) -> list[CaptionUpdate]:
        return list(self._finals)

    def set_transcript_path(self, path: str | None) -> None:
        self.transcript_label.setText(f"Saved as committed to: {path}" if path else "")

    def add_updates(self, updates: list[CaptionUpdate], session: int = 0) -> None:
        """The committed ones of ``updates``, of session number ``session`` (whose speakers are
        its own: :attr:`speaker_name` is asked with it)."""
        new = [u for u in updates if u.kind == "final" and u.text.strip()]
        if not new:
            return
        self._finals.extend(new)
        self._sessions.extend([session] * len(new))
        query = self.search_edit.text().strip().lower()
        for update in new:
            named = self._named(update, session)
            if self._matches(named, query):
                self._add_item(named)
        self._update_count()

    def clear(self) -> None:
        self._finals.clear()
        self._sessions.clear()
        self._refilter()

    def refresh_names(self) -> None:
        """A speaker was renamed: the list (and the next export) says the new name."""
        self._refilter()

    def named_finals(self) -> list[CaptionUpdate]:
        """The committed captions, each labelled speaker as :attr:`speaker_name` calls them."""
        return [self._named(u, session) for u, session in zip(self._finals, self._sessions)]

    def _named(self, update: CaptionUpdate, session: int) -> CaptionUpdate:
        if not update.speaker or self.speaker_name is None:
            return update
        name = self.speaker_name(update.stream, update.speaker, session)
        return update if name == update.speaker else replace(update, speaker=name)

    @staticmethod
    def _matches(update: CaptionUpdate, query: str) -> bool:
        return not query or query in update.text.lower() or (bool(update.speaker) and query in update.speaker.lower())

    def matches(self) -> list[CaptionUpdate]:
        return [self.results.item(i).data(Qt.ItemDataRole.UserRole) for i in range(self.results.count())]

    def _add_item(self, update: CaptionUpdate) -> None:
        who = f"{update.stream} ({update.speaker})" if update.speaker else update.stream
        item = QListWidgetItem(f"{_clock(update.start_s)}  {who}: {update.text.strip()}")
        item.setData(Qt.ItemDataRole.UserRole, update)
        self.results.addItem(item)

    def _refilter(self) -> None:
        query = self.search_edit.text().strip().lower()
        self.results.clear()
        for update in self.named_finals():
            if self._matches(update, query):
                self._add_item(update)
        self._update_count()

    def _update_count(self) -> None:
        total = len(self._finals)
        shown = self.results.count()
        self.count_label.setText(f"{total} captions" if shown == total else f"{shown} of {total} captions match")

    def export(self, path: str | os.PathLike, fmt: str) -> int:
        """Writes the committed captions to ``path`` in ``fmt`` (txt, srt, vtt), laid out as
        cues for reading (every stream named where there are several); returns the cue count."""
        finals = self.named_finals()
        several = len({u.stream for u in finals}) > 1
        captions = formats.laid_out(finals, self.pause_s, label_streams=several)
        formats.write_captions(captions, path, fmt, label_streams=several)
        self.exported.emit(str(path))
        return len(captions)

    def export_dialog(self, fmt: str) -> None:
        path, _ = QFileDialog.getSaveFileName(self, f"Export captions as {fmt.upper()}", f"captions.{fmt}",
                                              EXPORT_FORMATS[fmt])
        if not path:
            return
        try:
            self.export(path, fmt)
        except OSError as exc:
            QMessageBox.warning(self, "Export failed", f"Could not write {path}: {exc.strerror or exc}")
