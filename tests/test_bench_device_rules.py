"""benchmarks/bench_device_rules.py runs its NumPy path here (the H200 adds the kernel beside
the CuPy array code) and refuses bad input with one line."""

from __future__ import annotations

import json

from bench_loader import load_benchmark


def test_the_numpy_path_runs_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert load_benchmark("bench_device_rules").main(["--device", "cpu", "--batches", "2,3", "--steps", "2", "--warmup", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["device"] == "cpu" and result["n_vocab"] == 51864 and result["all_same_tokens"]
    rows = result["results"]
    assert [(r["batch"], r["mode"], r["path"]) for r in rows] == [
        (2, "step", "array"), (2, "choose", "array"), (3, "step", "array"), (3, "choose", "array")]
    for row in rows:
        assert row["steps"] == 2 and row["host_ms_median"] > 0 and row["gpu_ms_median"] is None
    assert "B=   3 choose array" in capsys.readouterr().out


def test_bad_batches_are_one_line_and_exit_2(capsys):
    assert load_benchmark("bench_device_rules").main(["--device", "cpu", "--batches", "4,x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--batches" in err
