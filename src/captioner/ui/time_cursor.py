"""A time cursor across a recorded run's plots: one vertical line in each, all at the same time.

Drag any of the lines, or click in a plot, and every line moves there; :attr:`TimeCursor.moved`
says where, so the run's captions can follow. GUI thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pyqtgraph as pg
from PySide6.QtCore import QObject, Qt, Signal


class TimeCursor(QObject):
    """Lines in ``plots`` (x-linked plots: their x is the same time)."""

    moved = Signal(float)  # seconds from the run's start

    def __init__(self, plots: Iterable[pg.PlotItem], visible_plots: Callable[[], Iterable[pg.PlotItem]],
                 parent: QObject | None = None) -> None:
        """``visible_plots``: the plots shown now (a click elsewhere does not move the cursor)."""
        super().__init__(parent)
        self._visible_plots = visible_plots
        self._x = 0.0
        self._syncing = False
        self.lines: list[pg.InfiniteLine] = []
        for plot in plots:
            line = pg.InfiniteLine(pos=0.0, angle=90, movable=True)
            line.setZValue(40)
            line.setVisible(False)
            plot.addItem(line, ignoreBounds=True)
            line.sigPositionChanged.connect(self._on_line_moved)
            self.lines.append(line)

    @property
    def x(self) -> float:
        return self._x

    @property
    def visible(self) -> bool:
        return bool(self.lines) and self.lines[0].isVisible()

    def set_visible(self, visible: bool) -> None:
        for line in self.lines:
            line.setVisible(visible)

    def set_color(self, color: str) -> None:
        pen = pg.mkPen(color, width=1.5)
        for line in self.lines:
            line.setPen(pen)
            line.setHoverPen(pg.mkPen(color, width=3))

    def set_x(self, x: float) -> None:
        """Moves every line to ``x`` and emits :attr:`moved`."""
        self._syncing = True
        try:
            for line in self.lines:
                if line.value() != x:
                    line.setValue(x)
        finally:
            self._syncing = False
        self._x = float(x)
        self.moved.emit(self._x)

    def _on_line_moved(self, line: pg.InfiniteLine) -> None:
        if not self._syncing:
            self.set_x(float(line.value()))

    def on_scene_click(self, event) -> None:
        """Connected to the plots' scene ``sigMouseClicked``: a left click in a plot moves the
        cursor to the time clicked."""
        if not self.visible or event.button() != Qt.MouseButton.LeftButton:
            return
        pos = event.scenePos()
        for plot in self._visible_plots():
            view = plot.getViewBox()
            if view.sceneBoundingRect().contains(pos):
                self.set_x(float(view.mapSceneToView(pos).x()))
                event.accept()
                return
