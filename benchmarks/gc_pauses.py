"""Every process's garbage-collection pauses during a benchmark run.

A collection stops every thread of its process for its length; a full one walks every container
object the process holds. On an H200 serving 1,000 connections they took up to 120 ms in the
serving process and 90-111 ms in each model process (benchmarks/results/serve/HISTORY.md, "pauses of the
garbage collector"). :func:`enable` makes every Python process started afterwards from this one (and
this one) append each full collection, and each younger one of :data:`LOGGED_MS` or more, to
``<pid>.txt`` in a folder; :func:`summary` reads the folder back, process by process.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from pathlib import Path

LOGGED_MS = 1.0
ENV = "CAPTIONER_BENCH_GC_LOG"
TYPES_ENV = "CAPTIONER_BENCH_GC_TYPES"
"""Set to N (ms): a full collection of N ms or more after the process froze its start-up, and
longer than any before it, also writes what the collector walked, type by type, to ``<pid>.types``
(a diagnosis: listing the objects pauses the process again, so not for runs whose latency is
reported)."""
COUNT_ENV = "CAPTIONER_BENCH_GC_COUNT_S"
"""Set to N (seconds): every N s the process also appends ``unix_s objects`` to ``<pid>.count``,
the tracked objects that are not frozen, which is what its next full collection walks (a
diagnosis: counting them holds the interpreter for about a millisecond per 30,000)."""
SITE = Path(__file__).resolve().parent / "gc_log"  # its sitecustomize.py calls log_this_process
_state: dict = {}  # this process's log: its folder and open file, once log_this_process ran


def log_this_process(folder: str) -> None:
    """This process's collections of LOGGED_MS or more, appended to ``folder/<pid>.txt`` as
    ``unix_s generation ms collected`` (the first line: ``# `` and the command line). A second
    call points the same logger at another folder."""
    installed = bool(_state)
    try:
        types_from_ms = float(os.environ.get(TYPES_ENV, "inf"))
    except ValueError:
        types_from_ms = float("inf")
    _state.update(folder=folder, file=None, started=0.0, types_from_ms=types_from_ms)
    if not installed:
        gc.callbacks.append(_on_collection)
        try:
            count_every_s = float(os.environ.get(COUNT_ENV, "0"))
        except ValueError:
            count_every_s = 0.0
        if count_every_s > 0:
            threading.Thread(target=_count_objects, args=(count_every_s,), name="gc-count", daemon=True).start()


def _count_objects(every_s: float) -> None:
    while True:
        time.sleep(every_s)
        objects = len(gc.get_objects())
        with open(os.path.join(_state["folder"], f"{os.getpid()}.count"), "a") as out:
            out.write(f"{time.time():.3f} {objects}\n")


def _on_collection(phase: str, info: dict) -> None:
    if phase == "start":
        _state["started"] = time.perf_counter()
        return
    ms = (time.perf_counter() - _state["started"]) * 1e3
    if ms < LOGGED_MS and info["generation"] != 2:  # every full one: their count is what tuning moves
        return
    if _state["file"] is None:
        _state["file"] = open(os.path.join(_state["folder"], f"{os.getpid()}.txt"), "a", buffering=1)
        _state["file"].write(f"# {_command_line()}\n")
    _state["file"].write(f"{time.time():.3f} {info['generation']} {ms:.2f} {info['collected']}\n")
    # The longest full collection so far past the threshold: its objects are listed (it rises).
    if info["generation"] == 2 and gc.get_freeze_count() and ms >= _state["types_from_ms"]:
        _state["types_from_ms"] = ms
        _write_types(ms)


def _write_types(ms: float) -> None:
    """What a full collection walks: the tracked objects of each generation (frozen ones are not
    walked), the 30 commonest types of them with how many items their containers hold."""
    counts: dict[str, list[int]] = {}
    walked = 0
    for obj in gc.get_objects():
        walked += 1
        entry = counts.setdefault(type(obj).__qualname__, [0, 0])
        entry[0] += 1
        if isinstance(obj, (list, tuple, dict, set, frozenset)) or type(obj).__name__ == "deque":
            entry[1] += len(obj)
    with open(os.path.join(_state["folder"], f"{os.getpid()}.types"), "w") as out:
        out.write(f"# {_command_line()}\n# full collection {ms:.1f} ms; tracked, not frozen: {walked}; "
                  f"frozen: {gc.get_freeze_count()}; generations {gc.get_count()}\n")
        for name, (n, items) in sorted(counts.items(), key=lambda kv: -kv[1][0])[:30]:
            out.write(f"{n:10d} {items:12d} {name}\n")


def _command_line() -> str:
    try:
        raw = Path("/proc/self/cmdline").read_bytes()
    except OSError:
        return " ".join(sys.argv)
    return raw.replace(b"\0", b" ").decode(errors="replace").replace("\n", " ").strip()[:300]


def enable(folder: Path) -> None:
    """This process, and every Python process it starts from now on, logs into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    os.environ[ENV] = str(folder)
    here = str(SITE.parent)
    paths = [str(SITE), here]
    if not all(p in sys.path for p in paths):
        sys.path[:0] = [p for p in paths if p not in sys.path]  # a model process gets our sys.path
    known = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    os.environ["PYTHONPATH"] = os.pathsep.join([p for p in paths if p not in known] + [p for p in known if p])
    log_this_process(str(folder))


def role(command_line: str) -> str:
    if "captioner.engine.host" in command_line:
        return "model process"
    if "captioner.serve.frontend" in command_line:
        return "front-end"
    if " serve " in f" {command_line} " and "captioner" in command_line:
        return "server"
    if "multiprocessing" in command_line:
        return "client process"
    return "benchmark"


def summary(folder: Path, from_unix_s: float = 0.0) -> dict[str, list[dict]]:
    """Per role (server, model process, front-end, client process, benchmark), one entry per
    process: full collections (count, longest, total ms, and each one's ms and how many
    unreachable objects it freed: a long one that freed thousands was cyclic garbage made while
    serving, one that freed few walked a large live heap) and pauses of 1 ms or more of any
    generation (count, longest, how many of 20 ms and of 50 ms or more), those from
    ``from_unix_s`` on (after the start-up: its own collection, which the freeze makes, is not
    serving's); with ``COUNT_ENV``, the objects a full collection would walk (most, median, last)."""
    out: dict[str, list[dict]] = {}
    for path in sorted(folder.glob("*.txt")):
        lines = path.read_text().splitlines()
        head = lines[0][2:] if lines and lines[0].startswith("# ") else ""
        rows = [row for row in (line.split() for line in lines if line and not line.startswith("#"))
                if len(row) == 4 and float(row[0]) >= from_unix_s]
        pauses = [float(r[2]) for r in rows if float(r[2]) >= LOGGED_MS]
        full_rows = [r for r in rows if r[1] == "2"]
        full = [float(r[2]) for r in full_rows]
        out.setdefault(role(head), []).append({
            "pid": int(path.stem), "pauses": len(pauses), "pause_ms_max": max(pauses, default=0.0),
            "pauses_20ms": sum(p >= 20 for p in pauses), "pauses_50ms": sum(p >= 50 for p in pauses),
            "full": len(full), "full_ms_max": max(full, default=0.0), "full_ms_total": round(sum(full), 1),
            "full_ms_and_freed": [[float(r[2]), int(r[3])] for r in full_rows],
            **_objects_counted(path.with_suffix(".count"), from_unix_s)})
    return out


def _objects_counted(path: Path, from_unix_s: float) -> dict:
    """``COUNT_ENV``'s counts from ``from_unix_s`` on: the most, the median and the last."""
    if not path.exists():
        return {}
    counts = [int(row[1]) for row in (line.split() for line in path.read_text().splitlines())
              if len(row) == 2 and float(row[0]) >= from_unix_s]
    if not counts:
        return {}
    return {"objects_max": max(counts), "objects_median": sorted(counts)[len(counts) // 2], "objects_last": counts[-1]}
