"""`kill -9` of a live `captioner listen` at random moments: is the transcript complete to its
last committed line, and is every line whole?

    python benchmarks/bench_kill.py --runs 20 [--seed 1] [--json out.json]

Each run starts a private PulseAudio server with a null sink (tests/pulse.py), captions its
monitor with `captioner listen --device cpu`, plays real speech into the sink over and over,
and sends SIGKILL at a random moment 4-20 s after listening began. Then it checks that every
line the process printed as committed is in the transcript, in order, and that every transcript
line is whole (the transcript's line format, a newline at the end). Bounded: each run ends
within about 40 s.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINE_RE = re.compile(r"^\[\d\d:\d\d:\d\d\.\d{3} --> \d\d:\d\d:\d\d\.\d{3}\] [^:]+: .+$")


def _pulse_helper():
    spec = importlib.util.spec_from_file_location("captioner_tests_pulse", ROOT / "tests" / "pulse.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _speech_files() -> list[Path]:
    here = ROOT / "tests" / "data" / "speech" / "audio"
    return sorted(p for p in here.iterdir() if p.name.startswith("en_ls_") or "jfk" in p.name)


def one_run(pulse, transcript: Path, kill_after_s: float) -> dict:
    server = pulse.start_pulse_server()
    players: list[subprocess.Popen] = []
    try:
        env = dict(server.env, CAPTIONER_DEVICE="cpu", PYTHONUNBUFFERED="1")
        process = subprocess.Popen(
            [sys.executable, "-m", "captioner", "listen", "--input", server.sink.device, "--transcript",
             str(transcript)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            stdin=subprocess.DEVNULL)
        printed: list[str] = []
        ready = threading.Event()

        def read_out():
            for line in process.stdout:
                printed.append(line.rstrip("\n"))

        def read_err():
            for line in process.stderr:
                if "listening to" in line:
                    ready.set()

        threading.Thread(target=read_out, daemon=True).start()
        threading.Thread(target=read_err, daemon=True).start()
        if not ready.wait(60):
            process.kill()
            return {"error": "listen did not start"}
        started = time.monotonic()
        files = _speech_files()
        while time.monotonic() - started < kill_after_s:
            if not players or players[-1].poll() is not None:
                players.append(server.play(files[len(players) % len(files)]))
            time.sleep(0.05)
        shown_before_kill = list(printed)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
    finally:
        for player in players:
            if player.poll() is None:
                player.kill()
        server.stop()
    raw = transcript.read_bytes().decode("utf-8")
    lines = raw.splitlines()[1:]
    whole = raw.endswith("\n") and all(LINE_RE.match(line) for line in lines)
    saved = [line.split(": ", 1)[1] for line in lines]
    shown = [line.split("] ", 1)[1] for line in shown_before_kill if line.startswith("[")]
    return {"kill_after_s": round(kill_after_s, 2), "lines_shown": len(shown), "lines_saved": len(saved),
            "shown_are_saved": saved[:len(shown)] == shown, "every_line_whole": whole}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.runs < 1:
        print("bench_kill: --runs must be at least 1", file=sys.stderr)
        return 2
    pulse = _pulse_helper()
    missing = pulse.pulseaudio_missing()
    if missing:
        print(f"bench_kill: {missing}", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    results = []
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-kill-{os.getpid()}"
    scratch.mkdir(parents=True, exist_ok=True)
    for run in range(args.runs):
        result = one_run(pulse, scratch / f"run{run}.txt", rng.uniform(4.0, 20.0))
        results.append(result)
        print(json.dumps(result), flush=True)
    good = sum(1 for r in results if r.get("shown_are_saved") and r.get("every_line_whole"))
    print(f"{good} of {len(results)} runs: every line shown before the kill was on disk, every line whole")
    if args.json:
        args.json.write_text(json.dumps({"runs": results}, indent=1) + "\n", encoding="utf-8")
    return 0 if good == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
