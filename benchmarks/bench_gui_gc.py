"""Where the desktop app's garbage collections run, and how long they take: on the GUI thread only
(the app as it is, captioner/ui/collector.py) against the interpreter's automatic collection
(whichever thread allocates), side by side in one invocation.

Each variant runs the real app (`captioner gui`, offscreen) in a process of its own, captioning a
recording through the live engine for ``--seconds``, with every collection logged from
``gc.callbacks``: the thread that ran it, its generation and its length. A collection on any
thread but the GUI's may destroy a Qt object there, which hung the app once (docs/ui.md, "A
hang"); so the count that matters is ``off_gui_thread``, and the cost is what the GUI thread
pays.

    python benchmarks/bench_gui_gc.py --seconds 25 --json gui-gc.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import percentile  # noqa: E402

VARIANTS = ("gui-thread", "automatic")


def summary(log: list[tuple[str, int, float]]) -> dict:
    """``log``: (thread name, generation, ms) per collection."""
    by_generation = {}
    for generation in (0, 1, 2):
        times_ms = [ms for _, g, ms in log if g == generation]
        by_generation[str(generation)] = {"n": len(times_ms), "p50_ms": percentile(times_ms, 50),
                                          "p99_ms": percentile(times_ms, 99),
                                          "max_ms": round(max(times_ms), 3) if times_ms else None}
    threads: dict[str, int] = {}
    for name, _, _ in log:
        threads[name] = threads.get(name, 0) + 1
    return {"collections": len(log), "off_gui_thread": sum(1 for name, _, _ in log if name != "MainThread"),
            "by_thread": threads, "by_generation": by_generation,
            "total_ms": round(sum(ms for _, _, ms in log), 1)}


def one_variant(variant: str, seconds: float, recording: str, out: Path) -> int:
    """This process: the app for ``seconds`` on ``recording``, its collections logged to ``out``."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    log: list[tuple[str, int, float]] = []
    started: dict[int, float] = {}

    def on_collection(phase: str, info: dict) -> None:
        ident = threading.get_ident()
        if phase == "start":
            started[ident] = time.perf_counter()
        elif ident in started:
            log.append((threading.current_thread().name, info["generation"],
                        (time.perf_counter() - started.pop(ident)) * 1e3))

    gc.callbacks.append(on_collection)
    if variant == "automatic":
        # The app before the collector: the window makes a plain object in its place.
        from PySide6.QtCore import QObject

        import captioner.ui.main_window

        captioner.ui.main_window.GuiThreadCollector = QObject
    from captioner.app.cli import main as captioner_main

    with tempfile.TemporaryDirectory() as home:
        code = captioner_main(["gui", "--device", "cpu", "--file", recording, "--quit-after", str(seconds),
                               "--settings", str(Path(home) / "settings.ini")])
    gc.callbacks.remove(on_collection)
    out.write_text(json.dumps({"variant": variant, "exit": code, **summary(log)}))
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=25.0, help="how long each variant captions")
    parser.add_argument("--recording", default=None, help="what to caption (default: the bundled sample)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # the child's
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not 5 <= args.seconds <= 600:
        print("bench_gui_gc: --seconds must be 5-600", file=sys.stderr)
        return 2
    if args.recording is None:
        from captioner.data import sample_speech_path

        args.recording = str(sample_speech_path())
    if args.variant is not None:
        return one_variant(args.variant, args.seconds, args.recording, args.out)
    variants = [v.strip() for v in args.variants.split(",")]
    if any(v not in VARIANTS for v in variants):
        print(f"bench_gui_gc: --variants takes {', '.join(VARIANTS)}, not {args.variants!r}", file=sys.stderr)
        return 2
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for variant in variants:
            out = Path(tmp) / f"{variant}.json"
            child = subprocess.run([sys.executable, __file__, "--variant", variant, "--seconds", str(args.seconds),
                                    "--recording", args.recording, "--out", str(out)],
                                   capture_output=True, text=True, timeout=args.seconds + 300)
            if child.returncode != 0 or not out.exists():
                why = (child.stderr.strip().splitlines() or ["no output"])[-1]
                print(f"bench_gui_gc: the {variant} run failed: {why}", file=sys.stderr)
                return 1
            runs.append(json.loads(out.read_text()))
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "seconds": args.seconds,
              "recording": Path(args.recording).name, "runs": runs}
    for run in runs:
        gens = ", ".join(f"gen {g}: {s['n']} (p50 {s['p50_ms']} / max {s['max_ms']} ms)"
                         for g, s in run["by_generation"].items() if s["n"])
        print(f"{run['variant']:>10}: {run['collections']} collections, {run['off_gui_thread']} off the GUI thread "
              f"{run['by_thread']}; {gens}; {run['total_ms']} ms in all")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
