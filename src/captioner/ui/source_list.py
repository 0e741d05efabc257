"""The source list: what can be captioned, in groups, each source ticked to caption it.

Groups ("Microphones", "Meeting audio", "Files") are header rows that cannot be ticked; a group
with nothing in it says so in one dim row ("none found …"), so a missing microphone is visible
instead of being offered as a default that does not exist. Names wrap rather than scroll
sideways: device and file names are long and must be read in full in a narrow panel.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QAbstractItemView, QListWidget, QListWidgetItem

from captioner.ui.run_config import SourceChoice
from captioner.ui.wrapping import WrapAnywhereDelegate

_CHOICE_ROLE = Qt.ItemDataRole.UserRole


@dataclass(frozen=True)
class SourceGroup:
    """One group of the list: its title, its sources, and what to say when it has none
    (``""``: the group is left out when empty)."""

    title: str
    choices: tuple[SourceChoice, ...]
    when_empty: str = ""


def describe(choice: SourceChoice) -> str:
    """The tooltip of a source: which caption label it gets and what it opens."""
    if choice.kind == "file":
        opens = choice.path or "?"
    elif choice.device is None:
        opens = "the system's default input"
    else:
        opens = f"input {choice.device}"
    return f"Captions labelled “{choice.stream}” · {opens}"


class SourceList(QListWidget):
    """GUI thread only. Rows hold their :class:`SourceChoice` (headers and notes hold none)."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("sourceList")
        self.setWordWrap(True)
        self.setItemDelegate(WrapAnywhereDelegate(self))  # long names without spaces wrap too
        self.setTextElideMode(Qt.TextElideMode.ElideNone)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        # Item heights depend on the width once names wrap: lay them out again on every resize.
        self.setResizeMode(QListWidget.ResizeMode.Adjust)
        self.setUniformItemSizes(False)
        self.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.setSpacing(1)

    def show_groups(self, groups: Sequence[SourceGroup], checked_keys: Iterable[str]) -> None:
        """Lists ``groups``; the sources whose key is in ``checked_keys`` are ticked."""
        checked = set(checked_keys)
        self.clear()
        for group in groups:
            if not group.choices and not group.when_empty:
                continue
            self._add_header(group.title)
            for choice in group.choices:
                self.add_choice(choice, choice.key() in checked)
            if not group.choices:
                self.add_note(group.when_empty)

    def add_choice(self, choice: SourceChoice, checked: bool, group_title: str | None = None) -> None:
        """Adds a source at the end of the list (under a new ``group_title`` header when the list
        has no such group yet)."""
        if group_title is not None and not self._has_header(group_title):
            self._add_header(group_title)
        item = QListWidgetItem(choice.label)
        item.setData(_CHOICE_ROLE, choice)
        item.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsUserCheckable)
        item.setCheckState(Qt.CheckState.Checked if checked else Qt.CheckState.Unchecked)
        item.setToolTip(describe(choice))
        self.addItem(item)

    def _add_header(self, title: str) -> None:
        item = QListWidgetItem(title)
        item.setFlags(Qt.ItemFlag.ItemIsEnabled)  # neither tickable nor selectable
        font = QFont(self.font())
        font.setBold(True)
        item.setFont(font)
        item.setData(Qt.ItemDataRole.AccessibleDescriptionRole, "group")
        self.addItem(item)

    def _has_header(self, title: str) -> bool:
        return any(self.item(i).data(_CHOICE_ROLE) is None and self.item(i).text() == title
                   for i in range(self.count()))

    def add_note(self, text: str) -> None:
        item = QListWidgetItem(text)
        item.setFlags(Qt.ItemFlag.NoItemFlags)  # drawn dim: there is nothing to pick here
        font = QFont(self.font())
        font.setItalic(True)
        item.setFont(font)
        self.addItem(item)

    # -- reading and ticking ---------------------------------------------------------------

    def source_items(self) -> list[QListWidgetItem]:
        return [self.item(i) for i in range(self.count()) if self.item(i).data(_CHOICE_ROLE) is not None]

    def choices(self) -> list[SourceChoice]:
        return [item.data(_CHOICE_ROLE) for item in self.source_items()]

    def checked(self) -> list[SourceChoice]:
        return [item.data(_CHOICE_ROLE) for item in self.source_items()
                if item.checkState() == Qt.CheckState.Checked]

    def set_checked(self, keys: Iterable[str]) -> None:
        """Ticks exactly the sources whose key is in ``keys``."""
        wanted = set(keys)
        for item in self.source_items():
            on = item.data(_CHOICE_ROLE).key() in wanted
            item.setCheckState(Qt.CheckState.Checked if on else Qt.CheckState.Unchecked)

    def texts(self) -> list[str]:
        """Every row as shown, headers and notes included (for tests and accessibility)."""
        return [self.item(i).text() for i in range(self.count())]
