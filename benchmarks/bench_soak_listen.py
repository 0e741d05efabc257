"""Hours of `captioner listen` on real speech at its real pace: does its memory stay flat?

    python benchmarks/bench_soak_listen.py --hours 2 --sample-s 60 --json out.json [--speech-dir DIR]

Where bench_soak.py feeds the engine API as fast as it goes, this runs the whole command a user
runs: a private PulseAudio server (tests/pulse.py) with a null sink, `paplay` playing the English
recordings of the speech set (read and spontaneous) one after the other into it, in a loop, and
`captioner listen --input <its monitor>` captioning them in real time, its transcript on disk.
Every `--sample-s` it samples the resident memory of `listen` and of every process it started.
At the end it stops `listen` with Ctrl-C (SIGINT), as a user does, and reports the samples, the
committed lines, the exit status, and the spread of the memory after the warm-up (flat: every
sample within 5 % of their median).
"""

from __future__ import annotations

import argparse
import csv
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench_kill import _pulse_helper

ROOT = Path(__file__).resolve().parent.parent


def english_recordings(speech_dir: Path) -> list[Path]:
    with (speech_dir / "manifest.tsv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [speech_dir / row["wav"] for row in rows if row["language"] == "en"]


def play_in_a_loop(server, files: list[Path], stop: threading.Event) -> threading.Thread:
    """Plays ``files`` one after the other into the server's default sink until ``stop``."""

    def loop() -> None:
        while not stop.is_set():
            for path in files:
                player = server.play(path)
                while player.poll() is None and not stop.wait(0.2):
                    pass
                if player.poll() is None:
                    player.kill()
                if stop.wait(0.8):  # a pause between speakers, as between turns
                    return

    thread = threading.Thread(target=loop, name="soak-player", daemon=True)
    thread.start()
    return thread


def spread_of(values: list[float]) -> float | None:
    """Largest distance from the median, as a fraction of it (bench_soak.py's measure, over
    every value given rather than the second half)."""
    if not values:
        return None
    ordered = sorted(values)
    median = (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) / 2
    return round(max(abs(v - median) for v in values) / median, 4)


def tree_rss_mib(process) -> dict[str, float]:
    """Resident memory of ``process`` and of each process under it, MiB, by pid and name."""
    import psutil

    out = {}
    for p in [process, *process.children(recursive=True)]:
        try:
            out[f"{p.pid} {p.name()}"] = round(p.memory_info().rss / 2**20, 1)
        except psutil.NoSuchProcess:
            pass
    return out


def main() -> int:
    import psutil

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--sample-s", type=float, default=60.0, help="seconds between memory samples")
    parser.add_argument("--warm-up-s", type=float, default=600.0, help="left out of the spread")
    parser.add_argument("--speech-dir", type=Path, default=ROOT / "tests" / "data" / "speech")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.hours <= 0 or args.sample_s <= 0:
        print("bench_soak_listen: --hours and --sample-s must be positive", file=sys.stderr)
        return 2
    files = english_recordings(args.speech_dir)
    pulse = _pulse_helper()
    server = pulse.start_pulse_server()
    stop = threading.Event()
    workdir = Path(args.json.parent if args.json else ".").resolve()
    transcript = workdir / "soak-listen-transcript.txt"
    try:
        env = dict(server.env, CAPTIONER_DEVICE="cpu", PYTHONUNBUFFERED="1")
        with open(workdir / "soak-listen-stdout.txt", "w", encoding="utf-8") as out, \
                open(workdir / "soak-listen-stderr.txt", "w", encoding="utf-8") as err:
            listen = subprocess.Popen([sys.executable, "-m", "captioner", "listen", "--input", server.sink.device,
                                       "--transcript", str(transcript)],
                                      env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
            process = psutil.Process(listen.pid)
            play_in_a_loop(server, files, stop)
            started = time.monotonic()
            samples = []
            while time.monotonic() - started < args.hours * 3600 and listen.poll() is None:
                by_process = tree_rss_mib(process)
                samples.append({"wall_s": round(time.monotonic() - started), "rss_mib": by_process,
                                "total_rss_mib": round(sum(by_process.values()), 1)})
                print(json.dumps(samples[-1]), flush=True)
                time.sleep(args.sample_s)
            stop.set()
            crashed = listen.poll()
            listen.send_signal(signal.SIGINT)
            status = listen.wait(timeout=120)
    finally:
        stop.set()
        server.stop()
    lines = transcript.read_text(encoding="utf-8").splitlines()[1:] if transcript.exists() else []
    after = [s["total_rss_mib"] for s in samples if s["wall_s"] >= args.warm_up_s]
    result = {
        "command": " ".join(sys.argv), "hours": args.hours, "recordings": [p.name for p in files],
        "listen_exit_status": status, "ended_by_itself": crashed is not None,
        # a line is "[START --> END] LABEL: words"
        "transcript_lines": len(lines), "committed_words": sum(len(line.split()) - 4 for line in lines),
        "warm_up_s": args.warm_up_s, "rss_after_warm_up_min_mib": min(after, default=None),
        "rss_after_warm_up_max_mib": max(after, default=None),
        "rss_spread_after_warm_up": spread_of(after),
        "samples": samples,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
