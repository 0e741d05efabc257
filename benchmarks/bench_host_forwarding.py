"""What the model's process costs on the way in: N streams of 100 ms chunks (a served client's
message size) handed to a :class:`~captioner.engine.supervisor.SupervisedCaptioner` at real-time
pace, its model inline (on this thread) and in a child process side by side in one run; the
CPU seconds of this process and of the child for the same audio.

Quiet audio (the VAD keeps the model idle): what is left is the way in (framing, the ring kept
for a restart, the messages to the child) and each stream's features and VAD, which is what a
thousand served streams pay before any model step.

    .venv/bin/python benchmarks/bench_host_forwarding.py --streams 300 --seconds 10 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as `captioner serve` sets it (before NumPy loads)

import numpy as np  # noqa: E402

CHUNK_S = 0.1
STEP_EVERY = 200  # chunks between the worker's steps, as Worker.MAX_ITEMS_PER_STEP


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(isolation: str, streams: int, seconds: float) -> dict:
    from captioner.engine.host import HostSpec
    from captioner.engine.supervisor import SupervisedCaptioner
    from captioner.serve.engine_link import server_engine_config

    config = server_engine_config()
    config.warm_up = False
    config.admission.time_budget = "off"
    supervisor = SupervisedCaptioner(HostSpec("tiny.en", "cpu", config=config), isolation=isolation, standby=False)
    opened = [supervisor.open_stream(f"s{i}") for i in range(streams)]
    chunk = (np.random.default_rng(0).standard_normal(int(16000 * CHUNK_S)) * 1e-4).astype(np.float32)
    children = [pid for pid in supervisor.host_pids if pid != os.getpid()]
    child0 = {pid: _cpu_s(pid) for pid in children}
    own0, t0 = time.process_time(), time.perf_counter()
    given = 0
    for r in range(int(seconds / CHUNK_S)):
        while time.perf_counter() < t0 + r * CHUNK_S:  # real-time pace; the worker steps meanwhile
            supervisor.step()
            time.sleep(0.001)
        for stream in opened:
            stream.accept_waveform(16000, chunk, capture_ns=time.monotonic_ns())
            given += 1
            if given % STEP_EVERY == 0:
                supervisor.step()
    for stream in opened:
        stream.finish()
    while supervisor.streams:
        supervisor.step()
        time.sleep(0.002)
    wall_s = time.perf_counter() - t0
    own_s = time.process_time() - own0
    child_s = sum(_cpu_s(pid) - child0[pid] for pid in children)
    supervisor.close()
    audio_s = streams * seconds
    return {"isolation": isolation, "wall_s": round(wall_s, 2), "worker_process_cpu_s": round(own_s, 2),
            "child_cpu_s": round(child_s, 2), "ms_per_stream_audio_s": round(1000 * (own_s + child_s) / audio_s, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    runs = [run(isolation, args.streams, args.seconds) for isolation in ("inline", "process")]
    result = {"date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "streams": args.streams,
              "seconds": args.seconds, "chunk_s": CHUNK_S, "runs": runs,
              "process_over_inline": round(runs[1]["ms_per_stream_audio_s"] / runs[0]["ms_per_stream_audio_s"], 3)}
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
