"""A fault in the model's worker during live captioning: how long until captions come again, and
how many captions are lost or shown twice?

    python benchmarks/bench_hot_restart.py [--device cpu|cuda:0] [--isolation auto|inline|process]
                                           [--runs 3] [--json out.json]

Four English recordings with 1.5 s pauses between them (about 28 s) are replayed at real-time
pace through the pipeline (``Pipeline``, tiny.en), once without a fault and then ``--runs``
times with ``CAPTIONER_FAULT_INJECT=step:N`` (N = 6, 10, 14, ...: the N-th model step fails;
on CUDA an illegal-address kernel poisons the worker process's context, on the CPU the step
raises). For each faulted run:

- ``restart_s``: from the failure seen to the next worker ready (the failed one stopped);
- ``to_caption_s``: from the failure seen to the next caption update reaching the outbox;
- ``lost_words`` / ``doubled_words``: committed words of the fault-free run missing from the
  faulted run's, and words it has in addition (difflib alignment of normalised words).

The fault-injection variable is read only by the worker; this benchmark and the test suite are
the only things that set it.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from word_times import speech_dir  # noqa: E402

CLIPS = ("en_ls_1089-134691-0001", "en_ls_1995-1837-0001", "en_ls_1089-134686-0001", "en_ls_1089-134686-0000")


def recording(out: Path) -> Path:
    root = speech_dir() / "audio"
    parts = []
    for clip in CLIPS:
        audio, rate = sf.read(root / f"{clip}.wav", dtype="float32")
        if rate != 16_000:
            raise SystemExit(f"bench_hot_restart: {clip} is at {rate} Hz, expected 16000")
        parts += [audio, np.zeros(int(1.5 * rate), np.float32)]
    sf.write(out, np.concatenate(parts), 16_000)
    return out


def one_run(path: Path, device: str, isolation: str, fault: str | None) -> dict:
    from captioner.audio.file_source import FileSource
    from captioner.engine.core import EngineConfig
    from captioner.engine.host import FAULT_ENV
    from captioner.engine.pipeline import Pipeline
    from captioner.engine.policy.words import normalize_word
    from captioner.engine.scheduler import SchedulerConfig

    if fault:
        os.environ[FAULT_ENV] = fault
    else:
        os.environ.pop(FAULT_ENV, None)
    # Updates once a second whatever the load (the interval does not stretch): the fault-free
    # and the faulted runs then ask the model about the same windows.
    config = EngineConfig(scheduler=SchedulerConfig(max_interval_s=1.0))
    pipeline = Pipeline([FileSource(path, stream="talk", realtime=True)], model="tiny.en", device=device,
                        isolation=isolation, config=config)
    timed = []  # (time seen, update)
    notices = []
    pipeline.start()
    try:
        while not pipeline.wait_exhausted(0.01):
            now_s = time.monotonic()
            timed += [(now_s, u) for u in pipeline.drain_captions()]
            notices += pipeline.worker_notices()
    finally:
        pipeline.stop()
        os.environ.pop(FAULT_ENV, None)
    timed += [(time.monotonic(), u) for u in pipeline.drain_captions()]
    notices += pipeline.worker_notices()
    captioner = pipeline.captioner
    result = {
        "fault": fault,
        "provider": pipeline.provider,
        "isolation": getattr(captioner, "isolation", "none"),
        "restarts": pipeline.worker_restarts,
        "notices": notices,
        "words": [normalize_word(w) for _, u in timed if u.kind == "final" for w in u.text.split()],
    }
    failed_at = getattr(captioner, "failed_at_s", [])
    if failed_at:
        after = [t for t, _ in timed if t >= failed_at[0]]
        finals_after = [t for t, u in timed if t >= failed_at[0] and u.kind == "final"]
        result["restart_s"] = round(captioner.restart_s[0], 3)
        result["to_caption_s"] = round(after[0] - failed_at[0], 3) if after else None
        result["to_final_s"] = round(finals_after[0] - failed_at[0], 3) if finals_after else None
    return result


def compare(reference: list[str], words: list[str]) -> tuple[int, int]:
    """(words of ``reference`` missing from ``words``, words ``words`` has in addition)."""
    lost = doubled = 0
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=reference, b=words, autojunk=False).get_opcodes():
        if op in ("delete", "replace"):
            lost += i2 - i1
        if op in ("insert", "replace"):
            doubled += j2 - j1
    return lost, doubled


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--isolation", default="auto", choices=("auto", "inline", "process"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = recording(Path(tmp) / "talk.wav")
        clean = one_run(path, args.device, args.isolation, None)
        print(f"fault-free: {len(clean['words'])} committed words on {clean['provider']} "
              f"({clean['isolation']})", flush=True)
        runs = []
        for k in range(args.runs):
            result = one_run(path, args.device, args.isolation, f"step:{6 + 4 * k}")
            result["lost_words"], result["doubled_words"] = compare(clean["words"], result["words"])
            runs.append(result)
            print(f"{result['fault']}: restarts {result['restarts']}, restart {result.get('restart_s')} s, "
                  f"next caption {result.get('to_caption_s')} s, next final {result.get('to_final_s')} s, "
                  f"lost {result['lost_words']}, doubled {result['doubled_words']}", flush=True)
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "device": args.device,
        "reference_words": len(clean["words"]),
        "reference": " ".join(clean["words"]),
        "runs": [{**r, "words": " ".join(r["words"])} for r in runs],
    }
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    failed = [r for r in runs if r["restarts"] < 1 or r["lost_words"] or r["doubled_words"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
