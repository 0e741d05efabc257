"""What the first run of each batch shape costs, beside the same shape warm: the cost
``WhisperRecognizer.warm_up`` moves from a server's first minutes of service to its start.

For each batch size B (in the order given, three repetitions each): the encoder on B windows,
``start`` (cross K/V and the prompt prefill of ragged prompts, 11-50 tokens) and 20 decoder
steps, each timed with the device synchronised before and after. Repetition 0 is the first time
this process meets the shape (a new bucket's buffers, a CUDA graph captured, a prefill width,
ONNX Runtime's arena growing); repetitions 1 and 2 are warm. The decoder steps are reported as
the first step and the median of steps 3-20.

Run (H200): PYTHONPATH=src:/tmp/site:/tmp/stage/ortsite:/tmp/stage python3 benchmarks/bench_first_runs.py \\
                --device cuda:0 --batches 1,64,128,256,37,101,200 --out $OUT/2026-12-01-h200-graph-first-runs.json
Run (here, CPU: shapes cost little to meet there): .venv/bin/python benchmarks/bench_first_runs.py --device cpu --batches 1,2

``--prompt-tokens 48,128,224`` repeats every batch size at each longest prompt length (rows
ragged over the 24 tokens below it; the engine's prompts carry up to 223 tokens of earlier text
and the forced prefix), and reports the prefill's and the cross K/V's own run times
(``WhisperRuntime.graph_runs``) beside ``start``'s.
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


def change_session_options(change) -> None:
    """Sessions opened from now on get ``change(options)`` applied to their ONNX Runtime session
    options: benchmark experiments wrap the package's options here rather than change them."""
    from captioner.models import session

    options = session._session_options

    def changed(*args, **kwargs):
        so = options(*args, **kwargs)
        change(so)
        return so
    session._session_options = changed


def set_mem_pattern(setting: str) -> None:
    """``--mem-pattern on|off``: whether ONNX Runtime sessions opened from now on plan each input
    shape's memory as one pattern (its default, on) — an experiment on the prefill's second run
    of each shape."""
    if setting not in ("on", "off"):
        raise ValueError(f"--mem-pattern takes on or off, got {setting!r}")
    if setting == "off":
        change_session_options(lambda so: setattr(so, "enable_mem_pattern", False))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--device", default="cuda:0", help="cpu or cuda:N")
    parser.add_argument("--batches", default="1,64,128,256,37,101,200", help="batch sizes, in the order met")
    parser.add_argument("--prompt-tokens", default="50",
                        help="longest prompt lengths in tokens, comma separated (rows ragged below each)")
    parser.add_argument("--reps", type=int, default=3, help="runs of each shape (the first is its first run)")
    parser.add_argument("--spread", type=int, default=24,
                        help="rows' prompt lengths spread over this many tokens below the longest (the engine's: "
                             "from 3 tokens, no earlier text, up to the longest)")
    parser.add_argument("--hold", type=int, default=0,
                        help="keep the last N decoder states alive, as the engine's hypotheses do (new starts "
                             "then take the bucket's other slots)")
    parser.add_argument("--mem-pattern", default="on", help="on|off: ONNX Runtime's memory patterns (set_mem_pattern)")
    parser.add_argument("--out", default=None, help="JSON results here")
    args = parser.parse_args()
    try:
        batches = [int(b) for b in args.batches.split(",") if b.strip()]
        longest = [int(n) for n in args.prompt_tokens.split(",") if n.strip()]
        if not batches or min(batches) < 1 or not longest or min(longest) < 1 or args.reps < 1 \
                or args.spread < 0 or args.hold < 0:
            raise ValueError
    except ValueError:
        print(f"bench_first_runs: --batches, --prompt-tokens and --reps take positive integers, --spread and --hold "
              f"non-negative ones (got {args.batches!r}, {args.prompt_tokens!r}, {args.reps}, {args.spread}, {args.hold})",
              file=sys.stderr)
        return 2
    from captioner.engine.live import load_recognizer
    from captioner.errors import UserError

    try:
        set_mem_pattern(args.mem_pattern)
        backend, recognizer = load_recognizer(args.model, args.device)
    except (UserError, ValueError) as error:
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

    def own_ms(before: dict, after: dict, graph: str) -> float | None:
        runs = after.get(graph, (0, 0.0))[0] - before.get(graph, (0, 0.0))[0]
        seconds = after.get(graph, (0, 0.0))[1] - before.get(graph, (0, 0.0))[1]
        return round(1e3 * seconds / runs, 2) if runs else None

    rows = []
    held: list = []
    for longest_tokens in longest:
        for batch in batches:
            for rep in range(args.reps):
                enc, encode_ms = timed(runtime.encode, mel[:batch])
                # Ragged prompt lengths where the decoder takes them (CUDA's fixed cache), else one length.
                spread = min(args.spread, longest_tokens - 1) if ragged else 0
                lengths = [longest_tokens - ((b * 7 + rep) % (spread + 1)) for b in range(batch)]
                prompts = [[special.sot_prev, *range(300, 300 + n - 2), special.sot] for n in lengths]
                before = runtime.graph_runs()
                (_, state), start_ms = timed(runtime.start, enc, prompts, xp=xp)
                after = runtime.graph_runs()
                feed = np.full(batch, 400, np.int64)
                steps = [timed(runtime.step, state, feed, xp=xp)[1] for _ in range(STEPS)]
                row = {"batch": batch, "prompt_tokens": longest_tokens, "rep": rep, "encode_ms": round(encode_ms, 2),
                       "start_ms": round(start_ms, 2), "cross_kv_ms": own_ms(before, after, "cross_kv"),
                       "prefill_ms": own_ms(before, after, "decoder_prefill"),
                       "step_first_ms": round(steps[0], 2), "step_p50_ms": round(float(np.median(steps[2:])), 3)}
                print(json.dumps(row), file=sys.stderr)
                rows.append(row)
                held.append(state)  # the engine's states outlive the next start: it takes other slots
                del state
                if len(held) > args.hold:
                    del held[:len(held) - args.hold]
    report = {"date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "model": args.model,
              "device": args.device, "device_name": recognizer.device_name, "provider": recognizer.provider,
              "command": " ".join(sys.argv), "mem_pattern": args.mem_pattern, "rows": rows}
    print("| B | prompt tokens | encode first / warm ms | start first / warm ms | prefill warm ms | step first / warm ms |\n"
          "|---|---|---|---|---|---|")
    for shape in dict.fromkeys((r["batch"], r["prompt_tokens"]) for r in rows):
        mine = [r for r in rows if (r["batch"], r["prompt_tokens"]) == shape]
        first, warm = mine[0], mine[-1]
        print(f"| {shape[0]} | {shape[1]} | {first['encode_ms']} / {warm['encode_ms']} | {first['start_ms']} / "
              f"{warm['start_ms']} | {warm['prefill_ms']} | {first['step_first_ms']} / {warm['step_p50_ms']} |")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
