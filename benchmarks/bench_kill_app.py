"""`kill -9` of the desktop app at random moments while it captions: is every transcript line
whole, and is nothing lost that the app had committed?

    python benchmarks/bench_kill_app.py --runs 20 [--seed 2] [--json out.json]

Each run opens the real app off-screen (QT_QPA_PLATFORM=offscreen) on a recording played at
real-time pace (`captioner gui --file`), with its transcripts in a scratch folder, and sends
SIGKILL 5-25 s after the start. The app writes a committed line to disk before the window shows
it (docs/engine.md), so the check is on the file: a header, then whole lines in the transcript's
format, each ending in a newline, in time order. Bounded: each run ends within about a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINE_RE = re.compile(r"^\[(\d\d):(\d\d):(\d\d\.\d{3}) --> \d\d:\d\d:\d\d\.\d{3}\] [^:]+: .+$")
SPEECH = ROOT / "tests" / "data" / "speech" / "audio" / "en_sonnet001_librivox.flac"


def _start_s(line: str) -> float:
    h, m, s = LINE_RE.match(line).groups()
    return int(h) * 3600 + int(m) * 60 + float(s)


def one_run(folder: Path, kill_after_s: float) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", CAPTIONER_DEVICE="cpu",
               CAPTIONER_TRANSCRIPT_DIR=str(folder), PYTHONUNBUFFERED="1")
    process = subprocess.Popen([sys.executable, "-m", "captioner", "gui", "--file", str(SPEECH),
                                "--settings", str(folder / "settings.ini")],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    time.sleep(kill_after_s)
    alive = process.poll() is None
    os.kill(process.pid, signal.SIGKILL)
    process.wait(10)
    transcripts = sorted(folder.glob("*.txt"))
    if not transcripts:
        return {"kill_after_s": round(kill_after_s, 2), "alive_at_kill": alive, "lines": 0, "every_line_whole": True,
                "note": "killed before the session started"}
    raw = transcripts[-1].read_bytes().decode("utf-8")
    lines = raw.splitlines()
    whole = raw.endswith("\n") and lines[0].startswith("# captioner transcript") and all(
        LINE_RE.match(line) for line in lines[1:])
    in_order = whole and [_start_s(x) for x in lines[1:]] == sorted(_start_s(x) for x in lines[1:])
    return {"kill_after_s": round(kill_after_s, 2), "alive_at_kill": alive, "lines": len(lines) - 1,
            "every_line_whole": whole, "in_time_order": in_order}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.runs < 1:
        print("bench_kill_app: --runs must be at least 1", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-kill-app-{os.getpid()}"
    results = []
    for run in range(args.runs):
        result = one_run(scratch / f"run{run}", rng.uniform(5.0, 25.0))
        results.append(result)
        print(json.dumps(result), flush=True)
    good = sum(1 for r in results if r["every_line_whole"] and r.get("in_time_order", True))
    with_lines = sum(1 for r in results if r["lines"])
    print(f"{good} of {len(results)} runs: every transcript line whole and in order "
          f"({with_lines} runs had committed lines when killed)")
    if args.json:
        args.json.write_text(json.dumps({"runs": results}, indent=1) + "\n", encoding="utf-8")
    return 0 if good == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
