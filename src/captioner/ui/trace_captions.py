"""A recorded run's committed captions, beside its plots, following the plots' time cursor.

Each caption is placed at the time it was shown in the run (seconds from its start, the plots'
x). Like the live view, a stream's name heads each run of its lines, once. Moving the cursor
selects the last caption shown by then and scrolls it into view; clicking a caption moves the
cursor to it (:attr:`TraceCaptions.time_picked`). GUI thread only.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import QAbstractItemView, QListWidget, QListWidgetItem

from captioner.ui.wrapping import WrapAnywhereDelegate

_INDEX_ROLE = Qt.ItemDataRole.UserRole


@dataclass(frozen=True)
class TraceCaption:
    time_s: float  # when it was shown, from the run's start
    stream: str
    text: str


def _clock(seconds: float) -> str:
    s = max(0.0, seconds)
    return f"{int(s // 60)}:{s % 60:04.1f}"


class TraceCaptions(QListWidget):
    """GUI thread only."""

    time_picked = Signal(float)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("traceCaptions")
        self.setWordWrap(True)
        self.setItemDelegate(WrapAnywhereDelegate(self))
        self.setTextElideMode(Qt.TextElideMode.ElideNone)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setResizeMode(QListWidget.ResizeMode.Adjust)
        self.setUniformItemSizes(False)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.captions: list[TraceCaption] = []
        self._times: list[float] = []
        self._items: list[QListWidgetItem] = []
        self.itemClicked.connect(self._on_clicked)

    def set_captions(self, captions: Sequence[TraceCaption], stream_color: Callable[[str], str]) -> None:
        """Lists ``captions`` in time order, each run of one stream under its name."""
        self.clear()
        self.captions = sorted(captions, key=lambda c: c.time_s)
        self._times = [c.time_s for c in self.captions]
        self._items = []
        previous = None
        for index, caption in enumerate(self.captions):
            if caption.stream != previous:
                header = QListWidgetItem(caption.stream)
                header.setFlags(Qt.ItemFlag.ItemIsEnabled)
                font = QFont(self.font())
                font.setBold(True)
                header.setFont(font)
                header.setForeground(QBrush(QColor(stream_color(caption.stream))))
                self.addItem(header)
                previous = caption.stream
            item = QListWidgetItem(f"{_clock(caption.time_s)}   {caption.text}")
            item.setData(_INDEX_ROLE, index)
            self.addItem(item)
            self._items.append(item)
        if not self.captions:
            note = QListWidgetItem("No committed captions in this run.")
            note.setFlags(Qt.ItemFlag.NoItemFlags)
            self.addItem(note)

    def index_at(self, time_s: float) -> int | None:
        """The last caption shown at or before ``time_s`` (None before the first)."""
        i = bisect.bisect_right(self._times, time_s) - 1
        return i if i >= 0 else None

    def follow(self, time_s: float) -> int | None:
        """Selects the caption shown by ``time_s`` and scrolls it into view; returns its index."""
        index = self.index_at(time_s)
        if index is None:
            self.clearSelection()
            self.setCurrentItem(None)
            self.scrollToTop()
            return None
        item = self._items[index]
        if self.currentItem() is not item:
            self.setCurrentItem(item)
            self.scrollToItem(item, QAbstractItemView.ScrollHint.PositionAtCenter)
        return index

    def current_index(self) -> int | None:
        item = self.currentItem()
        return None if item is None else item.data(_INDEX_ROLE)

    def _on_clicked(self, item: QListWidgetItem) -> None:
        index = item.data(_INDEX_ROLE)
        if index is not None:
            self.time_picked.emit(self.captions[index].time_s)
