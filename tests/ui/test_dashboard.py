"""The performance dashboard: live values, N/A for what telemetry cannot read, traces."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from captioner.events import CaptionUpdate, PipelineStatus, TelemetrySample
from captioner.gpu.telemetry import TelemetrySampler
from captioner.trace import load_trace, save_trace
from captioner.ui.dashboard import (
    PLOTS,
    Dashboard,
    RollingSeries,
    grid_columns,
    telemetry_readout,
)
from captioner.ui.plot_parts import IntegerAxis

GIB = 1 << 30


def gpu_sample(t, **over):
    values = dict(time_s=t, gpu_index=0, gpu_name="NVIDIA H200", temperature_c=41.0, slowdown_temp_c=90.0,
                  power_w=123.0, power_limit_w=700.0, sm_clock_mhz=1980.0, mem_clock_mhz=3201.0,
                  utilization_pct=35.0, vram_used_bytes=5 * GIB, vram_total_bytes=140 * GIB,
                  vram_process_bytes=2 * GIB, cpu_pct=10.0, process_cpu_pct=4.0)
    values.update(over)
    return TelemetrySample(**values)


def status(t, **over):
    values = dict(time_s=t, provider="CUDAExecutionProvider", model="tiny.en", device_name="NVIDIA H200",
                  streams=("Me", "Meeting"), frame_latency_ms=0.7, step_latency_ms=22.0, dropped_frames=0,
                  real_time_factor=0.04, input_levels_dbfs=(-21.0, -35.0), batch_size=2)
    values.update(over)
    return PipelineStatus(**values)


@pytest.fixture
def dashboard(qtbot):
    dash = Dashboard()
    qtbot.addWidget(dash)
    dash.resize(1200, 700)
    dash.show()
    qtbot.waitExposed(dash)
    return dash


def test_rolling_series_is_bounded_and_windowed():
    series = RollingSeries(capacity=100)
    for i in range(1000):
        series.append(float(i), None if i == 995 else float(i) * 2)
    assert len(series) <= 200
    t, v = series.since(990.0)
    assert t.tolist() == [float(i) for i in range(990, 1000)]
    assert math.isnan(v[5]) and v[0] == 1980.0
    assert series.last() == 1998.0


def test_values_and_limits_on_a_gpu(dashboard):
    t0 = time.monotonic()
    for i in range(10):
        dashboard.add_telemetry(gpu_sample(t0 + 0.5 * i, temperature_c=40.0 + i))
        dashboard.add_status(status(t0 + 0.5 * i))
    assert dashboard.refresh()
    assert not dashboard.refresh()  # nothing new: no redraw
    assert dashboard.title_text("temp") == "49 °C"
    assert dashboard.title_text("power") == "123 / 700 W"
    assert dashboard.title_text("sm_clock") == "1980 MHz"
    assert dashboard.title_text("vram") == "2.00 · 5.0 / 140.0"  # process · used / total, as the legend says
    assert dashboard.title_text("level") == "-21 · -35"
    assert dashboard.title_text("load") == "2 · 2"  # streams · batch size
    assert dashboard.shown_plots() == tuple(spec.key for spec in PLOTS)  # a GPU: every plot
    assert dashboard.temp_alarm_line.value() == 83.0
    assert dashboard.slowdown_line.isVisible() and dashboard.slowdown_line.value() == 90.0
    x, y = dashboard.curves["temperature_c"].getData()
    assert len(x) == 10 and x[-1] == 0.0 and x[0] == pytest.approx(-4.5)
    _, floor = dashboard.curves["vram_floor_gib"].getData()
    assert floor[-1] == pytest.approx(0.85 * 140)  # the 15%-free line
    assert all(label.textItem.toPlainText() == "" for label in dashboard.na_labels.values())


def test_old_points_scroll_out_of_the_window(dashboard):
    for i in range(200):
        dashboard.add_telemetry(gpu_sample(1000.0 + i))
    dashboard.refresh()
    x, _ = dashboard.curves["power_w"].getData()
    assert x.min() >= -dashboard.window_s and x.max() == 0.0


def test_telemetry_errors_show_na(dashboard):
    # What NvmlReader returns when NVML fails for a field: None, on a GPU that is otherwise read.
    dashboard.add_telemetry(gpu_sample(time.monotonic(), temperature_c=None, power_w=None, vram_process_bytes=None))
    dashboard.refresh()
    assert dashboard.title_text("temp") == "N/A"
    assert dashboard.title_text("power") == "N/A / 700 W"
    assert dashboard.title_text("vram").startswith("N/A · 5.0 / 140.0")
    readout = dashboard.readout.text()
    assert "temp N/A" in readout and "power N/A / 700 W" in readout and "(process N/A)" in readout
    assert dashboard.na_labels["temp"].textItem.toPlainText() == "N/A on this GPU"


def test_no_gpu_collapses_the_gpu_plots_into_one_line(dashboard, qtbot):
    """The real sampler on this machine (no NVIDIA GPU here): the GPU plots, which would stay
    empty, leave the grid; one line says why; nothing reads "N/A/N/A"."""
    with TelemetrySampler(period_s=0.05) as sampler:
        deadline = time.monotonic() + 10
        while len(sampler.history()) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    if sampler.gpu_available:
        pytest.skip("this machine has an NVIDIA GPU")
    for sample in sampler.history():
        dashboard.add_telemetry(sample)
    dashboard.refresh(force=True)
    assert dashboard.gpu_present is False
    gpu_keys = {spec.key for spec in PLOTS if spec.gpu}
    assert gpu_keys == {"vram", "temp", "power", "sm_clock", "util"}
    assert dashboard.shown_plots() == tuple(spec.key for spec in PLOTS if not spec.gpu)
    for key in gpu_keys:
        assert dashboard.plots[key].scene() is None, key  # out of the layout, not an empty frame
    for key in dashboard.shown_plots():
        assert dashboard.plots[key].scene() is dashboard.graphics.scene()
    readout = dashboard.readout.text()
    assert readout.startswith("No NVIDIA GPU") and "left out" in readout and "\n" not in readout
    assert "N/A/N/A" not in readout and "N/A / N/A" not in readout
    assert dashboard.title_text("power") == "no GPU" and dashboard.title_text("temp") == "no GPU"
    assert dashboard.title_text("cpu") != "N/A · app N/A"
    _, cpu = dashboard.curves["cpu_pct"].getData()
    # The first readings, under 0.1 s after the meter was made, measure nothing (a CPU share over
    # a few ms is clock-tick noise); from the first measured one on, every sample has one.
    measured = np.isfinite(cpu)
    assert measured.any() and measured[int(np.argmax(measured)):].all()
    # the remaining plots share the room: two rows of four instead of three of five
    assert grid_columns(len(dashboard.shown_plots())) == 4
    qtbot.waitUntil(lambda: dashboard.plots["cpu"].width() > dashboard.width() / 5, timeout=3000)


def test_without_a_gpu_the_readout_says_so_once():
    line = telemetry_readout(TelemetrySample(time_s=0.0, cpu_pct=55.0, process_cpu_pct=12.0))
    assert line.startswith("No NVIDIA GPU: captioning runs on the CPU") and line.count("GPU") == 2
    assert "N/A" not in line and line.endswith("CPU 55 % (captioner 12 %)")


def test_legends_sit_under_the_plots_not_on_the_curves(dashboard, qtbot):
    t0 = time.monotonic()
    for i in range(5):
        dashboard.add_telemetry(gpu_sample(t0 + i))
        dashboard.add_status(status(t0 + i))
    dashboard.refresh(force=True)
    qtbot.wait(50)  # one layout pass
    for spec in PLOTS:
        legend = dashboard.legends.get(spec.key)
        if len(spec.curves) == 1:
            assert legend is None, spec.key  # one curve: the title names it
            continue
        view = dashboard.plots[spec.key].getViewBox().sceneBoundingRect()
        box = legend.sceneBoundingRect()
        assert box.height() > 0, spec.key
        assert box.top() >= view.bottom(), spec.key  # below the curves' area
    assert dashboard.legends["caption"].text().split() == ["━━", "shown", "━━", "committed"]
    assert dashboard.legends["level"].text().split() == ["━━", "Me", "━━", "Meeting"]  # the streams
    assert "15% free" in dashboard.legends["vram"].text()


def test_the_real_time_label_sits_above_its_line(dashboard, qtbot):
    # A real-time factor under 1 is the usual case: its curve runs beneath the line, so the
    # line's label goes above it (beneath, it lay on the curve of a recorded run).
    t0 = time.monotonic()
    for i in range(5):
        dashboard.add_status(status(t0 + i, real_time_factor=0.6 + 0.05 * i))
    dashboard.refresh(force=True)
    qtbot.wait(50)  # one layout pass
    line = dashboard.rtf_line
    label = line.label.sceneBoundingRect()
    at_line = line.mapToScene(line.boundingRect().center()).y()
    assert label.height() > 0 and label.bottom() <= at_line + 1
    # ...and inside the plot: the view leaves room for it above the line (auto-ranged to the
    # line alone, it cut the label off at the top).
    view = dashboard.plots["rtf"].getViewBox().sceneBoundingRect()
    assert label.top() >= view.top() - 1, (label, view)


@pytest.mark.parametrize("key", ["dropped", "load"])
def test_counts_have_whole_number_axes_from_zero(dashboard, key):
    t0 = time.monotonic()
    for i in range(10):  # nothing dropped, one stream: flat lines at 0 and 1
        dashboard.add_status(status(t0 + i, dropped_frames=0, streams=("Me",), batch_size=1))
    dashboard.refresh(force=True)
    plot = dashboard.plots[key]
    axis = plot.getAxis("left")
    assert isinstance(axis, IntegerAxis)
    low, high = plot.getViewBox().viewRange()[1]
    assert -0.2 < low <= 0 and 1 <= high < 1.3  # 0..1, not -0.4..0.4 around a flat line
    ticks = [v for _, values in axis.tickValues(low, high, 200) for v in values]
    assert ticks == [0.0, 1.0]
    assert axis.tickStrings(ticks, 1.0, 1.0) == ["0", "1"]
    # a larger count: still whole numbers, at a round step
    ticks = [v for _, values in axis.tickValues(0, 1234, 120) for v in values]
    assert ticks and all(v == int(v) for v in ticks) and ticks[1] - ticks[0] in (100, 200, 250, 500)


def test_a_count_axis_grows_with_the_count(dashboard):
    t0 = time.monotonic()
    for i, dropped in enumerate((0, 3, 17)):
        dashboard.add_status(status(t0 + i, dropped_frames=dropped))
    dashboard.refresh(force=True)
    low, high = dashboard.plots["dropped"].getViewBox().viewRange()[1]
    assert low <= 0 and 17 <= high < 19


def test_caption_latency_percentiles(dashboard):
    now = time.monotonic()
    updates = [CaptionUpdate("Me", "final", "x", 0.0, 1.0, 1.0 + lat, 1.0 + lat) for lat in (0.5, 1.0, 1.5, 2.0, 10.0)]
    dashboard.add_captions(updates, now)
    dashboard.refresh()
    p50, p95 = dashboard.caption_percentiles()
    assert p50 == pytest.approx(1.5) and p95 == pytest.approx(np.percentile([0.5, 1, 1.5, 2, 10], 95))
    assert dashboard.title_text("caption") == f"p50 1.5 · p95 {p95:.1f}"


def test_readout_without_any_sample():
    assert telemetry_readout(None) == "GPU: waiting for telemetry…"


def test_trace_round_trip_and_display(window, tmp_path, qtbot):
    t0 = time.monotonic()
    for i in range(20):
        window.apply_telemetry(gpu_sample(t0 + 0.5 * i, power_w=100.0 + i, temperature_c=50.0 + i / 2))
        window.apply_status(status(t0 + 0.5 * i + 0.1, step_latency_ms=20.0 + i))
    window.apply_captions([CaptionUpdate("Me", "partial", "hel", 0.0, 0.4, 0.6, 0.7),
                           CaptionUpdate("Me", "final", "Hello.", 0.0, 0.6, 1.2, 1.3)], t0 + 1.0)
    path = tmp_path / "run.trace.jsonl"
    assert window.save_trace(path) == 42
    trace = load_trace(path)
    assert len(trace.telemetry) == 20 and len(trace.statuses) == 20 and len(trace.captions) == 2
    assert trace.meta["gpu"] == "NVIDIA H200" and trace.meta["model"] == "tiny.en"

    window.open_trace(path)
    dash = window.dashboard
    assert dash.trace is not None and "run.trace.jsonl" in dash.mode_label.text()
    x, y = dash.curves["power_w"].getData()
    assert x[0] == 0.0 and x[-1] == pytest.approx(9.5) and y.tolist() == [100.0 + i for i in range(20)]
    x, y = dash.curves["step_latency_ms"].getData()
    assert y[-1] == 39.0 and x[0] == pytest.approx(0.1)
    assert dash.title_text("temp") == "60 °C"
    assert dash.title_text("step") == "39.0 ms"
    assert dash.caption_percentiles()[0] == pytest.approx(0.7)  # 0.6 s waiting + 0.1 s behind
    # live data keeps arriving but the trace stays on screen until "Back to live"
    window.apply_telemetry(gpu_sample(t0 + 30, power_w=500.0))
    assert not dash.refresh()
    dash.live_button.click()
    assert dash.trace is None
    assert dash.title_text("power") == "500 / 700 W"


def test_a_bad_trace_file_is_refused(window, tmp_path):
    from captioner.errors import UserError

    bad = tmp_path / "notes.txt"
    bad.write_text("hello\n")
    with pytest.raises(UserError, match="not a captioner trace"):
        window.open_trace(bad)
    assert window.dashboard.trace is None


def test_trace_saved_headless_opens_in_dashboard(qtbot, tmp_path):
    """A trace written by captioner.trace alone (as on the GPU server) shows in a fresh dashboard."""
    path = tmp_path / "h200.jsonl"
    events = [gpu_sample(10.0 + i, vram_used_bytes=(4 + i) * GIB) for i in range(5)]
    events += [status(10.2 + i) for i in range(5)]
    save_trace(path, events, meta={"device": "NVIDIA H200"})
    dash = Dashboard()
    qtbot.addWidget(dash)
    dash.show_trace(load_trace(path), path.name)
    x, y = dash.curves["vram_used_gib"].getData()
    assert y.tolist() == [4.0, 5.0, 6.0, 7.0, 8.0]
    assert "NVIDIA H200" in dash.mode_label.text()
    assert dash.gpu_present


def test_two_runs_compared(window, tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    save_trace(a, [gpu_sample(100.0 + i, power_w=100.0 + i) for i in range(6)] + [status(100.0 + i) for i in range(6)])
    save_trace(b, [gpu_sample(500.0 + i, power_w=200.0 + i) for i in range(10)], meta={"device": "other"})
    window.open_trace(a)
    window.compare_trace(b)
    dash = window.dashboard
    x, y = dash.compare_curves["power_w"].getData()
    assert x.tolist() == [float(i) for i in range(10)] and y[0] == 200.0
    _, own = dash.curves["power_w"].getData()
    assert own[0] == 100.0  # the first run stays the solid curve
    assert "compared with b.jsonl" in dash.mode_label.text()
    window.open_trace(b)  # a new trace replaces the comparison
    assert dash.compare_curves == {}
    window.compare_trace(a)
    dash.show_live()
    assert dash.compare_curves == {} and dash.trace is None


def test_trace_captions_follow_the_time_cursor(window, tmp_path, qtbot):
    """`gui --trace`: the run's committed captions beside its plots, following the cursor."""
    from PySide6.QtCore import Qt

    events = [gpu_sample(100.0 + i) for i in range(40)] + [status(100.0 + i) for i in range(40)]
    streams = ("Me", "Me", "Meeting")  # a run of two lines of Me, then one of Meeting, ...
    for i in range(30):
        stream = streams[i % 3]
        events.append(CaptionUpdate(stream, "partial", f"draft {i}", i, i + 0.5, i + 0.6, 1.0 + i))
        events.append(CaptionUpdate(stream, "final", f"Line number {i}.", i, i + 0.5, i + 0.9, 1.2 + i))
    path = tmp_path / "run.trace.jsonl"
    save_trace(path, events)
    window.resize(1500, 1000)
    window.open_trace(path)
    dash = window.dashboard
    listing = dash.trace_captions
    qtbot.waitUntil(lambda: listing.isVisible(), timeout=3000)
    assert dash.cursor.visible
    # committed captions only, each stream named once per run of its lines (like the live view)
    assert [c.text for c in listing.captions] == [f"Line number {i}." for i in range(30)]
    texts = [listing.item(i).text() for i in range(listing.count())]
    assert texts[:4] == ["Me", "0:01.2   Line number 0.", "0:02.2   Line number 1.", "Meeting"]
    assert texts.count("Me") == 10 and texts.count("Meeting") == 10

    def shown(index):
        item = listing.currentItem()
        return (listing.current_index() == index and item is not None
                and listing.viewport().rect().contains(listing.visualItemRect(item)))

    dash.cursor.set_x(20.5)  # between "Line number 19." (20.2 s) and 20 (21.2 s)
    qtbot.waitUntil(lambda: shown(19), timeout=3000)
    dash.cursor.lines[4].setValue(5.3)  # dragging the line in another plot moves them all
    qtbot.waitUntil(lambda: shown(4), timeout=3000)
    assert {line.value() for line in dash.cursor.lines} == {5.3}
    dash.cursor.set_x(0.5)  # before the first caption: nothing selected
    assert listing.current_index() is None

    # and the other way round: a click on a caption moves the cursor to it
    item = next(listing.item(i) for i in range(listing.count()) if listing.item(i).text().endswith("number 2."))
    listing.scrollToItem(item)
    qtbot.mouseClick(listing.viewport(), Qt.MouseButton.LeftButton, pos=listing.visualItemRect(item).center())
    assert dash.cursor.x == pytest.approx(3.2)
    dash.live_button.click()
    assert not listing.isVisible() and not dash.cursor.visible


def test_the_recorded_cpu_run_shows_its_captions(window):
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "docs" / "traces" / "cpu-tiny.en-two-streams.trace.jsonl"
    window.open_trace(path)
    finals = [c for c in load_trace(path).final_captions() if c.text.strip()]
    listing = window.dashboard.trace_captions
    assert len(listing.captions) == len(finals) > 10
    assert listing.current_index() == 0  # the cursor starts at the first caption
    x, _ = window.dashboard.plots["caption"].getViewBox().viewRange()
    assert x[1] >= max(c.emitted_wall_s for c in finals)  # every caption is within the plots' time


def test_a_gpu_run_compared_with_a_cpu_run_brings_back_the_gpu_plots(window, tmp_path):
    cpu_run, gpu_run = tmp_path / "cpu.jsonl", tmp_path / "gpu.jsonl"
    save_trace(cpu_run, [TelemetrySample(time_s=10.0 + i, cpu_pct=50.0) for i in range(5)])
    save_trace(gpu_run, [gpu_sample(10.0 + i) for i in range(5)])
    window.open_trace(cpu_run)
    dash = window.dashboard
    assert "temp" not in dash.shown_plots()  # a CPU run alone: no GPU plots
    window.compare_trace(gpu_run)
    assert dash.shown_plots() == tuple(spec.key for spec in PLOTS)  # the GPU run's curves, dashed
    assert dash.readout.text().startswith("No NVIDIA GPU in this run") and "left out" not in dash.readout.text()
    window.open_trace(cpu_run)
    assert "temp" not in dash.shown_plots()


def test_a_theme_switch_keeps_the_trace_caption_in_view(window, tmp_path):
    events = [status(100.0 + i) for i in range(10)]
    events += [CaptionUpdate("Me", "final", f"Line {i}.", i, i + 0.5, i + 0.9, 1.0 + i) for i in range(8)]
    path = tmp_path / "run.trace.jsonl"
    save_trace(path, events)
    window.open_trace(path)
    window.dashboard.cursor.set_x(5.5)
    assert window.dashboard.trace_captions.current_index() == 4
    window.dark_action.trigger()  # dark -> light: the names are recoloured, the list rebuilt
    assert window.dashboard.trace_captions.current_index() == 4
