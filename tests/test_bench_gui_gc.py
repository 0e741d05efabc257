"""benchmarks/bench_gui_gc.py: where the desktop app's collections ran and what they cost."""

from __future__ import annotations

from bench_loader import load_benchmark

bench_gui_gc = load_benchmark("bench_gui_gc")


def test_the_summary_counts_collections_off_the_gui_thread_and_times_each_generation():
    log = [("MainThread", 0, 0.1), ("MainThread", 0, 0.3), ("captioner-worker", 0, 0.2),
           ("captioner-language-check", 1, 1.5), ("MainThread", 2, 20.0)]
    result = bench_gui_gc.summary(log)
    assert result["collections"] == 5 and result["off_gui_thread"] == 2
    assert result["by_thread"] == {"MainThread": 3, "captioner-worker": 1, "captioner-language-check": 1}
    young = result["by_generation"]["0"]
    assert young["n"] == 3 and young["p50_ms"] == 0.2 and young["max_ms"] == 0.3
    assert result["by_generation"]["2"] == {"n": 1, "p50_ms": 20.0, "p99_ms": 20.0, "max_ms": 20.0}
    assert result["total_ms"] == 22.1


def test_out_of_range_arguments_are_refused_in_one_line(capsys):
    assert bench_gui_gc.main(["--seconds", "1"]) == 2
    assert bench_gui_gc.main(["--variants", "sometimes"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("bench_gui_gc: ") for line in lines)
