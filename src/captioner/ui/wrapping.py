"""Wrapping for list rows whose text has long unbroken names (device and file names).

Qt's item views wrap only at spaces, so "en_ami_ES2011a_hs0_40-46s.wav" stays one line and runs
past the edge. :class:`WrapAnywhereDelegate` lets such names break too, by adding zero-width
spaces to the text *as drawn* (the item's own text is left as it is). GUI thread only.
"""

from __future__ import annotations

import re

from PySide6.QtWidgets import QStyledItemDelegate

ZERO_WIDTH_SPACE = "\u200b"
_LONGEST_UNBROKEN = 12
_AFTER_PUNCTUATION = re.compile(r"([_\-./\\:])")
_LONG_RUN = re.compile(r"[^\s\u200b]{" + str(_LONGEST_UNBROKEN) + r"}(?=[^\s\u200b])")


def breakable(text: str) -> str:
    """``text`` with a break opportunity after ``_ - . / \\ :`` and inside any run of more than
    a dozen characters without one, so a line can wrap anywhere in a long name."""
    text = _AFTER_PUNCTUATION.sub(r"\1" + ZERO_WIDTH_SPACE, text)
    return _LONG_RUN.sub(lambda m: m.group(0) + ZERO_WIDTH_SPACE, text)


class WrapAnywhereDelegate(QStyledItemDelegate):
    """Draws and measures an item's text with :func:`breakable` applied (the view must have
    word wrap on)."""

    def initStyleOption(self, option, index) -> None:  # noqa: N802 (Qt name)
        super().initStyleOption(option, index)
        if option.text:
            option.text = breakable(option.text)
