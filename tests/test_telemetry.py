"""Telemetry without a GPU (every GPU field N/A, nothing raised) and the /proc CPU arithmetic."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from captioner.events import TelemetrySample
from captioner.gpu import telemetry
from captioner.gpu.telemetry import (
    CpuMeter,
    CpuTimes,
    NvmlReader,
    TelemetrySampler,
    cpu_load_pct,
    parse_proc_stat,
    read_proc_stat,
)

GPU_FIELDS = (
    "gpu_name", "temperature_c", "slowdown_temp_c", "power_w", "power_limit_w", "sm_clock_mhz",
    "mem_clock_mhz", "utilization_pct", "vram_used_bytes", "vram_total_bytes", "vram_process_bytes",
)

PROC_STAT = """cpu  5060 386 3039 49150 526 0 104 37 12 3
cpu0 2116 181 1391 25236 185 0 5 16 0 0
cpu1 2943 205 1648 23913 340 0 98 20 0 0
intr 1234 5 6
ctxt 999
"""


def test_parse_proc_stat_uses_aggregate_line_and_counts_iowait_as_idle():
    times = parse_proc_stat(PROC_STAT)
    # guest/guest_nice (12, 3) are already inside user/nice and must not be added again.
    total = 5060 + 386 + 3039 + 49150 + 526 + 0 + 104 + 37
    assert times == CpuTimes(busy=total - 49150 - 526, total=total)


@pytest.mark.parametrize("text", ["", "intr 1 2\n", "cpu a b c d\n", "cpu 1 2\n"])
def test_parse_proc_stat_rejects_malformed(text):
    assert parse_proc_stat(text) is None


def test_cpu_load_between_two_readings():
    before = CpuTimes(busy=100, total=1000)
    after = CpuTimes(busy=400, total=2000)
    assert cpu_load_pct(before, after) == pytest.approx(30.0)
    assert cpu_load_pct(after, after) is None  # no ticks elapsed: unknown, not 0
    assert cpu_load_pct(None, after) is None


def test_read_proc_stat_on_this_machine_and_missing_file(tmp_path):
    times = read_proc_stat()
    assert times is not None and 0 < times.busy < times.total
    assert read_proc_stat(str(tmp_path / "absent")) is None


def test_cpu_meter_sees_this_process_burn_cpu():
    meter = CpuMeter()
    end = time.process_time() + 0.3
    x = 0
    while time.process_time() < end:  # burn ~0.3 s of CPU in this process
        x += 1
    host_pct, process_pct = meter.read()
    assert host_pct is not None and 0.0 <= host_pct <= 100.0
    assert process_pct is not None and process_pct > 20.0


def test_cpu_meter_with_a_fake_clock_reports_share_of_one_core(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 100 800 0 0 0 0\n")
    now = [10.0]
    cpu_s = [1.0]
    meter = CpuMeter(str(stat), clock=lambda: now[0], process_times=lambda: SimpleNamespace(user=cpu_s[0], system=0.0))
    stat.write_text("cpu  200 0 200 1600 0 0 0 0\n")
    now[0], cpu_s[0] = 12.0, 1.5
    host_pct, process_pct = meter.read()
    assert host_pct == pytest.approx(20.0)
    assert process_pct == pytest.approx(25.0)


def test_nvml_reader_without_a_gpu_gives_none_never_raises():
    reader = NvmlReader(0)
    try:
        if reader.available:
            pytest.skip("this machine has an NVIDIA GPU")
        assert reader.error  # why it is unavailable, for the status bar
        assert reader.read_gpu() == {}
        sample = telemetry.sample_once(reader, CpuMeter(), time.monotonic())
        assert isinstance(sample, TelemetrySample)
        for name in GPU_FIELDS:
            assert getattr(sample, name) is None, name
    finally:
        reader.close()


def test_nvml_reader_for_an_absent_gpu_index_is_na():
    reader = NvmlReader(gpu_index=97)
    assert not reader.available
    assert reader.read_gpu() == {}
    reader.close()


def test_sampler_thread_fills_mailbox_and_bounded_history():
    seen: list[TelemetrySample] = []
    sampler = TelemetrySampler(period_s=0.02, history_samples=5, on_sample=seen.append)
    with sampler:
        assert sampler._thread is not None and sampler._thread.name == "captioner-telemetry"
        deadline = time.monotonic() + 10
        while len(seen) < 8 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert len(seen) >= 8
    history = sampler.history()
    assert len(history) == 5  # bounded
    assert [s.time_s for s in history] == sorted(s.time_s for s in history)
    assert sampler.latest() is history[-1]
    if not sampler.gpu_available:
        assert all(s.temperature_c is None and s.vram_used_bytes is None for s in history)
    assert history[-1].cpu_pct is not None and history[-1].process_cpu_pct is not None
    # stopped and joined: no thread of that name left running
    import threading

    assert not any(t.name == "captioner-telemetry" for t in threading.enumerate())


def test_sampler_survives_a_failing_listener():
    def broken(sample):
        raise RuntimeError("listener bug")

    with TelemetrySampler(period_s=0.01, on_sample=broken) as sampler:
        deadline = time.monotonic() + 10
        while len(sampler.history()) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert len(sampler.history()) >= 3


def test_gpu_names_empty_without_nvml():
    names = telemetry.nvml_gpu_names()
    assert isinstance(names, list)
    if not NvmlReader(0).available:
        assert names == []
