"""benchmarks/bench_host_arrival.py: the host's step structure under network arrival, run small
here (the scripted listener, a simulated clock): with a network's jitter, chunks that wait for
the next step together make fewer, fuller model steps than chunks that step the ones before
them, and chunks on time make about the same steps either way."""

from __future__ import annotations

import json

import pytest

from bench_loader import load_benchmark


def test_chunks_that_wait_together_make_fewer_fuller_steps(tmp_path, capsys):
    out = tmp_path / "arrival.json"
    assert load_benchmark("bench_host_arrival").main(["--streams", "300", "--seconds", "4", "--json", str(out)]) == 0
    runs = {(r["jitter"], r["rule"]): r for r in json.loads(out.read_text())["runs"]}
    on_time_wait, on_time_step = runs[(False, "wait")], runs[(False, "step")]
    assert on_time_step["model_steps"] > 0
    assert abs(on_time_wait["model_steps"] - on_time_step["model_steps"]) <= 0.25 * on_time_step["model_steps"]
    waits, steps = runs[(True, "wait")], runs[(True, "step")]
    assert 2 * waits["model_steps"] < steps["model_steps"] and waits["rows_per_step"] > 2 * steps["rows_per_step"]
    assert waits["engine_ticks"] < steps["engine_ticks"]
    # The same audio is captioned either way: every run stepped about as many rows, as often.
    assert abs(waits["rows"] - steps["rows"]) <= 0.1 * steps["rows"]
    assert waits["interval_p99_s"] <= 1.5
    assert "| jitter | wait |" in capsys.readouterr().out


def test_out_of_range_input_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_benchmark("bench_host_arrival").main(["--streams", "0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].endswith("--streams must be 1..2000 and --seconds 1..60")
