"""The performance dashboard: rolling 60 s plots of the pipeline and the GPU (pyqtgraph).

Every curve is one PlotDataItem created once and updated with ``setData``; values arrive into
bounded NumPy rings (:class:`RollingSeries`) from the GUI timer, and :meth:`Dashboard.refresh`
redraws only when something new arrived, so the cost follows the data rate (a few Hz), capped by
the timer (~30 Hz). Without an NVIDIA GPU the GPU plots, which would have nothing to show, are
left out and one line of text says so; the CPU-load plot carries on. Legends sit under the
plots, never on the curves; counts (dropped frames, streams, batch size) have whole-number axes.
A recorded run (:mod:`captioner.trace`) is shown with the same plots over its whole length, its
committed captions beside them, following a time cursor.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt, QTimer
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from captioner.events import (
    MIN_FREE_VRAM_FRACTION,
    CaptionUpdate,
    PipelineStatus,
    TelemetrySample,
)
from captioner.trace import Trace, caption_latency_s
from captioner.ui.plot_parts import IntegerAxis, PlotLegend, add_legend, fit_count_range
from captioner.ui.theme import DARK, Theme
from captioner.ui.time_cursor import TimeCursor
from captioner.ui.trace_captions import TraceCaption, TraceCaptions

VRAM_FREE_FLOOR = MIN_FREE_VRAM_FRACTION  # the engine refuses new streams below it

WINDOW_S = 60.0
TEMP_ALARM_C = 83.0
GIB = float(1 << 30)
MAX_LEVEL_STREAMS = 4
PLOT_MIN_INTERVAL_S = 0.5
"""Plots redraw at most twice a second, the telemetry rate: on a 60 s plot half a second is a few
pixels, and each redraw of thirteen plots is costly in software rendering (docs/ui.md, "What the
dashboard costs"). The caption view still follows the 30 Hz pump."""
NA = "N/A"
NO_GPU = "no GPU"
MAX_COLUMNS = 5
DEFAULT_COLUMNS = 4  # before the widget has a size: what a usual window gets, so it rarely changes
MIN_PLOT_WIDTH_PX = 280  # room for a plot's title and its current value side by side
VALUE_PT = 8.0  # the current value, a notch under the title
PLOT_ASPECT = 1.8  # width / height a plot reads best at
TRACE_PANEL_MIN_PX = 280  # the run's captions beside its plots
TRACE_PANEL_MAX_PX = 380


class RollingSeries:
    """Time/value pairs in a bounded ring; NaN marks N/A (drawn as a gap)."""

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        # Twice the capacity so that trimming is one copy every `capacity` appends.
        self._t = np.empty(2 * capacity, dtype=np.float64)
        self._v = np.empty(2 * capacity, dtype=np.float64)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def append(self, t: float, value: float | None) -> None:
        if self._n == self._t.shape[0]:
            keep = self.capacity
            self._t[:keep] = self._t[self._n - keep:self._n]
            self._v[:keep] = self._v[self._n - keep:self._n]
            self._n = keep
        self._t[self._n] = t
        self._v[self._n] = math.nan if value is None else float(value)
        self._n += 1

    def clear(self) -> None:
        self._n = 0

    def since(self, t_min: float) -> tuple[np.ndarray, np.ndarray]:
        t = self._t[:self._n]
        start = int(np.searchsorted(t, t_min, side="left"))
        return t[start:], self._v[start:self._n]

    def last(self) -> float | None:
        if self._n == 0:
            return None
        v = self._v[self._n - 1]
        return None if math.isnan(v) else float(v)


@dataclass(frozen=True)
class CurveSpec:
    key: str
    name: str
    color: int  # index into the theme's curve colours; -1 = alarm colour
    dashed: bool = False
    width: float = 2.0


@dataclass(frozen=True)
class PlotSpec:
    key: str
    title: str
    unit: str
    curves: tuple[CurveSpec, ...]
    gpu: bool = False
    integer: bool = False  # a count: whole-number axis from 0


PLOTS: tuple[PlotSpec, ...] = (
    PlotSpec("frame", "Frame latency", "ms", (CurveSpec("frame_latency_ms", "frame", 0),)),
    PlotSpec("step", "Model step", "ms", (CurveSpec("step_latency_ms", "step", 1),)),
    PlotSpec("caption", "Caption latency", "s", (
        CurveSpec("caption_partial_s", "shown", 0), CurveSpec("caption_final_s", "committed", 1))),
    PlotSpec("vram", "VRAM", "GiB", (
        CurveSpec("vram_process_gib", "process", 0), CurveSpec("vram_used_gib", "used", 1),
        CurveSpec("vram_total_gib", "total", 2, dashed=True),
        CurveSpec("vram_floor_gib", "15% free", -1, dashed=True, width=1.5)), gpu=True),
    PlotSpec("temp", "GPU temperature", "°C", (CurveSpec("temperature_c", "temp", 1),), gpu=True),
    PlotSpec("power", "Power", "W", (
        CurveSpec("power_w", "draw", 1), CurveSpec("power_limit_w", "limit", -1, dashed=True, width=1.5)), gpu=True),
    PlotSpec("sm_clock", "SM clock", "MHz", (CurveSpec("sm_clock_mhz", "SM", 3),), gpu=True),
    PlotSpec("util", "GPU utilisation", "%", (CurveSpec("utilization_pct", "util", 2),), gpu=True),
    PlotSpec("cpu", "CPU load", "%", (
        CurveSpec("cpu_pct", "machine", 0), CurveSpec("process_cpu_pct", "captioner (per core)", 1))),
    PlotSpec("level", "Input level", "dBFS", tuple(
        CurveSpec(f"level_{i}", f"stream {i}", i) for i in range(MAX_LEVEL_STREAMS))),
    PlotSpec("dropped", "Dropped frames", "", (CurveSpec("dropped_frames", "dropped", -1),), integer=True),
    PlotSpec("rtf", "Real-time factor", "×", (CurveSpec("real_time_factor", "RTF", 4),)),
    PlotSpec("load", "Streams · batch size", "", (
        CurveSpec("stream_count", "streams", 0), CurveSpec("batch_size", "batch", 1, dashed=True)), integer=True),
)
GPU_PLOT_NAMES = "VRAM, temperature, power, SM clock, utilisation"  # the plots with gpu=True

_STATUS_KEYS = ("frame_latency_ms", "step_latency_ms", "dropped_frames", "real_time_factor", "batch_size")
_TELEMETRY_KEYS = ("temperature_c", "power_w", "power_limit_w", "sm_clock_mhz", "utilization_pct",
                   "cpu_pct", "process_cpu_pct")
# (curve in GiB, TelemetrySample field in bytes)
_VRAM_KEYS = (("vram_process_gib", "vram_process_bytes"), ("vram_used_gib", "vram_used_bytes"),
              ("vram_total_gib", "vram_total_bytes"))


def _vram_floor_gib(total_bytes):
    """Used VRAM at which the engine refuses new streams (a number, or an array of them)."""
    return (1 - VRAM_FREE_FLOOR) * total_bytes / GIB


def _curve_color(theme: Theme, spec: CurveSpec) -> str:
    return theme.alarm if spec.color < 0 else theme.curve_colors[spec.color % len(theme.curve_colors)]


def _fmt(value: float | None, unit: str, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return NA
    return f"{value:.{digits}f}{unit}"


def percentile(values: np.ndarray, q: float) -> float | None:
    finite = values[np.isfinite(values)]
    return float(np.percentile(finite, q)) if finite.size else None


def _of(value: float | None, limit: float | None, unit: str, digits: int = 0) -> str:
    """"value / limit unit"; just "N/A" when neither could be read (never "N/A/N/A")."""
    if value is None and limit is None:
        return NA
    return f"{_fmt(value, '', digits)} / {_fmt(limit, unit, digits)}"


def telemetry_readout(sample: TelemetrySample | None, gpu_plots_shown: bool = False) -> str:
    """One line of current GPU and CPU figures, "N/A" for each value that could not be read;
    without an NVIDIA GPU it says so once, instead of a row of N/As (``gpu_plots_shown``: they
    are on screen anyway, for a GPU run compared with this one)."""
    if sample is None:
        return "GPU: waiting for telemetry…"
    cpu = f"CPU {_fmt(sample.cpu_pct, ' %')} (captioner {_fmt(sample.process_cpu_pct, ' %')})"
    if sample.gpu_name is None:
        if gpu_plots_shown:
            return f"No NVIDIA GPU in this run: captioning ran on the CPU (the GPU plots are the compared run's)  ·  {cpu}"
        return f"No NVIDIA GPU: captioning runs on the CPU, so the GPU plots ({GPU_PLOT_NAMES}) are left out  ·  {cpu}"

    def gib(b: float | None) -> float | None:
        return None if b is None else b / GIB

    parts = [
        f"GPU: {sample.gpu_name}",
        f"temp {_fmt(sample.temperature_c, ' °C')}"
        + (f" (slowdown {_fmt(sample.slowdown_temp_c, ' °C')})" if sample.slowdown_temp_c is not None else ""),
        f"power {_of(sample.power_w, sample.power_limit_w, ' W')}",
        f"SM {_fmt(sample.sm_clock_mhz, ' MHz')}",
        f"util {_fmt(sample.utilization_pct, ' %')}",
        f"VRAM {_of(gib(sample.vram_used_bytes), gib(sample.vram_total_bytes), ' GiB', 1)}"
        f" (process {_fmt(gib(sample.vram_process_bytes), ' GiB', 2)})",
        cpu,
    ]
    return "  ·  ".join(parts)


def trace_curves(trace: Trace) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], tuple[str, ...]]:
    """Every dashboard curve of a recorded run, x in seconds from its start; and its streams."""
    curves: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for key in _TELEMETRY_KEYS:
        curves[key] = trace.telemetry_series(key)
    for key, attr in _VRAM_KEYS:
        t, v = trace.telemetry_series(attr)
        curves[key] = (t, v / GIB)
    t, total = trace.telemetry_series("vram_total_bytes")
    curves["vram_floor_gib"] = (t, _vram_floor_gib(total))
    for key in _STATUS_KEYS:
        curves[key] = trace.status_series(key)
    t_counts, _ = trace.status_series("batch_size")
    curves["stream_count"] = (t_counts, np.array([len(s.streams) for s in trace.statuses], dtype=np.float64))
    streams: tuple[str, ...] = ()
    for status in trace.statuses:
        if status.streams:
            streams = tuple(status.streams[:MAX_LEVEL_STREAMS])
            break
    t0 = trace.start_s()
    t_status = np.array([s.time_s - t0 for s in trace.statuses], dtype=np.float64)
    for i in range(len(streams)):
        v = np.array([s.input_levels_dbfs[i] if i < len(s.input_levels_dbfs) else np.nan for s in trace.statuses],
                     dtype=np.float64)
        v[~np.isfinite(v)] = np.nan
        curves[f"level_{i}"] = (t_status, v)
    for kind, key in (("partial", "caption_partial_s"), ("final", "caption_final_s")):
        # A caption carries wall time since its stream started, which is about the run's start.
        chosen = [c for c in trace.captions if c.kind == kind and c.text.strip()]
        curves[key] = (np.array([c.emitted_wall_s for c in chosen], dtype=np.float64),
                       np.array([caption_latency_s(c) for c in chosen], dtype=np.float64))
    return curves, streams


def trace_caption_entries(trace: Trace) -> list[TraceCaption]:
    """A recorded run's committed captions at the time they were shown (the caption-latency
    plot's x: seconds since the stream started, which is about the run's start)."""
    return [TraceCaption(c.emitted_wall_s, c.stream, " ".join(c.text.split()))
            for c in trace.final_captions() if c.text.strip()]


def grid_columns(count: int, width_px: float | None = None, height_px: float | None = None) -> int:
    """Columns for ``count`` plots in a ``width_px`` × ``height_px`` area: the plots as large as
    possible at about :data:`PLOT_ASPECT`, none narrower than :data:`MIN_PLOT_WIDTH_PX` (its
    title and value must fit side by side); rows filled evenly (13 plots in 4 columns: 4+4+4+1,
    but 8 in 4: 4+4). Without a size, :data:`DEFAULT_COLUMNS` at most."""
    if count <= 0:
        return 1
    if width_px is None or height_px is None:
        most = DEFAULT_COLUMNS
    else:
        fitting = [c for c in range(1, MAX_COLUMNS + 1) if width_px / c >= MIN_PLOT_WIDTH_PX] or [1]

        def plot_size(columns: int) -> float:
            rows = math.ceil(count / columns)
            return min(width_px / columns / PLOT_ASPECT, height_px / rows)

        most = max(fitting, key=plot_size)
    rows = math.ceil(count / most)
    return math.ceil(count / rows)


def _centre(label: pg.TextItem, view_box: pg.ViewBox) -> None:
    box = view_box.boundingRect()
    label.setPos(box.width() / 2, box.height() / 2)


class Dashboard(QWidget):
    """GUI thread only: feed it with :meth:`add_status`, :meth:`add_telemetry`,
    :meth:`add_captions`, and call :meth:`refresh` from a timer."""

    def __init__(self, theme: Theme = DARK, window_s: float = WINDOW_S, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("dashboard")
        self.window_s = window_s
        self._theme = theme
        self._series: dict[str, RollingSeries] = {}
        self._dirty = False
        self._now_s: float | None = None
        self._latest_sample: TelemetrySample | None = None
        self._level_streams: tuple[str, ...] = ()
        self._legend_level_names: tuple[str, ...] = ()
        self._gpu_present: bool | None = None
        self.trace: Trace | None = None
        self.redraws = 0
        self.min_interval_s = PLOT_MIN_INTERVAL_S
        self._last_redraw_s = -math.inf
        self._title_values: dict[str, str] = {}
        self._count_tops: dict[str, float | None] = {}
        self._shown_keys: tuple[str, ...] = ()
        self._columns = 0
        self._compared_gpu = False  # a run drawn for comparison has GPU telemetry

        self.readout = QLabel(telemetry_readout(None))
        self.readout.setObjectName("telemetryReadout")
        self.readout.setWordWrap(True)
        self.mode_label = QLabel(f"Live · last {window_s:.0f} s (x axis: seconds from now)")
        self.live_button = QPushButton("Back to live")
        self.live_button.setVisible(False)
        self.live_button.clicked.connect(self.show_live)
        top = QHBoxLayout()
        top.addWidget(self.mode_label)
        top.addStretch(1)
        top.addWidget(self.live_button)

        pg.setConfigOptions(antialias=False)  # antialiasing costs CPU on every redraw
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setObjectName("dashboardPlots")
        self.graphics.installEventFilter(self)
        self.plots: dict[str, pg.PlotItem] = {}
        self.curves: dict[str, pg.PlotDataItem] = {}
        self.na_labels: dict[str, pg.TextItem] = {}
        self.value_labels: dict[str, pg.TextItem] = {}
        self.legends: dict[str, PlotLegend] = {}
        self.compare_curves: dict[str, pg.PlotDataItem] = {}
        self._build_plots()
        self.cursor = TimeCursor(self.plots.values(), lambda: [self.plots[k] for k in self._shown_keys], self)
        self.graphics.scene().sigMouseClicked.connect(self.cursor.on_scene_click)

        # A recorded run's captions, beside its plots (hidden while live).
        self.trace_captions = TraceCaptions()
        self.trace_panel = QWidget()
        self.trace_panel.setObjectName("traceCaptionsPanel")
        panel_layout = QVBoxLayout(self.trace_panel)
        panel_layout.setContentsMargins(0, 0, 0, 0)
        self.trace_panel_title = QLabel("Captions of the run: drag the cursor in a plot, or click a line")
        self.trace_panel_title.setWordWrap(True)
        panel_layout.addWidget(self.trace_panel_title)
        panel_layout.addWidget(self.trace_captions, 1)
        self.trace_panel.setVisible(False)
        self.trace_panel.setMinimumWidth(200)
        self.cursor.moved.connect(self.trace_captions.follow)
        self.trace_captions.time_picked.connect(self.cursor.set_x)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(self.graphics)
        self.splitter.addWidget(self.trace_panel)
        self.splitter.setStretchFactor(0, 3)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setChildrenCollapsible(False)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(top)
        layout.addWidget(self.readout)
        layout.addWidget(self.splitter, 1)
        self.set_theme(theme)

    # -- construction ----------------------------------------------------------------------

    def _build_plots(self) -> None:
        first: pg.PlotItem | None = None
        for spec in PLOTS:
            axes = {"left": IntegerAxis("left")} if spec.integer else None
            plot = pg.PlotItem(axisItems=axes)
            plot.setMenuEnabled(False)
            plot.hideButtons()
            # No grid: pyqtgraph draws a line per tick of every level, which in software
            # rendering cost two thirds of each redraw (benchmarks/bench_dashboard.py).
            plot.setClipToView(True)
            plot.setDownsampling(auto=True, mode="peak")
            plot.setXRange(-self.window_s, 0, padding=0)
            if spec.integer:
                self._count_tops[spec.key] = fit_count_range(plot, [], None)
            else:
                plot.enableAutoRange(axis="y")
            plot.getAxis("bottom").setHeight(20)
            plot.getAxis("left").setWidth(50)  # room for "1980.5": a flat clock curve zooms to decimals
            if first is None:
                first = plot
            else:
                plot.setXLink(first)
            if len(spec.curves) > 1:
                self.legends[spec.key] = add_legend(plot)
            for curve_spec in spec.curves:
                item = plot.plot(connect="finite")
                if curve_spec.key.startswith("caption_"):
                    item.setSymbol("o")  # one point per caption: sparse, so mark each
                    item.setSymbolSize(5)
                self.curves[curve_spec.key] = item
            value = pg.TextItem("", anchor=(1, 0))
            font = QFont(value.textItem.font())
            font.setPointSizeF(VALUE_PT)  # a notch under the title's: both fit one row of a narrow plot
            value.setFont(font)
            value.setParentItem(plot)
            value.setZValue(60)
            self.value_labels[spec.key] = value
            plot.geometryChanged.connect(self._place_value_labels)
            na = pg.TextItem("", anchor=(0.5, 0.5))
            na.setParentItem(plot.getViewBox())
            na.setZValue(50)
            self.na_labels[spec.key] = na
            plot.getViewBox().sigResized.connect(lambda vb, label=na: _centre(label, vb))
            self.plots[spec.key] = plot
        self._arrange([spec.key for spec in PLOTS])
        temp = self.plots["temp"]
        self.temp_alarm_line = pg.InfiniteLine(pos=TEMP_ALARM_C, angle=0, movable=False,
                                               label=f"{TEMP_ALARM_C:.0f} °C", labelOpts={"position": 0.08})
        self.slowdown_line = pg.InfiniteLine(pos=0, angle=0, movable=False, label="slowdown",
                                             labelOpts={"position": 0.5})
        self.slowdown_line.setVisible(False)
        temp.addItem(self.temp_alarm_line, ignoreBounds=False)
        temp.addItem(self.slowdown_line, ignoreBounds=True)
        # Percentages have a natural scale; a fixed range also spares re-rendering the axis.
        self.plots["util"].setYRange(0, 100, padding=0.02)
        # Its label above the line: a real-time factor under 1 is the usual case, so the curve
        # runs below it (beneath the line, the label lay on the curve of a recorded run).
        self.rtf_line = pg.InfiniteLine(pos=1.0, angle=0, movable=False, label="real time",
                                        labelOpts={"position": 0.35, "anchors": [(0.5, 1.0), (0.5, 1.0)]})
        self.plots["rtf"].addItem(self.rtf_line)
        # Room above the line for its label: auto-ranged up to the line itself, the plot cut the
        # label off. An undrawn line at 1.3 takes the range up to there (a fifth of the height
        # above the line when the curve starts near 0).
        self.plots["rtf"].addItem(pg.InfiniteLine(pos=1.3, angle=0, movable=False, pen=pg.mkPen(None)))
        for spec in PLOTS:
            self._title_values[spec.key] = NA
            self.value_labels[spec.key].setText(NA)

    def _arrange(self, keys: list[str] | tuple[str, ...]) -> None:
        """Lays out the plots ``keys`` in a grid as wide as the widget allows (the others leave
        the layout, so the rest grow)."""
        size = self.graphics.size()
        laid_out = size.width() > 100 and size.height() > 100
        columns = grid_columns(len(keys), size.width() if laid_out else None, size.height() if laid_out else None)
        if tuple(keys) == self._shown_keys and columns == self._columns:
            return
        layout = self.graphics.ci
        for key in self._shown_keys:
            layout.removeItem(self.plots[key])
        for i, key in enumerate(keys):
            layout.addItem(self.plots[key], row=i // columns, col=i % columns)
        self._shown_keys = tuple(keys)
        self._columns = columns

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 (Qt name)
        if watched is self.graphics and event.type() == QEvent.Type.Resize:
            self._arrange(self._shown_keys)  # a narrower dashboard (or the captions beside) takes fewer columns
        return super().eventFilter(watched, event)

    def shown_plots(self) -> tuple[str, ...]:
        """The keys of the plots on screen, in order."""
        return self._shown_keys

    def _arrange_for_gpu(self) -> None:
        # Without an NVIDIA GPU the GPU plots would stay empty: leave them out (the readout
        # line says why) and give their room to the plots that have something to show.
        no_gpu = self._gpu_present is False and not self._compared_gpu
        self._arrange([spec.key for spec in PLOTS if not (spec.gpu and no_gpu)])

    def _update_legends(self) -> None:
        theme = self._theme
        for spec in PLOTS:
            legend = self.legends.get(spec.key)
            if legend is None:
                continue
            if spec.key == "level":
                # Named after the streams once they are known; nothing to say before.
                names = self._level_streams
                entries = [(name, _curve_color(theme, spec.curves[i]), False) for i, name in enumerate(names)]
            else:
                entries = [(c.name, _curve_color(theme, c), c.dashed) for c in spec.curves]
            legend.set_entries(entries, theme.plot_foreground)

    def set_theme(self, theme: Theme) -> None:
        self._theme = theme
        self.graphics.setBackground(theme.plot_background)
        fg = theme.plot_foreground
        for spec in PLOTS:
            plot = self.plots[spec.key]
            for axis in ("left", "bottom"):
                plot.getAxis(axis).setPen(fg)
                plot.getAxis(axis).setTextPen(fg)
            for curve_spec in spec.curves:
                color = _curve_color(theme, curve_spec)
                style = Qt.PenStyle.DashLine if curve_spec.dashed else Qt.PenStyle.SolidLine
                curve = self.curves[curve_spec.key]
                curve.setPen(pg.mkPen(color, width=curve_spec.width, style=style))
                if curve_spec.key.startswith("caption_"):
                    curve.setSymbolBrush(color)
                    curve.setSymbolPen(None)
            self.na_labels[spec.key].setColor(theme.dim_text)
        self._update_legends()
        self.cursor.set_color(theme.accent)
        self.trace_captions.set_captions(self.trace_captions.captions, self._stream_color)  # recoloured names
        if self.cursor.visible:
            self.trace_captions.follow(self.cursor.x)
        alarm = pg.mkPen(theme.alarm, width=1.5, style=Qt.PenStyle.DashLine)
        self.temp_alarm_line.setPen(alarm)
        self.temp_alarm_line.label.setColor(theme.alarm)
        self.slowdown_line.setPen(pg.mkPen("#f08c00", width=1.5, style=Qt.PenStyle.DotLine))
        self.slowdown_line.label.setColor("#f08c00")
        self.rtf_line.setPen(pg.mkPen(theme.dim_text, width=1, style=Qt.PenStyle.DashLine))
        self.rtf_line.label.setColor(theme.dim_text)
        for spec in PLOTS:
            self._set_title(spec, self._title_values.get(spec.key, NA), force=True)
        self._dirty = True

    def _set_title(self, spec: PlotSpec, value_text: str, force: bool = False) -> None:
        """The plot's name is a layout item, set once per theme; its current value is a free text
        item in the title row, because changing a layout item's text re-lays out the whole grid
        and repaints it a second time."""
        plot = self.plots[spec.key]
        if force:
            unit = f" ({spec.unit})" if spec.unit else ""
            plot.setTitle(f'<span style="color:{self._theme.plot_foreground}">{spec.title}{unit}</span>',
                          size="9pt", justify="left")
            self.value_labels[spec.key].setColor(self._theme.dim_text)
        if self._title_values.get(spec.key) == value_text and not force:
            return
        self._title_values[spec.key] = value_text
        self.value_labels[spec.key].setText(value_text)

    def _place_value_labels(self) -> None:
        for key, label in self.value_labels.items():
            label.setPos(self.plots[key].size().width() - 4, 0)

    def _stream_color(self, stream: str) -> str:
        streams = list(dict.fromkeys(c.stream for c in self.trace_captions.captions))
        index = streams.index(stream) if stream in streams else 0
        return self._theme.stream_colors[index % len(self._theme.stream_colors)]

    def title_text(self, key: str) -> str:
        """The value part of a plot's title (e.g. "41 °C", "N/A")."""
        return self._title_values.get(key, "")

    # -- feeding ---------------------------------------------------------------------------

    def _series_for(self, key: str) -> RollingSeries:
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = RollingSeries()
        return series

    def _advance(self, t: float) -> None:
        if self._now_s is None or t > self._now_s:
            self._now_s = t

    def add_telemetry(self, sample: TelemetrySample) -> None:
        self._latest_sample = sample
        self._gpu_present = sample.gpu_name is not None
        t = sample.time_s
        for key in _TELEMETRY_KEYS:
            self._series_for(key).append(t, getattr(sample, key))
        for key, attr in _VRAM_KEYS:
            value = getattr(sample, attr)
            self._series_for(key).append(t, None if value is None else value / GIB)
        total = sample.vram_total_bytes
        self._series_for("vram_floor_gib").append(t, None if total is None else _vram_floor_gib(total))
        self._advance(t)
        self._dirty = True

    def add_status(self, status: PipelineStatus) -> None:
        t = status.time_s
        for key in _STATUS_KEYS:
            self._series_for(key).append(t, getattr(status, key))
        self._series_for("stream_count").append(t, len(status.streams))
        if status.streams and status.streams != self._level_streams:
            self._level_streams = tuple(status.streams[:MAX_LEVEL_STREAMS])
        for i in range(MAX_LEVEL_STREAMS):
            level = status.input_levels_dbfs[i] if i < len(status.input_levels_dbfs) else None
            if level is not None and not math.isfinite(level):
                level = None
            if level is not None or len(self._series_for(f"level_{i}")):
                self._series_for(f"level_{i}").append(t, level)
        self._advance(t)
        self._dirty = True

    def add_captions(self, updates: list[CaptionUpdate], now_s: float) -> None:
        """``now_s``: when the updates were drained (time.monotonic), their x on the plot."""
        for update in updates:
            if update.kind == "clear":
                continue  # nothing shown: no latency
            key = "caption_final_s" if update.kind == "final" else "caption_partial_s"
            self._series_for(key).append(now_s, caption_latency_s(update))
        if updates:
            self._advance(now_s)
            self._dirty = True

    def clear(self) -> None:
        for series in self._series.values():
            series.clear()
        self._now_s = None
        self._dirty = True

    # -- drawing ---------------------------------------------------------------------------

    @property
    def gpu_present(self) -> bool | None:
        """None until the first telemetry sample says."""
        return self._gpu_present

    def refresh(self, force: bool = False) -> bool:
        """Redraws if anything changed; returns whether it did. Called by the GUI timer."""
        if self.trace is not None or not (self._dirty or force):
            return False
        if not self.isVisible() and not force:
            return False  # keep the data; draw when shown
        clock_s = time.monotonic()
        if not force and clock_s - self._last_redraw_s < self.min_interval_s:
            return False  # stays dirty: the next tick after the interval draws it
        self._last_redraw_s = clock_s
        self._dirty = False
        self.redraws += 1
        now = self._now_s if self._now_s is not None else 0.0
        t_min = now - self.window_s
        for spec in PLOTS:
            for curve_spec in spec.curves:
                series = self._series.get(curve_spec.key)
                if series is None or not len(series):
                    self.curves[curve_spec.key].setData([], [])
                    continue
                t, v = series.since(t_min)
                self.curves[curve_spec.key].setData(t - now, v, connect="finite")
        self._fit_counts()
        self._arrange_for_gpu()
        self._update_titles()
        self._update_na_labels()
        return True

    def _fit_counts(self) -> None:
        for spec in PLOTS:
            if spec.integer:
                values: list[float] = []
                for curve_spec in spec.curves:
                    _, y = self.curves[curve_spec.key].getData()
                    if y is not None and len(y):
                        values.append(float(np.nanmax(y)) if np.isfinite(y).any() else math.nan)
                self._count_tops[spec.key] = fit_count_range(self.plots[spec.key], values, self._count_tops.get(spec.key))

    def _last(self, key: str) -> float | None:
        series = self._series.get(key)
        return None if series is None else series.last()

    def _update_titles(self) -> None:
        specs = {s.key: s for s in PLOTS}
        sample = self._latest_sample
        self._set_title(specs["frame"], _fmt(self._last("frame_latency_ms"), " ms", 2))
        self._set_title(specs["step"], _fmt(self._last("step_latency_ms"), " ms", 1))
        self._set_title(specs["caption"], self.caption_percentiles_text())
        if self._gpu_present is False:
            for spec in PLOTS:
                if spec.gpu:
                    self._set_title(spec, NO_GPU)
        else:
            self._set_title(specs["temp"], _fmt(self._last("temperature_c"), " °C"))
            self._set_title(specs["power"], _of(self._last("power_w"), self._last("power_limit_w"), " W"))
            self._set_title(specs["sm_clock"], _fmt(self._last("sm_clock_mhz"), " MHz"))
            self._set_title(specs["util"], _fmt(self._last("utilization_pct"), " %"))
            # Numbers only, in the legend's order (process · used / total): the plot is narrow.
            self._set_title(specs["vram"], f"{_fmt(self._last('vram_process_gib'), '', 2)} · "
                                           f"{_of(self._last('vram_used_gib'), self._last('vram_total_gib'), '', 1)}")
        self._set_title(specs["cpu"], f"{_fmt(self._last('cpu_pct'), ' %')} · app {_fmt(self._last('process_cpu_pct'), ' %')}")
        self._set_title(specs["dropped"], _fmt(self._last("dropped_frames"), ""))
        self._set_title(specs["rtf"], _fmt(self._last("real_time_factor"), "", 2))
        self._set_title(specs["load"], f"{_fmt(self._last('stream_count'), '')} · {_fmt(self._last('batch_size'), '')}"
                        if self._last("stream_count") is not None else NA)
        levels = [self._last(f"level_{i}") for i in range(len(self._level_streams))]
        # Numbers only: the legend names the streams, and file names can be long.
        self._set_title(specs["level"], " · ".join(_fmt(level, "", 0) for level in levels) or NA)
        self._name_level_curves()
        slowdown = sample.slowdown_temp_c if sample is not None else None
        if slowdown is not None and slowdown != self.slowdown_line.value():
            self.slowdown_line.setValue(slowdown)
            self.slowdown_line.label.setFormat(f"slowdown {slowdown:.0f} °C")
        if self.slowdown_line.isVisible() != (slowdown is not None):
            self.slowdown_line.setVisible(slowdown is not None)
        readout = telemetry_readout(sample, gpu_plots_shown=self._compared_gpu)
        if readout != self.readout.text():
            self.readout.setText(readout)

    def _name_level_curves(self) -> None:
        if self._legend_level_names != self._level_streams:
            self._legend_level_names = self._level_streams
            self._update_legends()

    def caption_percentiles_text(self) -> str:
        p50, p95 = self.caption_percentiles()
        if p50 is None:
            return NA
        return f"p50 {p50:.1f} · p95 {p95:.1f}"  # short: it shares a narrow title row

    def caption_percentiles(self) -> tuple[float | None, float | None]:
        """p50/p95 of committed captions' latency in the visible window (or the whole trace)."""
        if self.trace is not None:
            values = np.array([caption_latency_s(c) for c in self.trace.final_captions()], dtype=np.float64)
        else:
            series = self._series.get("caption_final_s")
            if series is None:
                return None, None
            now = self._now_s or 0.0
            _, values = series.since(now - self.window_s)
        return percentile(values, 50), percentile(values, 95)

    def _update_na_labels(self) -> None:
        """A GPU plot of a field this GPU does not report says so (without a GPU at all, the
        GPU plots are not shown)."""
        for spec in PLOTS:
            label = self.na_labels[spec.key]
            text = ""
            if spec.gpu and self._gpu_present and all(self._last(c.key) is None for c in spec.curves):
                text = "N/A on this GPU"
            if label.textItem.toPlainText() != text:
                label.setText(text)
                label.setVisible(bool(text))
                legend = self.legends.get(spec.key)
                if legend is not None and spec.gpu:
                    legend.setVisible(not text)  # the "N/A" note replaces an empty legend
            _centre(label, self.plots[spec.key].getViewBox())

    # -- traces ----------------------------------------------------------------------------

    def show_trace(self, trace: Trace, name: str = "") -> None:
        """Shows a recorded run over its whole length (live data keeps buffering meanwhile)."""
        self.clear_comparison()
        self.trace = trace
        telemetry = trace.telemetry
        curves, streams = trace_curves(trace)
        for key, item in self.curves.items():
            t, v = curves.get(key, (np.empty(0), np.empty(0)))
            item.setData(t, v, connect="finite")
        self._level_streams = streams
        last_sample = telemetry[-1] if telemetry else None
        self._gpu_present = any(s.gpu_name for s in telemetry) if telemetry else None
        self._arrange_for_gpu()
        captions = trace_caption_entries(trace)
        duration = max(trace.duration_s(), max((c.time_s for c in captions), default=0.0), 1.0)
        self.plots[PLOTS[0].key].setXRange(0, duration, padding=0.01)
        for spec in PLOTS:
            if spec.key != "util" and not spec.integer:
                self.plots[spec.key].enableAutoRange(axis="y")
        self._fit_counts()
        saved = self._series, self._latest_sample
        self._series = {}
        for key in list(self.curves):
            series = RollingSeries(4)
            # Titles show the run's last values: feed each series its final point.
            x, y = self.curves[key].getData()
            if y is not None and len(y):
                series.append(0.0, None if math.isnan(y[-1]) else float(y[-1]))
            self._series[key] = series
        self._latest_sample = last_sample
        self._update_titles()  # with self.trace set, the caption title covers the whole run
        self._update_na_labels()
        self._series, self._latest_sample = saved
        meta = trace.meta
        device = meta.get("device") or (last_sample.gpu_name if last_sample else None) or "?"
        self.mode_label.setText(
            f"Trace: {name or 'recorded run'} · {device} · {duration:.0f} s · recorded {trace.created_utc or '?'}"
            " (x axis: seconds from the start)"
        )
        self.live_button.setVisible(True)
        self.trace_captions.set_captions(captions, self._stream_color)
        self.trace_panel.setVisible(True)
        self._size_trace_panel()
        # Once more after the window has laid out (a trace opened before the window is shown
        # would otherwise keep the sizes of a window not yet at its size).
        QTimer.singleShot(0, self._size_trace_panel)
        self.cursor.set_visible(True)
        self.cursor.set_x(captions[0].time_s if captions else 0.0)

    def _size_trace_panel(self) -> None:
        total = self.splitter.width()
        if total > 2 * TRACE_PANEL_MIN_PX and self.trace_panel.isVisible():
            panel = int(min(TRACE_PANEL_MAX_PX, max(TRACE_PANEL_MIN_PX, total * 0.25)))
            self.splitter.setSizes([total - panel, panel])

    def compare_trace(self, trace: Trace, name: str = "") -> None:
        """Overlays a second recorded run, dashed, on the one shown (to compare two runs)."""
        if self.trace is None:
            raise ValueError("open a trace first; a comparison is drawn over it")
        curves, _ = trace_curves(trace)
        for spec in PLOTS:
            for curve_spec in spec.curves:
                t, v = curves.get(curve_spec.key, (np.empty(0), np.empty(0)))
                item = self.compare_curves.get(curve_spec.key)
                if item is None:
                    item = pg.PlotDataItem(connect="finite")
                    self.plots[spec.key].addItem(item)
                    self.compare_curves[curve_spec.key] = item
                color = pg.mkColor(_curve_color(self._theme, curve_spec))
                color.setAlpha(150)
                item.setPen(pg.mkPen(color, width=1.5, style=Qt.PenStyle.DashLine))
                item.setData(t, v, connect="finite")
        # A run on a GPU compared with one on the CPU: its GPU plots are worth showing.
        self._compared_gpu = any(s.gpu_name for s in trace.telemetry)
        self._arrange_for_gpu()
        if self.trace.telemetry:
            self.readout.setText(telemetry_readout(self.trace.telemetry[-1], gpu_plots_shown=self._compared_gpu))
        duration = max(self.trace.duration_s(), trace.duration_s(), 1.0)
        self.plots[PLOTS[0].key].setXRange(0, duration, padding=0.01)
        label = self.mode_label.text().split("  ·  compared with")[0]
        self.mode_label.setText(f"{label}  ·  compared with {name or 'another run'} (dashed)")

    def clear_comparison(self) -> None:
        for key, item in self.compare_curves.items():
            self.plots[next(s.key for s in PLOTS if any(c.key == key for c in s.curves))].removeItem(item)
        self.compare_curves.clear()
        self._compared_gpu = False

    def show_live(self) -> None:
        self.clear_comparison()
        self.trace = None
        self.trace_panel.setVisible(False)
        self.cursor.set_visible(False)
        sample = self._latest_sample
        self._gpu_present = None if sample is None else sample.gpu_name is not None
        self._arrange_for_gpu()
        self.mode_label.setText(f"Live · last {self.window_s:.0f} s (x axis: seconds from now)")
        self.live_button.setVisible(False)
        self.plots[PLOTS[0].key].setXRange(-self.window_s, 0, padding=0)
        self._dirty = True
        self.refresh(force=True)
