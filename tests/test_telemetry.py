"""Telemetry without a GPU (every GPU field N/A, nothing raised) and the host/process CPU meter."""

from __future__ import annotations

import os
import time

import pytest

from captioner.events import TelemetrySample
from captioner.gpu import telemetry
from captioner.gpu.telemetry import CpuMeter, NvmlReader, TelemetrySampler

GPU_FIELDS = (
    "gpu_name", "temperature_c", "slowdown_temp_c", "power_w", "power_limit_w", "sm_clock_mhz",
    "mem_clock_mhz", "utilization_pct", "vram_used_bytes", "vram_total_bytes", "vram_process_bytes",
)


def burn_cpu(seconds: float) -> None:
    """Keeps this thread busy for ``seconds`` of its own CPU time."""
    end_s = time.process_time() + seconds
    x = 0
    while time.process_time() < end_s:
        x += 1


def test_cpu_meter_sees_this_process_burn_cpu_and_not_idle():
    meter = CpuMeter()
    time.sleep(0.3)  # idle: this process uses next to no CPU
    idle_host_pct, idle_process_pct = meter.read()
    burn_cpu(0.3)
    busy_host_pct, busy_process_pct = meter.read()
    for pct in (idle_host_pct, busy_host_pct):
        assert pct is not None and 0.0 <= pct <= 100.0
    assert idle_process_pct is not None and busy_process_pct is not None
    # Busy for the whole interval is ~100% of one core; the 2 cores here are shared, so only
    # require a clear rise over the idle reading.
    assert busy_process_pct > 20.0
    assert busy_process_pct > idle_process_pct + 15.0
    assert idle_process_pct < 15.0


def test_cpu_meter_measures_nothing_over_too_short_an_interval():
    # Over a few milliseconds one clock tick of CPU time reads as hundreds of percent: the
    # sampler's first reading, at once after the meter was made, spiked to 380 % on two cores.
    meter = CpuMeter()
    burn_cpu(0.01)
    assert meter.read() == (None, None)  # nothing measured yet
    time.sleep(0.15)
    measured = meter.read()  # the whole time since the meter was made
    host_pct, process_pct = measured
    assert host_pct is not None and process_pct is not None and 0.0 <= process_pct <= 100.0 * os.cpu_count()
    burn_cpu(0.01)
    assert meter.read() == measured  # too soon again: the last measurement, not a new spike


def test_cpu_meter_reads_process_cpu_in_percent_of_one_core():
    meter = CpuMeter()
    cpu_start_s, wall_start_s = time.process_time(), time.monotonic()
    burn_cpu(0.5)
    _, process_pct = meter.read()
    # What this process's own clocks say it used; a share of the whole machine would be this
    # divided by the core count.
    one_core_pct = 100.0 * (time.process_time() - cpu_start_s) / (time.monotonic() - wall_start_s)
    assert process_pct == pytest.approx(one_core_pct, rel=0.2)


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


def test_process_tree_counts_the_processes_this_one_started(tmp_path):
    # A child that starts a grandchild, as a served engine's host process does under the server:
    # the GPU memory of both is the server's, not only what the sampling process holds.
    import subprocess
    import sys

    from captioner.gpu.telemetry import process_tree_pids

    ready = tmp_path / "grandchild.pid"
    script = ("import subprocess, sys, time, pathlib\n"
              "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              f"pathlib.Path({str(ready)!r}).write_text(str(g.pid))\n"
              "time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", script])
    grandchild = None
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() or not ready.read_text():
            assert time.monotonic() < deadline, "the grandchild did not start"
            time.sleep(0.05)
        grandchild = int(ready.read_text())
        pids = process_tree_pids(os.getpid())
        assert {os.getpid(), child.pid, grandchild} <= pids
        assert process_tree_pids(child.pid) == {child.pid, grandchild}
    finally:
        if grandchild is not None:
            os.kill(grandchild, 9)
        child.kill()
        child.wait()
    # A process that is gone has no children to list: its own pid only, nothing raised.
    assert process_tree_pids(child.pid) == {child.pid}
