"""The Prometheus exporter, scraped over loopback."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from captioner.app.metrics import MetricsExporter
from captioner.errors import UserError
from captioner.events import CaptionUpdate, PipelineStatus, TelemetrySample


def scrape(port: int) -> dict[str, list]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


@pytest.fixture
def exporter():
    exp = MetricsExporter(0)
    exp.start()
    yield exp
    exp.stop()


def test_binds_loopback_only(exporter):
    assert exporter.host == "127.0.0.1"
    assert exporter._server.server_address[0] == "127.0.0.1"


def test_gpu_figures_use_dcgm_names_and_units(exporter):
    exporter.update_telemetry(
        TelemetrySample(
            time_s=1.0, gpu_index=0, gpu_name="NVIDIA H200", temperature_c=41.0, slowdown_temp_c=90.0,
            power_w=123.5, power_limit_w=700.0, sm_clock_mhz=1980.0, mem_clock_mhz=3201.0, utilization_pct=37.0,
            vram_used_bytes=3 << 30, vram_total_bytes=141 << 30, vram_process_bytes=1 << 30, cpu_pct=10.0,
            process_cpu_pct=55.0,
        )
    )
    families = scrape(exporter.port)
    temp = families["DCGM_FI_DEV_GPU_TEMP"][0]
    assert temp.value == 41.0 and temp.labels == {"gpu": "0", "modelName": "NVIDIA H200"}
    assert families["DCGM_FI_DEV_POWER_USAGE"][0].value == 123.5
    assert families["DCGM_FI_DEV_SM_CLOCK"][0].value == 1980.0
    assert families["DCGM_FI_DEV_FB_USED"][0].value == 3 * 1024  # MiB, as DCGM
    assert families["DCGM_FI_DEV_FB_FREE"][0].value == 138 * 1024
    assert families["captioner_process_vram_bytes"][0].value == float(1 << 30)
    assert families["captioner_process_cpu_percent"][0].value == 55.0


def test_na_values_are_absent_not_zero(exporter):
    exporter.update_telemetry(TelemetrySample(time_s=1.0, cpu_pct=5.0, process_cpu_pct=1.0))
    families = scrape(exporter.port)
    assert not any(name.startswith("DCGM_") for name in families)
    assert families["captioner_host_cpu_percent"][0].value == 5.0


def test_pipeline_figures_and_latency_histogram(exporter):
    exporter.update_status(
        PipelineStatus(
            time_s=2.0, provider="CPUExecutionProvider", model="tiny.en", device_name="cpu",
            streams=("Me", "Meeting"), frame_latency_ms=1.5, step_latency_ms=250.0, dropped_frames=7,
            real_time_factor=0.4, input_levels_dbfs=(-20.0, -35.5),
        )
    )
    for latency_s in (0.3, 0.8, 2.5):
        exporter.observe_caption(CaptionUpdate("Me", "final", "x", 0.0, 1.0, 1.0 + latency_s, 0.0))
    families = scrape(exporter.port)
    assert families["captioner_streams"][0].value == 2
    assert families["captioner_step_latency_ms"][0].value == 250.0
    assert families["captioner_dropped_frames"][0].value == 7
    levels = {s.labels["stream"]: s.value for s in families["captioner_input_level_dbfs"]}
    assert levels == {"Me": -20.0, "Meeting": -35.5}
    assert "captioner_caption_latency_seconds_last" not in families  # not measured yet: absent
    hist = {(s.name, s.labels.get("le")): s.value for s in families["captioner_caption_latency_seconds"]}
    assert hist[("captioner_caption_latency_seconds_count", None)] == 3
    assert hist[("captioner_caption_latency_seconds_bucket", "0.5")] == 1
    assert hist[("captioner_caption_latency_seconds_bucket", "1.0")] == 2
    assert hist[("captioner_caption_latency_seconds_sum", None)] == pytest.approx(3.6)


def test_busy_port_is_user_error(exporter):
    with pytest.raises(UserError, match="cannot serve metrics"):
        MetricsExporter(exporter.port).start()


def test_bad_port_is_user_error():
    with pytest.raises(UserError):
        MetricsExporter(70000)


def _status(device: str, streams: tuple[str, ...], step_ms: float) -> PipelineStatus:
    return PipelineStatus(time_s=2.0, provider="CUDAExecutionProvider", model="tiny.en", device_name=device,
                          streams=streams, step_latency_ms=step_ms, dropped_frames=len(streams))


def test_a_servers_engines_and_gpus_each_have_their_series(exporter):
    """Two engines (named, as a server names them) and two GPUs: one series each, labelled by
    engine and by GPU; a GPU whose figures are N/A has none while the other keeps its own."""
    exporter.update_status(_status("cuda:0", ("a", "b", "c"), 40.0), engine="0")
    exporter.update_status(_status("cuda:0", ("d", "e"), 35.0), engine="1")
    exporter.update_telemetry(TelemetrySample(time_s=1.0, gpu_index=0, gpu_name="NVIDIA H200", temperature_c=41.0))
    exporter.update_telemetry(TelemetrySample(time_s=1.1, gpu_index=1, gpu_name="NVIDIA H200", temperature_c=47.0))
    families = scrape(exporter.port)
    assert {s.labels["engine"]: s.value for s in families["captioner_streams"]} == {"0": 3, "1": 2}
    assert {s.labels["engine"]: s.value for s in families["captioner_step_latency_ms"]} == {"0": 40.0, "1": 35.0}
    assert {s.labels["engine"] for s in families["captioner_pipeline_info"]} == {"0", "1"}
    assert {s.labels["gpu"]: s.value for s in families["DCGM_FI_DEV_GPU_TEMP"]} == {"0": 41.0, "1": 47.0}
    exporter.update_telemetry(TelemetrySample(time_s=2.0, gpu_index=1, cpu_pct=5.0))  # GPU 1 off the bus
    families = scrape(exporter.port)
    assert {s.labels["gpu"]: s.value for s in families["DCGM_FI_DEV_GPU_TEMP"]} == {"0": 41.0}
    assert families["captioner_host_cpu_percent"][0].value == 5.0  # the host's figures: the newest sample's

