"""One greedy decoder step's rules on the device, the CuPy array code vs the rules kernel, side by side.

What is timed is ``DeviceRules.choose_and_advance``, the per-step call of greedy decoding
(models/decoding.py): Whisper's token rules, argmax, the chosen tokens' log-probabilities, the
rows' state update and the one copy of [2, B] results to the host. ``choose`` alone (everything on
the device, no copy, no state update) is timed too. Inputs are real-shaped: [B, n_vocab] float32
logits of the model's vocabulary (51,864 for tiny.en) drawn so that every rule is met (timestamp-
heavy rows, a text token or a timestamp far ahead, the end token), and row states of every kind
(first token, after text, after a lone timestamp, after a pair). Before each timed step the
logits and states are restored and the device synchronised, so each step starts alone.

Per batch size and path: host milliseconds per step (the engine thread's wall time, which is
the bound: Python and launches) and, on CUDA, GPU milliseconds between two events around the
call. Both paths must choose the same tokens; the JSON says whether they did and how far the
log-probabilities are apart.

Run (here, NumPy only):  .venv/bin/python benchmarks/bench_device_rules.py --device cpu --batches 4,16 --steps 5
Run (H200):  PYTHONPATH=src:/tmp/site:/tmp/stage/ortsite:/tmp/stage python3 benchmarks/bench_device_rules.py \\
                 --device cuda:0 --batches 16,64,256 --steps 300 --out $OUT/2026-12-01-h200-device-rules.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

MODES = ("step", "choose")
"""``step``: ``choose_and_advance`` (with the host copy), ``choose``: the device part alone."""


def make_inputs(tokenizer, n_vocab: int, batch: int, seed: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Host logits [B, V] float32 and row states (the arrays of ``RowState``) that meet every rule."""
    rng = np.random.default_rng(seed)
    special = tokenizer.special
    ts, eot = special.timestamp_begin, special.eot
    logits = rng.normal(0.0, 3.0, (batch, n_vocab)).astype(np.float32)
    n = rng.integers(1, 120, batch)
    last = rng.integers(0, eot, batch)
    before_last = rng.integers(0, eot, batch)
    last_timestamp = np.where(rng.random(batch) < 0.8, rng.integers(ts, ts + 500, batch), -1)
    for b in range(batch):
        kind = b % 6
        if kind == 0:
            n[b], last[b], before_last[b], last_timestamp[b] = 0, -1, -1, -1  # the first token
        elif kind == 1:  # after a lone timestamp
            last[b] = last_timestamp[b] = ts + rng.integers(0, 500)
        elif kind == 2:  # after a pair
            last[b] = before_last[b] = last_timestamp[b] = ts + rng.integers(0, 500)
        if b % 4 == 0:
            logits[b, ts:] += np.float32(rng.uniform(2.0, 6.0))  # timestamps likely
        elif b % 4 == 1:
            logits[b, rng.integers(0, eot)] += 15.0  # a clear text token
        elif b % 4 == 2:
            logits[b, ts + rng.integers(0, 1500)] += 15.0
        elif rng.random() < 0.2:
            logits[b, eot] += 15.0
    state = {"n": n.astype(np.int64), "last": last.astype(np.int64), "before_last": before_last.astype(np.int64),
             "last_timestamp": last_timestamp.astype(np.int64), "active": np.ones(batch, dtype=bool)}
    return logits, state


def time_path(rules, backend, logits_host, state_host, mode: str, steps: int, warmup: int) -> dict:
    """Median / p90 host ms and median GPU ms (CUDA events; ``None`` on the CPU) per step, and
    the first step's outputs (tokens, log-probabilities) to compare the paths."""
    xp = backend.xp
    pristine = xp.asarray(logits_host)
    work = xp.empty_like(pristine)
    last_step = np.zeros(len(logits_host), dtype=bool)
    host_ms, gpu_ms = [], []
    first = None
    for i in range(warmup + steps):
        work[...] = pristine
        state = rules.new_state(len(logits_host))
        for name, values in state_host.items():
            setattr(state, name, xp.asarray(values))
        backend.synchronize()
        events = (xp.cuda.Event(), xp.cuda.Event()) if backend.is_cuda else None
        started = time.perf_counter()
        if events:
            events[0].record()
        if mode == "step":
            out = rules.choose_and_advance(work, state, last_step)
            result = (out[0].astype(np.int64), out[1].astype(np.float32))
        else:
            tokens, logprobs = rules.choose(work, state)
            backend.synchronize()
            result = (tokens, logprobs)
        if events:
            events[1].record()
            events[1].synchronize()
        elapsed_ms = (time.perf_counter() - started) * 1e3
        if first is None:
            first = (backend.asnumpy(result[0]).astype(np.int64), backend.asnumpy(result[1]).astype(np.float32))
        if i >= warmup:
            host_ms.append(elapsed_ms)
            if events:
                gpu_ms.append(float(xp.cuda.get_elapsed_time(events[0], events[1])))
    return {
        "host_ms_median": round(float(np.median(host_ms)), 4),
        "host_ms_p90": round(float(np.percentile(host_ms, 90)), 4),
        "gpu_ms_median": round(float(np.median(gpu_ms)), 4) if gpu_ms else None,
        "first": first,
    }


def run(args) -> dict:
    from captioner.gpu.backend import get_backend
    from captioner.models.decoding import DecodingOptions
    from captioner.models.device_rules import DeviceRules
    from captioner.models.registry import resolve_model
    from captioner.models.tokenizer import WhisperTokenizer

    backend = get_backend(args.device)
    backend.use()
    files = resolve_model(args.model)
    n_vocab = files.dims.n_vocab
    tokenizer = WhisperTokenizer(files.tokenizer_path, files.config_path, n_vocab=n_vocab)
    options = DecodingOptions(temperatures=(0.0,))
    paths = {"array": DeviceRules(backend.xp, tokenizer, options, n_vocab, kernel=False)}
    if backend.is_cuda:
        paths["kernel"] = DeviceRules(backend.xp, tokenizer, options, n_vocab, kernel=True)
    steps = args.steps if args.steps is not None else (300 if backend.is_cuda else 5)
    rows = []
    with np.errstate(divide="ignore", invalid="ignore"):
        for batch in args.batches:
            logits, state = make_inputs(tokenizer, n_vocab, batch, seed=batch)
            for mode in MODES:
                measured = {name: time_path(rules, backend, logits, state, mode, steps, args.warmup)
                            for name, rules in paths.items()}
                base_tokens, base_logprobs = measured["array"]["first"]
                for name, m in measured.items():
                    tokens, logprobs = m.pop("first")
                    row = {"batch": batch, "mode": mode, "path": name, "steps": steps, **m,
                           "same_tokens": bool(np.array_equal(tokens, base_tokens)),
                           "max_logprob_diff": float(np.nanmax(np.abs(logprobs - base_logprobs), initial=0.0))}
                    if name != "array":
                        row["host_speedup"] = round(measured["array"]["host_ms_median"] / m["host_ms_median"], 2)
                    rows.append(row)
                    gpu = "" if m["gpu_ms_median"] is None else f"  gpu {m['gpu_ms_median']:8.3f} ms"
                    print(f"B={batch:4d} {mode:6s} {name:6s}  host {m['host_ms_median']:8.3f} ms (p90 "
                          f"{m['host_ms_p90']:8.3f}){gpu}  same tokens: {row['same_tokens']}", flush=True)
    return {
        "benchmark": "bench_device_rules",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": backend.name,
        "device_name": backend.device_name,
        "host": platform.node(),
        "model": args.model,
        "n_vocab": n_vocab,
        "warmup": args.warmup,
        "results": rows,
        "all_same_tokens": all(r["same_tokens"] for r in rows),
    }


def _batches(text: str) -> list[int]:
    try:
        batches = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise ValueError(f"--batches needs comma-separated positive integers, not {text!r}") from None
    if not batches or min(batches) < 1:
        raise ValueError(f"--batches needs comma-separated positive integers, not {text!r}")
    return batches


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: the best available)")
    ap.add_argument("--model", default="tiny.en", help="whose vocabulary and rules (default tiny.en)")
    ap.add_argument("--batches", default="16,64,256", help="comma-separated batch sizes (rows per step)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per batch, mode and path (default 300 on CUDA, 5 on the CPU)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (compiling, memory pools)")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    from captioner.errors import UserError

    try:
        args.batches = _batches(args.batches)
        if args.steps is not None and args.steps < 1:
            raise ValueError("--steps must be at least 1")
        if args.warmup < 0:
            raise ValueError("--warmup must not be negative")
        result = run(args)
    except (UserError, ValueError, OSError, RuntimeError) as e:
        print(f"bench_device_rules: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.out}")
    return 0 if result["all_same_tokens"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
