"""The performance dashboard: live values, N/A for what telemetry cannot read, traces."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from captioner.events import CaptionUpdate, PipelineStatus, TelemetrySample
from captioner.gpu.telemetry import TelemetrySampler
from captioner.trace import load_trace, save_trace
from captioner.ui.dashboard import PLOTS, Dashboard, RollingSeries, telemetry_readout

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
    assert dashboard.title_text("vram").startswith("process 2.00")
    assert dashboard.title_text("level") == "-21 · -35"
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
    assert "process N/A" in dashboard.title_text("vram")
    readout = dashboard.readout.text()
    assert "temp N/A" in readout and "power N/A/700 W" in readout and "(process N/A)" in readout
    assert dashboard.na_labels["temp"].textItem.toPlainText() == "N/A on this GPU"


def test_no_gpu_says_so_and_shows_cpu_load(dashboard):
    """The real sampler on this machine (no NVIDIA GPU here): every GPU value N/A."""
    with TelemetrySampler(period_s=0.05) as sampler:
        deadline = time.monotonic() + 10
        while len(sampler.history()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    if sampler.gpu_available:
        pytest.skip("this machine has an NVIDIA GPU")
    for sample in sampler.history():
        dashboard.add_telemetry(sample)
    dashboard.refresh()
    assert dashboard.gpu_present is False
    for spec in PLOTS:
        text = dashboard.na_labels[spec.key].textItem.toPlainText()
        assert ("No NVIDIA GPU" in text) == spec.gpu, spec.key
    assert dashboard.title_text("temp") == "N/A"
    assert "no NVIDIA GPU (N/A)" in dashboard.readout.text()
    assert dashboard.title_text("cpu") != "N/A · app N/A"
    _, cpu = dashboard.curves["cpu_pct"].getData()
    assert np.isfinite(cpu[1:]).all()


def test_caption_latency_percentiles(dashboard):
    now = time.monotonic()
    updates = [CaptionUpdate("Me", "final", "x", 0.0, 1.0, 1.0 + lat, 1.0 + lat) for lat in (0.5, 1.0, 1.5, 2.0, 10.0)]
    dashboard.add_captions(updates, now)
    dashboard.refresh()
    p50, p95 = dashboard.caption_percentiles()
    assert p50 == pytest.approx(1.5) and p95 == pytest.approx(np.percentile([0.5, 1, 1.5, 2, 10], 95))
    assert dashboard.title_text("caption") == f"p50 1.50 s · p95 {p95:.2f} s"


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
