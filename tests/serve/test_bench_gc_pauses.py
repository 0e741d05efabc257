"""benchmarks/gc_pauses.py: bench_serve --gc-log's record of every process's garbage-collection
pauses (on an H200 at 1,000 connections: up to 120 ms in the serving process, docs/serve.md)."""

from __future__ import annotations

import subprocess
import sys
import time

from bench_loader import BENCHMARKS, load_benchmark

gc_pauses = load_benchmark("gc_pauses")


def test_a_process_started_after_enable_logs_its_collections(tmp_path):
    folder = tmp_path / "gc"
    # A parent that enables the log, and a child it starts as the server starts its own: a
    # fresh interpreter that imports the log through its path, with a full collection of
    # 400,000 containers (several milliseconds on any machine).
    parent = (f"import sys, subprocess; sys.path.insert(0, {str(BENCHMARKS)!r}); from pathlib import Path; "
              f"import gc_pauses; gc_pauses.enable(Path({str(folder)!r})); "
              "subprocess.run([sys.executable, '-c', 'import gc; x = [[i] for i in range(400000)]; gc.collect()'], "
              "check=True)")
    subprocess.run([sys.executable, "-c", parent], check=True, timeout=120)
    processes = [p for entries in gc_pauses.summary(folder).values() for p in entries]
    child = [p for p in processes if p["full"] >= 1]
    assert child and child[0]["full_ms_max"] >= gc_pauses.LOGGED_MS and child[0]["pauses"] >= child[0]["full"]
    # Counted from a moment on: nothing after the run.
    later = gc_pauses.summary(folder, time.time() + 60)
    assert all(p["pauses"] == 0 and p["full"] == 0 for entries in later.values() for p in entries)


def test_the_types_a_long_full_collection_walked_are_written_beside_the_log(tmp_path):
    folder = tmp_path / "gc"
    # A frozen start-up, then 200,000 lists made while "serving": the collection that walks them
    # names them, and the summary reads past the types file. The lists are made with the
    # collector off: an automatic full collection half-way would be the one censused.
    child = ("import gc; gc.freeze(); gc.disable(); x = [[i] for i in range(200000)]; gc.enable(); gc.collect()")
    parent = (f"import sys, os, subprocess; sys.path.insert(0, {str(BENCHMARKS)!r}); from pathlib import Path; "
              f"import gc_pauses; gc_pauses.enable(Path({str(folder)!r})); os.environ[gc_pauses.TYPES_ENV] = '0'; "
              f"subprocess.run([sys.executable, '-c', {child!r}], check=True)")
    subprocess.run([sys.executable, "-c", parent], check=True, timeout=120)
    written = list(folder.glob("*.types"))
    assert len(written) == 1
    lines = written[0].read_text().splitlines()
    assert lines[0].startswith("# ") and "tracked, not frozen" in lines[1]
    count, items, name = lines[2].split()
    assert name == "list" and int(count) >= 200_000 and int(items) >= 200_000
    assert any(p["full"] >= 1 for entries in gc_pauses.summary(folder).values() for p in entries)


def test_each_full_collection_says_how_much_garbage_it_freed(tmp_path):
    """A long full collection either walks a large live heap or frees cyclic garbage; the
    summary tells them apart by what each one freed."""
    folder = tmp_path / "gc"
    child = ("import gc; gc.freeze(); live = [[i] for i in range(200000)]; gc.collect()\n"
             "keep = []\nfor _ in range(100000):\n    a = []; a.append(a); keep.append(a)\n"
             "del a, keep; gc.collect()")  # 100,000 lists that only refer to themselves: cycles
    parent = (f"import sys, subprocess; sys.path.insert(0, {str(BENCHMARKS)!r}); from pathlib import Path; "
              f"import gc_pauses; gc_pauses.enable(Path({str(folder)!r})); "
              f"subprocess.run([sys.executable, '-c', {child!r}], check=True)")
    subprocess.run([sys.executable, "-c", parent], check=True, timeout=120)
    entries = [p for ps in gc_pauses.summary(folder).values() for p in ps if p["full_ms_and_freed"]]
    freed = sorted(n for p in entries for _, n in p["full_ms_and_freed"])
    assert freed and freed[-1] >= 100_000
    assert all(len(p["full_ms_and_freed"]) == p["full"] for p in entries)


def test_the_objects_a_full_collection_would_walk_are_counted_while_the_process_runs(tmp_path):
    folder = tmp_path / "gc"
    # A frozen start-up, then 50,000 lists held for half a second and dropped: counted every
    # 0.1 s, the most is at least those, and the last count (after the drop) far fewer.
    child = ("import gc, time; gc.freeze(); x = [[i] for i in range(50000)]; time.sleep(0.5); del x; "
             "time.sleep(0.3); gc.collect()")
    parent = (f"import sys, os, subprocess; sys.path.insert(0, {str(BENCHMARKS)!r}); from pathlib import Path; "
              f"import gc_pauses; os.environ[gc_pauses.COUNT_ENV] = '0.1'; gc_pauses.enable(Path({str(folder)!r})); "
              f"subprocess.run([sys.executable, '-c', {child!r}], check=True)")
    subprocess.run([sys.executable, "-c", parent], check=True, timeout=120)
    counted = [p for entries in gc_pauses.summary(folder).values() for p in entries if p.get("objects_max", 0) >= 50_000]
    assert len(counted) == 1
    assert counted[0]["objects_last"] < 10_000 <= 50_000 <= counted[0]["objects_max"]
