"""What the first run of each batch shape costs, beside the same shape warm: the cost
``WhisperRecognizer.warm_up`` moves from a server's first minutes of service to its start.

For each batch size B (in the order given, three repetitions each): the encoder on B windows,
``start`` (cross K/V and the prompt prefill of ragged prompts, 11-50 tokens) and 20 decoder
steps, each timed with the device synchronised before and after. Repetition 0 is the first time
this process meets the shape (a new bucket's buffers, a CUDA graph captured, a prefill width,
ONNX Runtime's arena growing); repetitions 1 and 2 are warm. The decoder steps are reported as
the first step and the median of steps 3-20.

Run (H200): PYTHONPATH=src:/tmp/site:/tmp/stage/ortsite:/tmp/stage python3 benchmarks/bench_first_runs.py \\
                --device cuda:0 --batches 1,64,128,256,37,101,200 --out $OUT/graph-first-runs-h200.json
Run (here, CPU: shapes cost little to meet there): .venv/bin/python benchmarks/bench_first_runs.py --device cpu --batches 1,2
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

STEPS = 20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--device", default="cuda:0", help="cpu or cuda:N")
    parser.add_argument("--batches", default="1,64,128,256,37,101,200", help="batch sizes, in the order met")
    parser.add_argument("--out", default=None, help="JSON results here")
    args = parser.parse_args()
    try:
        batches = [int(b) for b in args.batches.split(",") if b.strip()]
        if not batches or min(batches) < 1:
            raise ValueError
    except ValueError:
        print(f"bench_first_runs: --batches takes positive batch sizes, got {args.batches!r}", file=sys.stderr)
        return 2
    from captioner.engine.live import load_recognizer
    from captioner.errors import UserError

    try:
        backend, recognizer = load_recognizer(args.model, args.device)
    except UserError as error:
        print(f"bench_first_runs: {error}", file=sys.stderr)
        return 2
    xp, runtime, special = backend.xp, recognizer.runtime, recognizer.tokenizer.special
    sync = backend.synchronize if backend.is_cuda else (lambda: None)
    ragged = bool(getattr(runtime, "ragged_prompts", False))
    rng = np.random.default_rng(0)
    mel = xp.asarray(rng.standard_normal((max(batches), runtime.n_mels, 3000), dtype=np.float32) * 0.3 - 0.3)

    def timed(fn, *fn_args, **kwargs):
        sync()
        t0 = time.perf_counter()
        result = fn(*fn_args, **kwargs)
        sync()
        return result, 1e3 * (time.perf_counter() - t0)

    rows = []
    for batch in batches:
        for rep in range(3):
            enc, encode_ms = timed(runtime.encode, mel[:batch])
            # Ragged prompt lengths where the decoder takes them (CUDA's fixed cache), else one length.
            lengths = [10 + ((b * 7 + rep) % 40 if ragged else rep) for b in range(batch)]
            prompts = [[special.sot_prev, *range(300, 300 + n), special.sot] for n in lengths]
            (_, state), start_ms = timed(runtime.start, enc, prompts, xp=xp)
            feed = np.full(batch, 400, np.int64)
            steps = [timed(runtime.step, state, feed, xp=xp)[1] for _ in range(STEPS)]
            row = {"batch": batch, "rep": rep, "encode_ms": round(encode_ms, 2), "start_ms": round(start_ms, 2),
                   "step_first_ms": round(steps[0], 2), "step_p50_ms": round(float(np.median(steps[2:])), 3)}
            print(json.dumps(row), file=sys.stderr)
            rows.append(row)
            del state
    report = {"date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "model": args.model,
              "device": args.device, "device_name": recognizer.device_name, "provider": recognizer.provider,
              "command": " ".join(sys.argv), "rows": rows}
    print("| B | encode first / warm ms | start first / warm ms | step first / warm ms |\n|---|---|---|---|")
    for batch in dict.fromkeys(batches):
        first, warm = [r for r in rows if r["batch"] == batch][0], [r for r in rows if r["batch"] == batch][-1]
        print(f"| {batch} | {first['encode_ms']} / {warm['encode_ms']} | {first['start_ms']} / {warm['start_ms']} | "
              f"{first['step_first_ms']} / {warm['step_p50_ms']} |")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
