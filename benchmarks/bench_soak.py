"""A long faster-than-real-time soak of the live engine: does memory stay flat?

    python benchmarks/bench_soak.py --hours 2 --device cuda:0 --json out.json [--speech-dir DIR]

Real English recordings (tests/data/speech, or --speech-dir) are joined with short pauses and
looped into one stream of the given length, fed to `captioner.LiveCaptioner` half a second at a
time as fast as it takes them (a `step()` after each). Every `--sample-s` of audio it samples
this process's resident memory (psutil) and, on a GPU, the device memory in use (NVML, the same
reading the dashboard plots). It reports the samples, the committed words, and the spread of
each series over the second half of the run (flat means within 5 % of its median).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def loop_audio(speech_dir: Path, seconds: float, rate_hz: int = 16_000) -> np.ndarray:
    import soundfile as sf

    rows = list(csv.DictReader((speech_dir / "manifest.tsv").open(encoding="utf-8"), delimiter="\t",
                               quoting=csv.QUOTE_NONE))
    clips = []
    for row in rows:
        if row["language"] != "en" or float(row["duration_s"]) > 35:
            continue
        audio, rate = sf.read(speech_dir / row["wav"], dtype="float32")
        if rate == rate_hz and audio.ndim == 1:
            clips += [audio, np.zeros(int(0.8 * rate_hz), np.float32)]
    one_pass = np.concatenate(clips)
    repeats = int(np.ceil(seconds * rate_hz / one_pass.shape[0]))
    return np.tile(one_pass, repeats)[: int(seconds * rate_hz)]


def gpu_used_mib(index: int) -> float | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index))
        return info.used / 2**20
    except Exception:
        return None


def spread(values: list[float]) -> float | None:
    """Largest distance from the median over the second half, as a fraction of the median."""
    half = [v for v in values[len(values) // 2:] if v is not None]
    if not half:
        return None
    median = float(np.median(half))
    return max(abs(v - median) for v in half) / median if median else None


def main() -> int:
    import psutil

    import captioner

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--speech-dir", type=Path, default=ROOT / "tests" / "data" / "speech")
    parser.add_argument("--sample-s", type=float, default=300.0, help="audio seconds between samples")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.hours <= 0 or args.sample_s <= 0:
        print("bench_soak: --hours and --sample-s must be positive", file=sys.stderr)
        return 2
    audio = loop_audio(args.speech_dir, args.hours * 3600)
    live = captioner.LiveCaptioner(model="tiny.en", device=args.device)
    stream = live.open_stream("soak")
    process = psutil.Process()
    gpu_index = int(args.device.split(":")[1]) if args.device.startswith("cuda:") else 0
    chunk = 8000
    samples, words = [], 0
    next_sample_s = 0.0
    started = time.perf_counter()
    for first in range(0, audio.shape[0], chunk):
        stream.accept_waveform(16_000, audio[first:first + chunk])
        words += sum(len(u.text.split()) for u in live.step() if u.kind == "final")
        audio_s = (first + chunk) / 16_000
        if audio_s >= next_sample_s:
            samples.append({"audio_s": round(audio_s), "wall_s": round(time.perf_counter() - started, 1),
                            "rss_mib": round(process.memory_info().rss / 2**20, 1),
                            "gpu_used_mib": gpu_used_mib(gpu_index) if live.provider.startswith("CUDA") else None})
            print(json.dumps(samples[-1]), flush=True)
            next_sample_s += args.sample_s
    stream.finish()
    while not stream.done:
        words += sum(len(u.text.split()) for u in live.step() if u.kind == "final")
    live.close()
    result = {"device": args.device, "provider": live.provider, "audio_s": audio.shape[0] / 16_000,
              "wall_s": round(time.perf_counter() - started, 1), "committed_words": words, "samples": samples,
              "rss_spread_second_half": spread([s["rss_mib"] for s in samples]),
              "gpu_spread_second_half": spread([s["gpu_used_mib"] for s in samples])}
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
