"""Host vs device decoding, side by side: one batched recognizer step (``WhisperRecognizer.decode``,
what the engine calls for every due stream) over B real speech windows, for B = 1 … 256.

``host``: every decoder step copies the [B, n_vocab] logits to the host and NumPy applies
Whisper's token rules row by row (``LogitRules``, the specification). ``device``: the same
rules as array code where the logits lie (``models/device_rules.py``; CuPy on CUDA, where only
token ids and log-probabilities cross to the host each step; NumPy on the CPU). Both share one
loaded model, the same windows and the engine's streaming options (greedy, 128 tokens at most).
``keep`` is the device mode with finished rows kept in the batch to the end (``drop_finished=False``),
to show what moving the rest into smaller batches saves.

The windows are ``--window-s`` long pieces of the English recordings of the speech set, taken at
different offsets and repeated until there are enough (every stream of a step hears something
else, as in a live batch). Each batch size is run once per mode after one warm-up call (CUDA
graph capture, memory arenas); the encoder alone is timed on the same batch, so the rest of a
step is decoding. Both modes must give the same words; the table says whether they did.

Run (here):  .venv/bin/python benchmarks/bench_decode.py --device cpu --batches 1,4,16
Run (H200):  PYTHONPATH=src:/tmp/site:/tmp/stage/ortsite:/tmp/stage python3 benchmarks/bench_decode.py \\
                 --device cuda:0 --batches 1,2,4,8,16,32,64,128,256 --out $OUT/2026-12-01-h200-decode.json
(the recordings from ``$CAPTIONER_SPEECH_DIR``, else ../shared/speech, else tests/data/speech)
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import platform
import sys
import time
import wave
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from word_times import speech_dir  # noqa: E402

MODES = ("host", "device", "device_keep")
"""``device_keep``: on the device, but finished rows stay in the batch (``drop_finished=False``)."""


def read_16k(path: Path) -> np.ndarray:
    """16-bit mono 16 kHz WAV with the standard library (the GPU machine has no soundfile);
    FLAC (the shipped subset's long readings) through soundfile where it is installed."""
    if path.suffix.lower() == ".flac":
        import soundfile as sf

        data, rate_hz = sf.read(str(path), dtype="int16")
    else:
        with wave.open(str(path), "rb") as w:
            if w.getsampwidth() != 2 or w.getnchannels() != 1:
                raise ValueError(f"{path.name}: not 16-bit mono")
            rate_hz = w.getframerate()
            data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    if rate_hz != 16_000:
        raise ValueError(f"{path.name}: {rate_hz} Hz, not 16 kHz")
    return data.astype(np.float32) / 32768.0


def speech_windows(folder: Path, window_s: float, count: int) -> list[np.ndarray]:
    """``count`` raw log-mel windows [80, frames] of English speech, at spread offsets."""
    from captioner.gpu.features_ref import log_mel_spectrogram

    manifest = folder / "manifest.tsv"
    if not manifest.exists():
        raise ValueError(f"no speech recordings at {folder} (manifest.tsv missing); set CAPTIONER_SPEECH_DIR")
    with manifest.open(encoding="utf-8", newline="") as f:
        clips = [r for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if r["language"] == "en"]
    pieces = []
    window = int(window_s * 16_000)
    for clip in clips:
        try:
            audio = read_16k(folder / clip["wav"])
        except (ImportError, ValueError) as e:
            print(f"skipping {clip['id']}: {e}", file=sys.stderr)
            continue
        for start in range(0, max(1, len(audio) - window // 2), window // 2):
            piece = audio[start:start + window]
            if len(piece) >= 16_000:
                pieces.append(log_mel_spectrogram(piece, 80))
    if not pieces:
        raise ValueError(f"no readable English recordings at {folder}")
    return [pieces[(i * 7) % len(pieces)] for i in range(count)]  # spread, then repeated


def run(args) -> dict:
    from captioner.engine.recognizer import WindowRequest
    from captioner.engine.whisper import WhisperRecognizer, default_streaming_options
    from captioner.gpu.backend import get_backend
    from captioner.models.runtime import load_runtime
    from captioner.models.tokenizer import WhisperTokenizer

    backend = get_backend(args.device)
    backend.use()
    runtime = load_runtime(args.model, device=backend.name)
    tokenizer = WhisperTokenizer(runtime.files.tokenizer_path, runtime.files.config_path, n_vocab=runtime.n_vocab)
    sync = backend.synchronize if backend.is_cuda else None
    streaming = default_streaming_options()
    options = {"host": replace(streaming, decode_on="host"), "device": replace(streaming, decode_on="device"),
               "device_keep": replace(streaming, decode_on="device", drop_finished=False)}
    recognizers = {mode: WhisperRecognizer(runtime, tokenizer, xp=backend.xp, synchronize=sync, options=options[mode])
                   for mode in MODES}
    batches = [int(b) for b in args.batches.split(",")]
    windows = [backend.asarray(w) for w in speech_windows(speech_dir(), args.window_s, max(batches))]
    print(f"{runtime.name} on {runtime.device_name} ({runtime.provider}, {runtime.precision}); "
          f"{args.window_s:g} s windows; one timed run per batch size and mode", flush=True)
    print(f"{'B':>5} {'encoder ms':>11} {'host ms':>9} {'device ms':>10} {'keep ms':>8} {'host/stream':>12} "
          f"{'device/stream':>14} {'host/device':>12} {'same words':>11}", flush=True)
    rows = []
    for batch in batches:
        requests = [WindowRequest(stream=f"s{i}", log_mel=windows[i], start_s=0.0, prompt="", language=None)
                    for i in range(batch)]
        mel = recognizers["host"]._input(requests)
        row = {"batch": batch}
        for repeat in range(2):  # a warm-up, then the timed run
            backend.synchronize()
            t0 = time.perf_counter()
            runtime.encode(mel)
            backend.synchronize()
            row["encoder_ms"] = (time.perf_counter() - t0) * 1e3
            words = {}
            for mode in MODES:
                backend.synchronize()
                t0 = time.perf_counter()
                hypotheses = recognizers[mode].decode(requests)
                backend.synchronize()
                if repeat:
                    row[f"{mode}_ms"] = (time.perf_counter() - t0) * 1e3
                words[mode] = [tuple(h.words) for h in hypotheses]
        row["same_words"] = words["host"] == words["device"] == words["device_keep"]
        row["n_words"] = sum(len(w) for w in words["device"])
        row["host_over_device"] = row["host_ms"] / row["device_ms"]
        rows.append(row)
        print(f"{batch:>5} {row['encoder_ms']:>11.1f} {row['host_ms']:>9.1f} {row['device_ms']:>10.1f} {row['device_keep_ms']:>8.1f} "
              f"{row['host_ms'] / batch:>12.2f} {row['device_ms'] / batch:>14.2f} "
              f"{row['host_over_device']:>12.2f} {'yes' if row['same_words'] else 'NO':>11}", flush=True)
    return {
        "what": "WhisperRecognizer.decode over B real speech windows, host vs device decoding",
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "model": runtime.name, "device": runtime.device_name,
        "provider": runtime.provider, "precision": runtime.precision, "window_s": args.window_s,
        "rows": rows,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: the best available)")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64,128,256", help="comma-separated batch sizes")
    ap.add_argument("--window-s", type=float, default=8.0, help="seconds of speech per window (≤ 30)")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args()
    from captioner.errors import UserError

    try:
        batches = [int(b) for b in args.batches.split(",")]
        if not batches or min(batches) < 1:
            raise ValueError("--batches needs positive integers")
        if not 1.0 <= args.window_s <= 30.0:
            raise ValueError("--window-s must be between 1 and 30")
        result = run(args)
    except (UserError, ValueError, OSError) as e:
        print(f"bench_decode: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
