"""benchmarks/bench_serve.py's split of each update's latency at the engine: the way back after
the engine made an update, in the served run and in the in-process baseline, and what serving
adds apart from how far behind the engine was (the figure issue 13's target is read from)."""

from __future__ import annotations

import json

import pytest

from bench_loader import load_benchmark

bench_serve = load_benchmark("bench_serve")


def test_after_engine_is_the_latency_less_the_engines_side():
    # An update of the audio up to 3.0 s, made by the engine 0.4 s after that audio reached it
    # (emitted at 3.4 s of its stream clock, which starts a chunk before the first chunk's
    # arrival), had by the client 0.55 s after the audio was due: 0.05 s on the way back, plus
    # the chunk the clock starts early.
    assert bench_serve.after_engine_s(0.55, 3.0, 3.4) == pytest.approx(0.55 - 0.4 + bench_serve.CHUNK_S)
    assert bench_serve.after_engine_s(0.55, 3.0, None) is None


def test_serving_added_is_the_way_in_and_back_less_in_process_way_back():
    served = {"after_engine_ms": {"p99": 30.0}, "frontend_to_engine_ms": {"p50": 20.0, "p99": 35.0}}
    assert bench_serve.serving_added_p99_ms(served, {"after_engine_ms": {"p99": 12.0}}) == 53.0
    # One process: the WebSocket loop hands audio straight to the engine's source.
    assert bench_serve.serving_added_p99_ms({"after_engine_ms": {"p99": 30.0}},
                                            {"after_engine_ms": {"p99": 12.0}}) == 18.0
    assert bench_serve.serving_added_p99_ms({"after_engine_ms": {"p99": None}},
                                            {"after_engine_ms": {"p99": 12.0}}) is None


def test_serving_added_is_never_negative_and_keeps_the_signed_difference():
    # The run: the baseline's way back had the longer tail (53.5 ms at p99 against 30 ms
    # served, 12 ms on the way in), so the difference of the p99s came to -11.5 ms. Serving
    # cannot take time away: the figure is 0, and the p99s and their difference are kept.
    served = {"after_engine_ms": {"p50": 4.0, "p99": 30.0, "n": 400},
              "frontend_to_engine_ms": {"p50": 6.0, "p99": 12.0}}
    local = {"after_engine_ms": {"p50": 5.0, "p99": 53.5, "n": 380}}
    assert bench_serve.serving_added_p99_ms(served, local) == 0.0
    assert bench_serve.serving_added_p99_parts(served, local) == {
        "way_in_p99": 12.0, "way_back_served_p99": 30.0, "way_back_in_process_p99": 53.5,
        "difference_of_p99s": -11.5}
    # A positive difference is the figure itself.
    local["after_engine_ms"]["p99"] = 20.0
    assert bench_serve.serving_added_p99_ms(served, local) == 22.0
    assert bench_serve.serving_added_p99_parts(served, local)["difference_of_p99s"] == 22.0
    assert bench_serve.serving_added_p99_parts({"after_engine_ms": {}}, local) is None


@pytest.mark.slow
def test_a_real_run_splits_every_update(tmp_path):
    """Two clients of real recordings through a real server with two front-ends, then the same
    streams in-process: every captioned update is split, and the way back is never negative
    (the engine's side can not end after the client had the update) nor the whole latency."""
    out = tmp_path / "serve.json"
    code = bench_serve.main(["--clients", "2", "--ramp", "4", "--frontends", "2", "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["held"] == 2
    served_updates = sum(v["n"] for v in result["latency_served"].values())
    assert result["after_engine_ms"]["n"] == served_updates > 0
    local = result["latency_in_process"]
    assert local["after_engine_ms"]["n"] == sum(local[k]["n"] for k in ("partial", "final")) > 0
    for split, whole in ((result["after_engine_ms"], result["latency_served"]),
                         (local["after_engine_ms"], local)):
        assert split["p50"] >= -5.0  # the clocks' granularity: the pacing loop sleeps 5 ms
        assert split["p50"] < 1000 * max(whole["partial"]["p50_s"], whole["final"]["p50_s"])
    assert "p99" in result["frontend_to_engine_ms"]
    # How late the hub's loop, the front-ends' and the clients' ran: each woke every 10 ms meanwhile.
    for late in (result["server_loop_late_ms"], result["frontend_loop_late_ms"], result["client_loop_late_ms"]):
        assert 0.0 <= late["p50"] <= late["p99"] <= late["max"]
    # The captions' way from their engine's outbox to the front-ends: a part of the served way back.
    inside = result["outbox_to_frontend_ms"]
    assert 0.0 <= inside["p50"] <= inside["p99"] <= inside["max"]
    assert inside["p50"] <= result["after_engine_ms"]["p50"] + 5.0
    difference = result["after_engine_ms"]["p99"] + result["frontend_to_engine_ms"]["p99"] - local["after_engine_ms"]["p99"]
    assert result["serving_added_p99_parts_ms"]["difference_of_p99s"] == pytest.approx(difference, abs=0.11)
    assert result["serving_added_p99_ms"] == pytest.approx(max(0.0, difference), abs=0.11)
    assert result["serving_added_p99_ms"] >= 0.0


def test_speakers_are_spread_over_the_ramp_and_the_rest_send_silence():
    every = bench_serve.speaker_clips(6, 4, None)
    assert every == [0, 1, 2, 3, 0, 1]
    mixed = bench_serve.speaker_clips(150, 11, 4)
    speaking = [i for i, k in enumerate(mixed) if k != bench_serve.SILENT]
    assert speaking == [0, 37, 75, 112]  # one early, the others through the ramp
    assert [mixed[i] for i in speaking] == [0, 1, 2, 3]  # the recordings in turn
    assert bench_serve.speaker_clips(3, 2, 3) == [0, 1, 0]
