"""Small pyqtgraph parts of the dashboard's plots: an axis of whole numbers, and a legend that
sits under a plot instead of over its curves.

GUI thread only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

import pyqtgraph as pg
from PySide6.QtGui import QTextOption
from PySide6.QtWidgets import QGraphicsTextItem, QSizePolicy

LEGEND_PT = 8
LEGEND_ROW = 4  # PlotItem's own grid: title 0, top axis 1, view 2, bottom axis 3; 4 is free


class IntegerAxis(pg.AxisItem):
    """An axis for counts (dropped frames, streams, batch size): ticks only at whole numbers,
    labelled without decimals, so a count of 0 never reads "-0.4"."""

    def tickValues(self, minVal, maxVal, size):  # noqa: N802 (pyqtgraph's name)
        low, high = math.ceil(min(minVal, maxVal)), math.floor(max(minVal, maxVal))
        if high < low:
            return [(1.0, [])]
        # About one tick per 25 px, at a step of 1, 2 or 5 times a power of ten (never below 1).
        wanted = max(2, int(size / 25))
        raw = max(1.0, (high - low) / wanted)
        power = 10 ** math.floor(math.log10(raw))
        step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
        first = math.ceil(low / step) * step
        return [(float(step), [float(v) for v in range(int(first), int(high) + 1, int(step))])]

    def tickStrings(self, values, scale, spacing):  # noqa: N802
        return [f"{round(v * scale):d}" for v in values]


def fit_count_range(plot: pg.PlotItem, values: Sequence[float], current_top: float | None) -> float:
    """Sets a count plot's y range to 0..the largest value (at least 1); returns the top used.
    Only touches the plot when the top changes (a range change re-lays out the axis)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    top = float(max(1, math.ceil(max(finite)))) if finite else 1.0
    if top != current_top:
        plot.setYRange(0, top, padding=0.08)
    return top


class PlotLegend(pg.GraphicsWidget):
    """A row of "sample name" entries under a plot's x axis; wraps between entries when the
    plot is narrow, never overlapping a curve."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.item = QGraphicsTextItem(self)
        self.item.document().setDocumentMargin(1)
        option = QTextOption()
        option.setWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.item.document().setDefaultTextOption(option)
        # Any width the grid gives it (long stream names must not widen their column); as
        # tall as its lines.
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self.entries: tuple[str, ...] = ()
        self._html = ""

    def set_entries(self, entries: Sequence[tuple[str, str, bool]], text_color: str) -> None:
        """``entries``: ``(name, colour, dashed)`` per curve, in order."""
        self.entries = tuple(name for name, _, _ in entries)
        parts = []
        for name, color, dashed in entries:
            sample = "╍╍" if dashed else "━━"  # box drawing: no line break inside, unlike "- -"
            # No break inside an entry; the space between entries may break.
            parts.append(f'<span style="color:{color}">{sample}</span>&nbsp;{escape(name).replace(" ", "&nbsp;")}')
        html = f'<span style="color:{text_color}; font-size:{LEGEND_PT}pt">{"&nbsp;&nbsp; ".join(parts)}</span>'
        if html != self._html:
            self._html = html
            self.item.setHtml(html)
            self._fit()

    def text(self) -> str:
        return self.item.toPlainText()

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt name)
        super().resizeEvent(event)
        self._fit()

    def _fit(self) -> None:
        width = self.size().width()
        if width > 0:
            self.item.setTextWidth(width)
        height = self.item.boundingRect().height() if self.entries else 0.0
        if height != self.minimumHeight():
            self.setMinimumHeight(height)
            self.setMaximumHeight(height)
            self.updateGeometry()


def add_legend(plot: pg.PlotItem) -> PlotLegend:
    """A :class:`PlotLegend` in the free row under ``plot``'s x axis."""
    legend = PlotLegend(plot)
    plot.layout.addItem(legend, LEGEND_ROW, 1)
    return legend
