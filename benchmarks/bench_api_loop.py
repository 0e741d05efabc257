"""The public API's documented loop (docs/api.md) on a real recording: 100 ms chunks handed to
``accept_waveform``, ``step()`` after each, then ``finish()`` and ``step()`` until done; the
audio fed as fast as ``step()`` returns (a file, a backlog) or at real-time pace (a microphone).
Committed WER against the reference, next to the same model offline (``captioner.transcribe``),
and how far the committed text is from the offline one.

Run: PYTHONPATH=src python3 benchmarks/bench_api_loop.py [--clip ID] [--pace fast,realtime]
     [--device cpu] [--out FILE]
The default clip is the longest spontaneous recording of the set.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

import speech_kinds  # noqa: E402
from bench_latency import NORMALIZER_NAME, wer_counts  # noqa: E402
from word_times import load_manifest  # noqa: E402


def run_loop(path: str, model: str, device: str, pace: str) -> tuple[list, float]:
    """The documented loop over ``path``; returns the updates and the wall time it took."""
    import soundfile as sf

    import captioner

    samples, rate_hz = sf.read(path, dtype="float32")
    chunk = rate_hz // 10  # 100 ms
    live = captioner.LiveCaptioner(model=model, device=device)
    me = live.open_stream("Me", language=None)
    updates = []
    t0 = time.perf_counter()
    for k, start in enumerate(range(0, len(samples), chunk)):
        if pace == "realtime":  # a microphone delivers each chunk when it has been spoken
            time.sleep(max(0.0, t0 + (k + 1) * 0.1 - time.perf_counter()))
        me.accept_waveform(rate_hz, samples[start:start + chunk])
        updates += live.step()
    me.finish()
    while not me.done:
        updates += live.step()
    wall_s = time.perf_counter() - t0
    live.close()
    return updates, wall_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clip", default="", help="clip id (default: the longest spontaneous one)")
    parser.add_argument("--pace", default="fast,realtime", help="fast, realtime or both (comma separated)")
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import captioner

    clips = {c["id"]: c for c in load_manifest()}
    if args.clip and args.clip not in clips:
        parser.error(f"no clip {args.clip!r} in the set")
    clip = clips[args.clip] if args.clip else max(
        (c for c in clips.values() if speech_kinds.kind(c["id"]) == "spontaneous"), key=lambda c: c["duration_s"])
    offline = captioner.transcribe(clip["path"], model=args.model, language="en", device=args.device).text
    report = {"date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
              "command": " ".join(sys.argv), "clip": clip["id"], "audio_s": clip["duration_s"],
              "model": args.model, "device": args.device, "normalizer": NORMALIZER_NAME,
              "offline_text": offline, "wer_offline": wer_counts(clip["reference"], offline), "runs": []}
    for pace in filter(None, args.pace.split(",")):
        updates, wall_s = run_loop(clip["path"], args.model, args.device, pace)
        finals = [u for u in updates if u.kind == "final"]
        text = " ".join(u.text for u in finals)
        run = {"pace": pace, "wall_s": round(wall_s, 1), "text": text,
               "wer_streaming": wer_counts(clip["reference"], text),
               "streaming_vs_offline": wer_counts(offline, text),
               "words_timed": sum(len(u.words) for u in finals),
               "finals_in_order": all(a.end_s <= b.start_s + 1e-9 for a, b in zip(finals, finals[1:]))}
        report["runs"].append(run)
        e, n = run["wer_streaming"]
        eo, _ = report["wer_offline"]
        print(f"{clip['id']} {pace}: {wall_s:.0f} s, WER {100 * e / n:.1f} % against offline {100 * eo / n:.1f} % "
              f"({100 * (e - eo) / n:+.1f} points), {run['words_timed']} words timed", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
