"""The engine's host path per stream at real-time pace: N streams of real speech, each handed
100 ms (one block) per round through the public API, with no model (``bench_capacity.NoModel``:
every update comes back empty at once), so what is measured is the one Python thread's own
work per stream: ingest (``accept_waveform``), feature pushes, the VAD, scheduling, and the
rest of ``LiveCaptioner.step`` (windows, policy, bookkeeping).

Times are the thread's CPU time (``time.thread_time``), so another process on the machine does
not inflate them; NumPy's BLAS helper threads (the CPU log-mel's matrix product) are not in
it. ``bench_capacity.py --engine-only`` measures the same path with whole programmes on a
simulated clock; this one is the steady state a live deployment sees, one block per stream per
100 ms, and runs in seconds.

Run: .venv/bin/python benchmarks/bench_host_path.py --streams 256,1024 [--device cuda:0] [--out F.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

SR = 16_000
BLOCK = SR // 10


def speech() -> np.ndarray:
    """The speech set's English recordings, joined (each stream reads from its own offset)."""
    import soundfile as sf

    from word_times import load_manifest

    parts = []
    for clip in load_manifest():
        if clip["language"] == "en":
            audio, rate = sf.read(clip["path"], dtype="float32")
            if rate == SR and audio.ndim == 1:
                parts.append(audio)
    if not parts:
        raise ValueError("no 16 kHz English recordings in the speech set")
    return np.concatenate(parts)


def run(n: int, device: str, audio: np.ndarray, warm_s: float, measure_s: float) -> dict:
    from bench_capacity import NoModel
    from captioner.engine.live import LiveCaptioner
    from captioner.engine.simulate import SimClock
    from captioner.gpu.backend import get_backend

    backend = get_backend(device)
    backend.use()
    clock = SimClock()
    live = LiveCaptioner(recognizer=NoModel(), backend=backend, clock_ns=clock, timer_ns=time.perf_counter_ns)
    engine = live.engine
    if hasattr(engine, "host_timer"):
        engine.host_timer = time.thread_time
    streams = [live.open_stream(f"s{i}", language="en") for i in range(n)]
    rounds_warm, rounds = int(round(warm_s * 10)), int(round(measure_s * 10))
    need = (rounds_warm + rounds) * BLOCK
    offsets = (np.arange(n) * 7919 * BLOCK) % max(1, audio.shape[0] - need)
    total_s = 0.0
    host_before = None
    updates = 0
    for r in range(rounds_warm + rounds):
        if r == rounds_warm:
            host_before = dict(engine.host_s)
            total_s = 0.0
        c0 = time.thread_time()
        for i, s in enumerate(streams):
            a = int(offsets[i]) + r * BLOCK
            s.accept_waveform(SR, audio[a:a + BLOCK], capture_ns=clock())
        updates += len(live.step())
        if hasattr(backend, "synchronize") and backend.is_cuda:
            backend.synchronize()
        c2 = time.thread_time()
        total_s += c2 - c0
        clock.advance(0.1)
    stream_s = n * rounds / 10
    parts = {k: v - host_before[k] for k, v in engine.host_s.items()}  # ingest (the streams' own), features, ...
    parts["rest"] = total_s - sum(parts.values())
    live.close()
    per = lambda x: round(1e3 * x / stream_s, 4)  # noqa: E731
    return {"streams": n, "seconds": measure_s, "host_cpu_ms_per_stream_s": per(total_s),
            "breakdown_cpu_ms_per_stream_s": {k: per(v) for k, v in parts.items()},
            "host_cpu_ms_per_stream_s_without_features": per(total_s - parts.get("features", 0.0)),
            "streams_one_thread_holds": int(1e3 / max(1e-9, 1e3 * total_s / stream_s)),
            "feature_path": engine.features.path}


def main() -> int:
    parser = argparse.ArgumentParser(description="the engine's host CPU time per stream at real-time pace")
    parser.add_argument("--streams", default="256,1024", help="comma separated numbers of streams")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--warm-s", type=float, default=2.0, help="audio per stream before measuring")
    parser.add_argument("--seconds", type=float, default=6.0, help="audio per stream measured")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    try:
        counts = [int(x) for x in args.streams.split(",") if x.strip()]
        if not counts or min(counts) < 1 or args.seconds <= 0 or args.warm_s < 0:
            raise ValueError("--streams takes positive integers; --seconds must be positive")
        audio = speech()
    except (ValueError, OSError) as error:
        print(f"bench_host_path: {error}", file=sys.stderr)
        return 2
    report = {"date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
              "machine": platform.processor() or platform.machine(), "command": " ".join(sys.argv),
              "load_average": os.getloadavg(), "source": str(HERE.parent), "runs": []}
    for n in counts:
        result = run(n, args.device, audio, args.warm_s, args.seconds)
        report["runs"].append(result)
        print(json.dumps(result), file=sys.stderr)
    print("| streams | host CPU ms per stream-s | without features | ingest | features | VAD | schedule | rest |")
    print("|---|---|---|---|---|---|---|---|")
    for r in report["runs"]:
        b = r["breakdown_cpu_ms_per_stream_s"]
        print(f"| {r['streams']} | {r['host_cpu_ms_per_stream_s']} | {r['host_cpu_ms_per_stream_s_without_features']} | "
              f"{b['ingest']} | {b.get('features', '–')} | {b.get('vad', '–')} | {b.get('schedule', '–')} | {b['rest']} |")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
