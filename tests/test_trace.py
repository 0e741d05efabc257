"""Trace files: a run's events written as JSON Lines and read back identical."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from captioner.errors import UserError
from captioner.events import CaptionUpdate, PipelineStatus, TelemetrySample
from captioner.trace import (
    TRACE_VERSION,
    TraceRecorder,
    caption_latency_s,
    load_trace,
    record_run,
    save_trace,
)


def run_events():
    t0 = 1000.0
    events = []
    for i in range(6):
        t = t0 + 0.5 * i
        events.append(
            TelemetrySample(
                time_s=t, gpu_index=0, gpu_name="NVIDIA H200", temperature_c=40.0 + i, slowdown_temp_c=90.0,
                power_w=120.5 + i, power_limit_w=700.0, sm_clock_mhz=1980.0, mem_clock_mhz=3201.0,
                utilization_pct=None if i == 2 else 30.0, vram_used_bytes=(2 + i) << 30,
                vram_total_bytes=141 << 30, vram_process_bytes=(1 + i) << 30, cpu_pct=12.5, process_cpu_pct=40.0,
            )
        )
        events.append(
            PipelineStatus(
                time_s=t + 0.1, provider="CUDAExecutionProvider", model="tiny.en", device_name="NVIDIA H200",
                streams=("Me", "Meeting"), frame_latency_ms=0.8, step_latency_ms=21.0 + i,
                caption_latency_s=None if i == 0 else 0.9, dropped_frames=i // 3, real_time_factor=0.05,
                input_levels_dbfs=(-23.5, -40.0), batch_size=2, extra=(("encoder_ms", 9.5),),
            )
        )
    events.append(CaptionUpdate("Me", "partial", "hello wor", 0.2, 1.0, 1.3, 1.4, segment=1, language="en"))
    events.append(CaptionUpdate("Me", "final", "Hello world.", 0.2, 1.1, 1.8, 1.9, segment=1, language="en"))
    return events


def test_save_and_load_round_trip(tmp_path):
    events = run_events()
    path = tmp_path / "run.trace.jsonl"
    assert save_trace(path, events, meta={"device": "H200", "note": "test"}) == len(events)
    trace = load_trace(path)
    assert trace.version == TRACE_VERSION
    assert trace.meta == {"device": "H200", "note": "test"}
    assert trace.telemetry == [e for e in events if isinstance(e, TelemetrySample)]
    assert trace.statuses == [e for e in events if isinstance(e, PipelineStatus)]
    assert trace.captions == [e for e in events if isinstance(e, CaptionUpdate)]
    assert trace.statuses[0].streams == ("Me", "Meeting")
    assert trace.statuses[0].extra == (("encoder_ms", 9.5),)
    assert [c.text for c in trace.final_captions()] == ["Hello world."]


def test_series_are_relative_with_nan_for_na(tmp_path):
    path = tmp_path / "run.jsonl"
    save_trace(path, run_events())
    trace = load_trace(path)
    assert trace.start_s() == 1000.0
    assert trace.duration_s() == pytest.approx(2.6)
    t, util = trace.telemetry_series("utilization_pct")
    assert t.tolist() == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0, 2.5])
    assert math.isnan(util[2]) and util[0] == 30.0
    _, step = trace.status_series("step_latency_ms")
    assert step.dtype == np.float64 and step.tolist() == [21.0, 22.0, 23.0, 24.0, 25.0, 26.0]


def test_file_is_json_lines_with_versioned_header(tmp_path):
    path = tmp_path / "run.jsonl"
    save_trace(path, run_events())
    lines = path.read_text().splitlines()
    head = json.loads(lines[0])
    assert head["format"] == "captioner-trace" and head["version"] == TRACE_VERSION
    assert {json.loads(line)["type"] for line in lines[1:]} == {"telemetry", "status", "caption"}


def test_nan_is_written_as_null(tmp_path):
    path = tmp_path / "run.jsonl"
    with TraceRecorder(path) as rec:
        rec.record(TelemetrySample(time_s=1.0, power_w=float("nan")))
    assert load_trace(path).telemetry[0].power_w is None


def test_unknown_types_and_fields_are_skipped_and_torn_last_line_tolerated(tmp_path):
    path = tmp_path / "run.jsonl"
    save_trace(path, run_events()[:2])
    with path.open("a") as f:
        f.write(json.dumps({"type": "future_thing", "x": 1}) + "\n")
        f.write(json.dumps({"type": "telemetry", "time_s": 5.0, "new_field": 3}) + "\n")
        f.write('{"type": "telemetry", "time_')  # killed mid-write
    trace = load_trace(path)
    assert len(trace.telemetry) == 2 and trace.telemetry[1].time_s == 5.0


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "empty"),
        ("hello\n", "not a captioner trace"),
        ('{"format": "captioner-trace", "version": 99}\n', "version 99"),
        ('{"format": "captioner-trace", "version": 1}\n{"type": "status"}\n{"type": "caption", "x": 1}\n', ":2:"),
    ],
)
def test_bad_files_raise_user_error(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(UserError, match=message):
        load_trace(path)


def test_missing_file_is_user_error(tmp_path):
    with pytest.raises(UserError, match="cannot read"):
        load_trace(tmp_path / "nope.jsonl")


def test_caption_latency():
    live = CaptionUpdate("Me", "final", "x", 1.0, 2.0, emitted_audio_s=2.5, emitted_wall_s=2.9)
    assert caption_latency_s(live) == pytest.approx(0.9)  # 0.5 waiting for audio + 0.4 behind
    fast_file = CaptionUpdate("f", "final", "x", 1.0, 2.0, emitted_audio_s=2.5, emitted_wall_s=0.3)
    assert caption_latency_s(fast_file) == pytest.approx(0.5)


class _RecordedPipeline:
    """A finished run's outboxes, replayed through the same two calls the live pipeline has."""

    def __init__(self, events):
        self._captions = [e for e in events if isinstance(e, CaptionUpdate)]
        self._statuses = [e for e in events if isinstance(e, PipelineStatus)]

    def drain_captions(self):
        out, self._captions = self._captions, []
        return out

    def latest_status(self):
        return self._statuses.pop(0) if len(self._statuses) > 1 else self._statuses[0]


def test_record_run_drains_each_event_once(tmp_path):
    events = run_events()
    pipeline = _RecordedPipeline(events)
    path = tmp_path / "run.jsonl"
    with TraceRecorder(path, meta={"source": "test"}) as rec:
        record_run(rec, pipeline, None, poll_s=0.0, max_s=0.05)
    trace = load_trace(path)
    assert trace.captions == [e for e in events if isinstance(e, CaptionUpdate)]
    assert [s.step_latency_ms for s in trace.statuses] == [21.0, 22.0, 23.0, 24.0, 25.0, 26.0]
