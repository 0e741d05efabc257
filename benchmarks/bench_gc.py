"""What a model process holds for the cyclic garbage collector while it captions many streams, and
how long a full collection of it takes, with and without the start-up objects frozen.

One :class:`~captioner.engine.host.HostCore` (what a GPU model process runs) with the
server's engine config, ``--streams`` streams of real English speech (the recordings looped),
each fed 100 ms a step as fast as the engine steps, ``--audio-s`` of audio each. Every 10 s of
audio it reports the container objects the collector tracks, the time of one full collection
(``gc.collect()``), and the types that grew most since start-up. Each variant (``--freeze off,on``)
runs in a process of its own, one after the other, and the two are printed side by side.

Every full collection stops every thread of the process for its length; serving 1,000
connections on an H200 the model processes ran one every 8-10 s, of 45-111 ms
(benchmarks/results/serve/HISTORY.md, "Pauses of the garbage collector").

    python benchmarks/bench_gc.py --device cpu --streams 8 --audio-s 30          # here
    python benchmarks/bench_gc.py --device cuda:0 --streams 333 --audio-s 40 --json gc.json
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_serve import english_clips, pcm16k  # noqa: E402
from wer import DEFAULT_SPEECH  # noqa: E402

STEP_SAMPLES = 1600  # 100 ms at 16 kHz: a served client's message
REPORT_EVERY_STEPS = 100


def full_collection_ms() -> float:
    started = time.perf_counter()
    gc.collect()
    return round((time.perf_counter() - started) * 1e3, 2)


def census() -> collections.Counter:
    return collections.Counter(type(o).__name__ for o in gc.get_objects())


def one_variant(streams: int, audio_s: float, freeze: bool, device: str, speech: Path) -> dict:
    """This process: load, (freeze), caption; what the collector holds every 10 s of audio."""
    from captioner.engine.host import HostCore, HostSpec
    from captioner.engine.messages import OpenStream, Updates
    from captioner.events import FramedAudio
    from captioner.serve.engine_link import server_engine_config

    n_samples = int(audio_s * 16000)
    clips = [pcm16k(c.wav).astype(np.float32) / 32768.0 for c in english_clips(speech)]
    audio = [np.tile(pcm, n_samples // len(pcm) + 1)[:n_samples] for pcm in clips]
    config = server_engine_config()
    config.admission.time_budget = "off"  # every stream is let in: the heap is what is measured
    started = time.perf_counter()
    core = HostCore(HostSpec("tiny.en", device, config=config))
    out = {"freeze": freeze, "load_s": round(time.perf_counter() - started, 1),
           "after_load": {"tracked": len(gc.get_objects()), "full_collection_ms": full_collection_ms()}}
    if freeze:  # imported here: "--freeze off" also runs on code from before captioner.heap (5a76d10)
        from captioner.heap import freeze_start_up

        out["frozen"] = freeze_start_up()
    base = census()
    labels = [f"s{k}" for k in range(streams)]
    for label in labels:
        core.apply(OpenStream(label))
    out["every_10_s"] = []
    updates = 0
    for step, first in enumerate(range(0, n_samples, STEP_SAMPLES)):
        for k, label in enumerate(labels):
            piece = audio[k % len(audio)][first:first + STEP_SAMPLES]
            core.apply(FramedAudio((label,), (first,), (time.monotonic_ns(),), (piece.shape[0],), piece))
        updates += sum(len(m.updates) for m in core.step() if type(m) is Updates)
        if step % REPORT_EVERY_STEPS == REPORT_EVERY_STEPS - 1:
            now = census()
            out["every_10_s"].append({"audio_s": round((first + STEP_SAMPLES) / 16000, 1), "updates": updates,
                                      "tracked": sum(now.values()), "full_collection_ms": full_collection_ms(),
                                      "grew_most": (now - base).most_common(6)})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N (default cpu)")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--audio-s", type=float, default=30.0)
    parser.add_argument("--freeze", default="off,on", help="the variants, in order (default off,on)")
    parser.add_argument("--speech", type=Path, default=DEFAULT_SPEECH)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--variant", choices=("off", "on"), help=argparse.SUPPRESS)  # the child's
    args = parser.parse_args(argv)
    if not 1 <= args.streams <= 2048 or not 10 <= args.audio_s <= 600:
        print("bench_gc: --streams must be 1-2048 and --audio-s 10-600", file=sys.stderr)
        return 2
    if args.variant is not None:
        from captioner.errors import UserError

        try:
            print(json.dumps(one_variant(args.streams, args.audio_s, args.variant == "on", args.device, args.speech)))
        except UserError as error:  # no such device, no recordings: the parent says so in one line
            print(error, file=sys.stderr)
            return 2
        return 0
    variants = [v.strip() for v in args.freeze.split(",")]
    if any(v not in ("off", "on") for v in variants):
        print(f"bench_gc: --freeze takes off and on, not {args.freeze!r}", file=sys.stderr)
        return 2
    runs = []
    for variant in variants:
        child = subprocess.run([sys.executable, __file__, "--variant", variant, "--device", args.device,
                                "--streams", str(args.streams), "--audio-s", str(args.audio_s),
                                "--speech", str(args.speech)], capture_output=True, text=True)
        if child.returncode != 0:
            why = (child.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"bench_gc: the freeze-{variant} run failed: {why}", file=sys.stderr)
            return 1
        runs.append(json.loads(child.stdout.strip().splitlines()[-1]))
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "device": args.device,
              "streams": args.streams, "audio_s": args.audio_s, "runs": runs}
    for run in runs:
        print(f"freeze {'on ' if run['freeze'] else 'off'}: after load {run['after_load']['tracked']} tracked, "
              f"full {run['after_load']['full_collection_ms']} ms" + (f", {run['frozen']} frozen" if run["freeze"] else ""))
        for row in run["every_10_s"]:
            print(f"  {row['audio_s']:6.1f} s: tracked {row['tracked']:7d}, full collection {row['full_collection_ms']:6.2f} ms, "
                  f"grew most {row['grew_most'][:3]}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
