"""NumPy vs CuPy streaming log-mel, side by side in one run (a benchmark, not a test).

Measures, for every back-end available (``cpu`` always, ``cuda`` when usable):

* throughput in hours of audio per second for 1, 64 and 1024 streams, fed
  - ``10ms``: every push carries one 10 ms frame of every stream, from host memory (live
    capture: each push is a whole batched step);
  - ``1s``: every push carries 100 frames (1 s) of every stream, already in the back-end's
    memory (catching up, or files);
  - ``10s``: 1,000 frames per stream per push, on the device (bulk work: files, archives);
    CUDA only, where the per-push host overhead of Python would otherwise be what is timed;
* per-frame latency at one stream: one 10 ms frame from host memory -> its log-mel frame
  ready in the ring (the device synchronised), median and p99;
* agreement on real speech (with ``--speech-dir``): the max difference between the back-ends'
  streaming log-mel, and of each against the NumPy specification.

Prints a markdown table and writes everything as JSON::

    PYTHONPATH=src python3 benchmarks/bench_features.py --json benchmarks/results/features/DATE-MACHINE-features.json \
        --speech-dir ../shared/speech
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
import wave
from pathlib import Path

import numpy as np

from captioner.events import FRAMES_PER_S
from captioner.gpu import backend as backend_mod
from captioner.gpu import features_ref as ref
from captioner.gpu.features import StreamingFeatures
from kernel_timing import time_stages  # beside this script (benchmarks/)

STREAM_COUNTS = (1, 64, 1024)
FEEDS = {"10ms": 1, "1s": 100, "10s": 1000}  # frames per stream per push
CPU_FEEDS = ("10ms", "1s")  # NumPy needs minutes for one 10 s push of 1024 streams


def _audio(n_streams: int, n_samples: int, seed: int = 3) -> np.ndarray:
    # Noise shaped a little like speech (a low-pass), at a speech-like level; the kernels do
    # the same arithmetic whatever the signal is, so its content only matters for realism.
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal((n_streams, n_samples)).astype(np.float32)
    noise[:, 1:] += 0.9 * noise[:, :-1]
    return 0.05 * noise


def throughput(xb, n_streams: int, frames_per_push: int, budget_s: float, speaker_bands: bool = False, **options) -> dict:
    # Log-mel only by default (what the target is about); the speaker bands on request.
    sf = StreamingFeatures(xb, n_mels=80, speaker_bands=speaker_bands, max_streams=n_streams, ring_frames=max(256, frames_per_push),
                           max_push_frames=max(frames_per_push, 1), **options)
    slots = np.arange(n_streams)
    n_pushes_data = 8 if frames_per_push <= 100 else 2
    host = _audio(n_streams, n_pushes_data * frames_per_push * 160)
    on_device = frames_per_push > 1
    chunks = [host[:, i * frames_per_push * 160 : (i + 1) * frames_per_push * 160] for i in range(n_pushes_data)]
    if on_device:
        chunks = [xb.asarray(np.ascontiguousarray(c)) for c in chunks]
    for c in chunks[: 3 if xb.is_cuda else 1]:  # warm-up: plans, graphs, caches
        sf.push_batch(slots, c)
    sf.synchronize()
    pushes = 0
    start = time.perf_counter()
    # No synchronisation inside the loop (a bulk job has none): the host runs at most three
    # pushes ahead of the GPU (StreamingFeatures waits on its staging buffers' events), so the
    # clock is read as pushes are queued and once more when the last has finished.
    while time.perf_counter() - start < budget_s:
        sf.push_batch(slots, chunks[pushes % n_pushes_data])
        pushes += 1
    sf.synchronize()
    elapsed = time.perf_counter() - start
    audio_s = pushes * n_streams * frames_per_push * 0.01
    return {
        "streams": n_streams,
        "frames_per_push": frames_per_push,
        "input": "device" if on_device and xb.is_cuda else "host",
        "pushes": pushes,
        "elapsed_s": elapsed,
        "audio_hours_per_s": audio_s / elapsed / 3600.0,
        "realtime_factor": audio_s / elapsed,
        "speaker_bands": speaker_bands,
        "path": sf.path,
    }


def latency(xb, n_frames: int, budget_s: float) -> dict:
    sf = StreamingFeatures(xb, n_mels=80, speaker_bands=True, max_streams=1, ring_frames=256)
    blocks = _audio(1, (n_frames + 50) * 160)[0].reshape(-1, 160)
    for b in blocks[:50]:
        sf.push(0, b)
    sf.synchronize()
    times_ns = []
    start = time.perf_counter()
    for b in blocks[50:]:
        t0 = time.perf_counter_ns()
        sf.push(0, b)
        sf.synchronize()
        times_ns.append(time.perf_counter_ns() - t0)
        if time.perf_counter() - start > budget_s:
            break
    t_ms = np.asarray(times_ns) / 1e6
    return {
        "frames": int(t_ms.size),
        "median_ms": float(np.median(t_ms)),
        "p99_ms": float(np.percentile(t_ms, 99)),
        "max_ms": float(t_ms.max()),
        "path": sf.path,
    }


def _read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path), "rb") as w:
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return data.astype(np.float32) / 32768.0


def agreement(configs: dict, speech_dir: Path) -> dict:
    """Streaming log-mel of every recording, 10 ms at a time, on each back-end."""
    clips = sorted((speech_dir / "audio").glob("*.wav"))
    worst: dict[str, float] = {}
    for n_mels in (80, 128):
        for path in clips:
            audio = _read_wav(path)
            audio = audio[: audio.shape[0] // 160 * 160]
            spec = ref.log_mel_spectrogram(audio, n_mels)
            keep = spec >= spec.max() - 8.0
            outs = {}
            for name, (xb, options) in configs.items():
                sf = StreamingFeatures(xb, n_mels=n_mels, max_streams=1, ring_frames=audio.shape[0] // 160, **options)
                for blk in audio.reshape(-1, 160):
                    sf.push(0, blk)
                n = sf.frames_ready(0)
                outs[name] = xb.asnumpy(sf.log_mel_window(0, 0, n))
            n = outs["cpu"].shape[1]
            pairs = [(name, spec[:, :n]) for name in outs] + (
                [("cuda_vs_cpu", outs["cpu"])] if "cuda" in outs else []
            )
            for label, other in pairs:
                got = outs["cuda" if label == "cuda_vs_cpu" else label]
                diff = np.abs(got - other)
                norm = np.abs(ref.whisper_normalize(got) - ref.whisper_normalize(other))
                for key, value in (
                    (f"{label}/all", diff.max()),
                    (f"{label}/kept", diff[keep[:, :n]].max()),
                    (f"{label}/normalized", norm.max()),
                ):
                    worst[key] = max(worst.get(key, 0.0), float(value))
    return {"clips": len(clips), "max_abs_error": worst}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--budget-s", type=float, default=1.5, help="seconds per throughput measurement")
    parser.add_argument("--latency-frames", type=int, default=3000)
    parser.add_argument("--speech-dir", type=Path, default=None, help="shared/speech, for the agreement check")
    parser.add_argument("--streams", type=int, nargs="*", default=list(STREAM_COUNTS))
    args = parser.parse_args(argv)

    backends = {"cpu": backend_mod.get_backend("cpu")}
    if backend_mod.cuda_usable():
        backends["cuda"] = backend_mod.get_backend("cuda:0")
    gpus = backend_mod.describe_gpus()
    results: dict = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "cpu": platform.processor() or platform.machine(),
        "gpus": [g.__dict__ for g in gpus],
        "throughput": [],
        "latency": {},
    }
    if "cuda" in backends:
        results["cupy"] = backends["cuda"].xp.__version__
    for name, xb in backends.items():
        results["latency"][name] = latency(xb, args.latency_frames, budget_s=3.0 if name == "cpu" else 10.0)
        for feed, frames in FEEDS.items():
            if not xb.is_cuda and feed not in CPU_FEEDS:
                continue
            for n_streams in args.streams:
                row = throughput(xb, n_streams, frames, args.budget_s)
                row.update(backend=name, feed=feed)
                results["throughput"].append(row)
                print(f"# {name} {feed} {n_streams} streams: {row['audio_hours_per_s']:.4g} h/s", file=sys.stderr)
        if xb.is_cuda:
            big = max(args.streams)
            for feed in ("1s", "10s"):  # the other FFT precision, and the speaker bands on top, side by side
                for label, options in (("mixed FFT", {"fft_precision": "mixed"}), ("+ 40 speaker bands", {"speaker_bands": True})):
                    row = throughput(xb, big, FEEDS[feed], args.budget_s, **options)
                    row.update(backend=name, feed=f"{feed}, {label}")
                    results["throughput"].append(row)
                    print(f"# {name} {feed} {label} {big} streams: {row['audio_hours_per_s']:.4g} h/s", file=sys.stderr)
            results["cuda_stage_ms_per_push"] = {}  # where the GPU time goes (CUDA events)
            for precision in ("mixed", "float32"):
                sf = StreamingFeatures(xb, max_streams=big, ring_frames=1000, max_push_frames=1000,
                                       fft_precision=precision)
                if sf._cuda is not None:
                    results["cuda_stage_ms_per_push"][precision] = {
                        "streams": big, "frames_per_push": 1000, **time_stages(sf, big, 1000)}
                del sf
    if args.speech_dir is not None and (args.speech_dir / "audio").is_dir():
        configs = {"cpu": (backends["cpu"], {})}
        if "cuda" in backends:
            configs["cuda"] = (backends["cuda"], {})
            configs["cuda_fft32"] = (backends["cuda"], {"fft_precision": "float32"})
            configs["cuda_mixed"] = (backends["cuda"], {"fft_precision": "mixed"})
        results["agreement"] = agreement(configs, args.speech_dir)

    print(render_markdown(results))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def render_markdown(results: dict) -> str:
    names = list(results["latency"])
    both = len(names) > 1
    lines = ["| measurement | " + " | ".join(names) + (" | CuPy / NumPy |" if both else " |"),
             "|---|" + "---|" * len(names) + ("---|" if both else "")]
    by_key = {(r["backend"], r["feed"], r["streams"]): r for r in results["throughput"]}
    row_keys = list(dict.fromkeys((r["feed"], r["streams"]) for r in results["throughput"]))
    for feed, n in row_keys:
        vals = [by_key.get((b, feed, n), {}).get("audio_hours_per_s") for b in names]
        cells = " | ".join("—" if v is None else _fmt(v) for v in vals)
        ratio = ""
        if both:
            ratio = f" {vals[1] / vals[0]:,.0f}x |" if None not in vals else " — |"
        lines.append(f"| throughput, {n} streams, {feed} pushes (hours of audio / s) | {cells} |" + ratio)
    for stat in ("median_ms", "p99_ms"):
        vals = [results["latency"][b][stat] for b in names]
        ratio = f" {vals[0] / vals[1]:.1f}x faster |" if both else ""
        lines.append(f"| latency, 1 stream, one 10 ms frame, {stat[:-3]} (ms) | "
                     + " | ".join(f"{v:.3f}" for v in vals) + " |" + ratio)
    for precision, st in results.get("cuda_stage_ms_per_push", {}).items():
        hours = st["frames_per_push"] * st["streams"] / FRAMES_PER_S / 3600
        lines.append("")
        lines.append(f"GPU time per push of {st['frames_per_push']} frames x {st['streams']} streams, {precision} FFT (ms): "
                     + f"fused {st['fused']:.3f}"
                     + f" -> {hours / (st['fused'] / 1000):,.0f} h of audio per s of GPU time")
    lines.append("")
    lines.append("paths: " + ", ".join(f"{b}={results['latency'][b]['path']}" for b in names))
    if "agreement" in results:
        lines.append("")
        lines.append(f"agreement on {results['agreement']['clips']} recordings (80 and 128 mels), max |difference|:")
        for key, value in sorted(results["agreement"]["max_abs_error"].items()):
            lines.append(f"- {key}: {value:.2e}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
