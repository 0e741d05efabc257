"""How a model host batches network arrival: N streams of 100 ms chunks handed to a
:class:`~captioner.engine.host.HostCore` the way a server's worker hands them over,
on a simulated clock, and how many engine ticks and model steps (and rows per step) the same
audio makes. Side by side in one run: chunks on time, and chunks with a network's jitter (a few
ms late each, one in twenty 30-150 ms late, so that two of a stream's chunks come together),
each with the host's rule (a stream's chunks wait for the next step together, up to
``BACKLOG_STEP_S``) and the rule before (``BACKLOG_STEP_S = 0``: a stream's second chunk steps
the ones before it).

The recognizer is the tests' scripted listener (no model): a model step is charged
``--step-fixed-ms`` plus ``--step-row-ms`` a row on the clock while it runs, and each chunk
``--chunk-ms`` as the host takes it (the H200's tiny.en order of magnitude by default), so the
next chunks arrive meanwhile, as they do on a server. What is counted is the step structure
while the streams speak (their ends are counted apart), and each stream's update interval:
what made 453 served streams on an H200 take about 20 model steps a second of 25 rows, behind
which the engine fell (docs/serve.md).

    .venv/bin/python benchmarks/bench_host_arrival.py --streams 400 --seconds 8 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "engine"))

CHUNK = 1600  # 100 ms at 16 kHz: a served client's message
FRAME_S = 0.025  # a front-end's batch period: what arrived in it goes to the worker together


class SimTime:
    """``time`` for the host module, with a clock this benchmark moves."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def monotonic(self) -> float:
        return self.now_s

    def monotonic_ns(self) -> int:
        return int(self.now_s * 1e9)

    def __getattr__(self, name):
        return getattr(time, name)


def arrivals(streams: int, chunks: int, jitter: bool, rng) -> np.ndarray:
    """When each stream's chunk k reaches the host, seconds from the start: its nominal time
    (a random phase plus 100 ms a chunk) plus, with ``jitter``, a delay; never before the one
    before it."""
    phase = rng.uniform(0.0, 0.1, streams)
    nominal = phase[:, None] + 0.1 * np.arange(1, chunks + 1)[None, :]
    if not jitter:
        return nominal
    late = rng.exponential(0.008, (streams, chunks)) + \
        (rng.random((streams, chunks)) < 0.05) * rng.uniform(0.03, 0.15, (streams, chunks))
    return np.maximum.accumulate(nominal + late, axis=1)


RULES = {
    # name: the host's BACKLOG_STEP_S
    "step": 0.0,  # every repeated chunk steps the ones before it (the rule before 2026-12-04)
    "wait": None,  # the chunks wait for the next step, up to BACKLOG_STEP_S (the host's rule)
}


def run(streams: int, seconds: float, jitter: bool, rule: str, fixed_s: float, row_s: float, chunk_s: float) -> dict:
    from scripted import ScriptedRecognizer, phrase, render_speech

    import captioner.engine.host as host_module
    from captioner.engine.admission import AdmissionConfig
    from captioner.engine.core import EngineConfig
    from captioner.engine.host import HostCore, HostSpec
    from captioner.engine.messages import CloseStream, OpenStream
    from captioner.engine.scheduler import SchedulerConfig
    from captioner.events import FramedAudio
    from captioner.gpu.backend import cpu_backend

    rng = np.random.default_rng(1)
    scripts = {}
    for i in range(streams):
        first_s = rng.uniform(0.2, 2.5)
        scripts[f"s{i}"] = phrase("the birch canoe slid on the smooth planks", first_s) + \
            phrase("rice is often served in round bowls", first_s + rng.uniform(2.5, 4.0))
    audio = {label: render_speech(words, seconds, seed=i) for i, (label, words) in enumerate(scripts.items())}

    class Factory:
        def __call__(self):
            return cpu_backend(), ScriptedRecognizer(dict(scripts))

    clock = SimTime()
    saved = host_module.time, host_module.BACKLOG_STEP_S
    host_module.time = clock
    if RULES[rule] is not None:
        host_module.BACKLOG_STEP_S = RULES[rule]
    try:
        # A server at load: 1 s updates, no riders, no waiting for fuller steps (at a thousand
        # streams a closing segment is due at nearly every tick, so none waits).
        config = EngineConfig(scheduler=SchedulerConfig(base_interval_s=1.0, max_batch=256, merge_max_load=-1.0,
                                                        fill_wait_s=0.0),
                              admission=AdmissionConfig(time_budget="off"))
        core = HostCore(HostSpec("scripted", "cpu", recognizer_factory=Factory(), config=config))
        engine = core.live.engine
        rows: list[int] = []
        decoded_at: dict[str, list[float]] = {}  # stream -> clock times its rows were decoded
        decode = engine.recognizer.decode

        def charged_decode(requests, *a, **k):  # a model step's time passes on the clock while it runs
            rows.append(len(requests))
            clock.now_s += fixed_s + len(requests) * row_s
            for request in requests:
                decoded_at.setdefault(request.stream, []).append(clock.now_s)
            return decode(requests, *a, **k)

        engine.recognizer.decode = charged_decode
        accept = core._accept

        def charged_accept(*a):  # a chunk's reading, features and VAD take time too
            clock.now_s += chunk_s
            accept(*a)

        core._accept = charged_accept
        ticks = [0]
        tick = engine.tick
        engine.tick = lambda: (ticks.__setitem__(0, ticks[0] + 1), tick())[1]
        for label in scripts:
            core.apply(OpenStream(label))
        chunks = int(seconds * 16000) // CHUNK
        arrive = arrivals(streams, chunks, jitter, rng)
        sent = np.zeros(streams, dtype=int)
        start_s, frame_s = clock.now_s, 0.0
        taken_late_s: list[float] = []  # how long after its frame arrived each message was taken

        while (sent < chunks).any():
            clock.now_s = max(clock.now_s, start_s + frame_s + FRAME_S)
            # Every frame that has arrived by now, one message each (a stream at most once).
            while start_s + frame_s + FRAME_S <= clock.now_s + 1e-9:
                frame_s += FRAME_S
                ready = [i for i in range(streams) if sent[i] < chunks and arrive[i, sent[i]] <= frame_s]
                while ready:
                    labels = tuple(f"s{i}" for i in ready)
                    firsts = tuple(int(sent[i]) * CHUNK for i in ready)
                    pieces = [audio[label][first:first + CHUNK] for label, first in zip(labels, firsts)]
                    taken_late_s.append(clock.now_s - (start_s + frame_s))
                    core.apply(FramedAudio(labels, firsts, (clock.monotonic_ns(),) * len(ready),
                                tuple(p.shape[0] for p in pieces), np.concatenate(pieces)))
                    sent[ready] += 1
                    ready = [i for i in ready if sent[i] < chunks and arrive[i, sent[i]] <= frame_s]
            if core.step_due():
                core.step()
        streaming_ticks, streaming_rows = ticks[0], list(rows)  # the ends (every stream's last final) apart
        streaming_end_s = clock.now_s
        for label in scripts:
            core.apply(CloseStream(label))
        for _ in range(40):
            core.step()
        ending_s = clock.now_s - streaming_end_s  # the model's time for every stream's last update
    finally:
        host_module.time, host_module.BACKLOG_STEP_S = saved
    # A stream's update interval: the time between two of its rows while the streams spoke.
    intervals = [b - a for times in decoded_at.values() for a, b in zip(times, times[1:]) if b <= streaming_end_s]
    return {"streams": streams, "audio_s": seconds, "jitter": jitter, "rule": rule,
            "engine_ticks": streaming_ticks, "model_steps": len(streaming_rows), "rows": int(sum(streaming_rows)),
            "rows_per_step": round(float(np.mean(streaming_rows)), 1) if streaming_rows else 0.0,
            "interval_p50_s": round(float(np.percentile(intervals, 50)), 2) if intervals else None,
            "interval_p99_s": round(float(np.percentile(intervals, 99)), 2) if intervals else None,
            "taken_late_max_s": round(max(taken_late_s, default=0.0), 2),
            "ending_model_steps": len(rows) - len(streaming_rows),
            "ending_s": round(ending_s, 2),
            "clock_s": round(clock.now_s - start_s, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=8.0, help="audio per stream")
    parser.add_argument("--step-fixed-ms", type=float, default=15.0, help="a model step's fixed time")
    parser.add_argument("--step-row-ms", type=float, default=0.6, help="...and its time per row")
    parser.add_argument("--chunk-ms", type=float, default=0.08, help="a chunk's time in the host (reading, features, VAD)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if not 1 <= args.streams <= 2000 or not 1.0 <= args.seconds <= 60.0:
        parser.error("--streams must be 1..2000 and --seconds 1..60")
    runs = [run(args.streams, args.seconds, jitter, rule, args.step_fixed_ms / 1000, args.step_row_ms / 1000,
                args.chunk_ms / 1000)
            for jitter in (False, True) for rule in RULES]
    print("| arrival | rule | engine ticks | model steps | rows per step | interval p50 / p99 s | taken late (max) s "
          "| the ends: model steps / s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in runs:
        print(f"| {'jitter' if r['jitter'] else 'on time'} | {r['rule']} | {r['engine_ticks']} | "
              f"{r['model_steps']} | {r['rows_per_step']} | {r['interval_p50_s']} / {r['interval_p99_s']} | "
              f"{r['taken_late_max_s']} | {r['ending_model_steps']} / {r['ending_s']} |")
    jittered = {r["rule"]: r for r in runs if r["jitter"]}
    ratio = jittered["step"]["model_steps"] / max(1, jittered["wait"]["model_steps"])
    print(f"with jitter, model steps of the rule before / the host's rule: {ratio:.2f}x")
    result = {"date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "runs": runs,
              "jitter_steps_ratio_before_over_now": round(ratio, 2),
              "cost": {"step_fixed_ms": args.step_fixed_ms, "step_row_ms": args.step_row_ms,
                       "chunk_ms": args.chunk_ms}}
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
