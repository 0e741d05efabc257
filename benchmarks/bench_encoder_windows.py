"""Shorter encoder windows (issue 12) against Whisper's 30 s window, side by side in one run:
word error rate and time per window, on the real recordings.

Every English recording of the speech set is cut into consecutive windows of ``--windows-s``
seconds (5, 10, 15, 20: what a stream's buffer holds between a segment's start and an update;
a recording shorter than a window is one window), and every window is decoded by the engine's
recognizer (``WhisperRecognizer.decode``: the streaming options, greedy, no prompt) once per audio
context that holds it: the 30 s graphs, and each shorter context (``--contexts-s``, 10 and 20 s)
at least as long as the window. The texts of a recording's windows, joined in order, are scored
against its reference transcript, so a context is judged on the same windows, the same cuts
(words cut in two at a window's edge cost every context alike) and the same words. ``auto`` is
what the recognizer does when short contexts are on: each window in the shortest context that
holds it plus ``--margin-s`` of silence, else 30 s (taken from the same decodes).

Time: for each window length, one batch of ``--batch`` of its windows is decoded in every
context that holds them (encoder + cross K/V + every decoder step, the recognizer's whole call),
and encoded alone, the contexts taking turns, ``--repeats`` rounds; the median per window is
reported. Taking turns keeps a shared machine's changing load from favouring one context. One
call of each shape runs first, untimed (graph set-up, CUDA graph capture). ``auto``'s time is
the contexts' times weighted by how many windows each got.

Run (here):  .venv/bin/python benchmarks/bench_encoder_windows.py --device cpu --out benchmarks/results/encoder-windows/DATE-cpu-encoder-windows.json
Run (H200):  PYTHONPATH=src:/tmp/site:/tmp/stage/ortsite:/tmp/stage python3 benchmarks/bench_encoder_windows.py \\
                 --device cuda:0 --models tiny.en base --batch 64 --out $OUT/2026-12-01-h200-encoder-windows.json
(the recordings from ``$CAPTIONER_SPEECH_DIR``, else ../shared/speech, else tests/data/speech)
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import platform
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_decode import read_16k  # noqa: E402
from wer import word_edits  # noqa: E402
from word_times import speech_dir  # noqa: E402

SAMPLE_RATE_HZ = 16_000
MIN_PIECE_S = 0.5
"""A recording's last piece shorter than this is not decoded (a breath, not a window)."""


@dataclass
class Piece:
    clip: str
    index: int
    log_mel: np.ndarray  # raw log10 mel [80, frames]
    duration_s: float
    text: dict[int, str] = field(default_factory=dict)  # mel frames of the context -> decoded text


def english_clips(folder: Path) -> list[dict]:
    manifest = folder / "manifest.tsv"
    if not manifest.exists():
        raise ValueError(f"no speech recordings at {folder} (manifest.tsv missing); set CAPTIONER_SPEECH_DIR")
    with manifest.open(encoding="utf-8", newline="") as f:
        return [r for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if r["language"] == "en"]


def cut(audio: np.ndarray, window_s: float) -> list[np.ndarray]:
    """Consecutive pieces of ``window_s`` (the last one shorter), pieces under MIN_PIECE_S dropped."""
    step = int(window_s * SAMPLE_RATE_HZ)
    pieces = [audio[start:start + step] for start in range(0, len(audio), step)]
    return [p for p in pieces if len(p) >= MIN_PIECE_S * SAMPLE_RATE_HZ]


def normaliser():
    """Whisper's English normaliser where installed (as benchmarks/wer.py scores), else lower
    case without punctuation (the GPU machine lacks it; the comparison is side by side)."""
    try:
        from whisper_normalizer.english import EnglishTextNormalizer

        english = EnglishTextNormalizer()
        return "whisper-english", lambda text: english(text.replace("\u2019", "'")).split()
    except ImportError:
        return "lowercase", lambda text: re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()


def _requests(pieces: list[Piece], xp):
    from captioner.engine.recognizer import WindowRequest

    return [WindowRequest(f"{p.clip}#{p.index}", xp.asarray(p.log_mel), 0.0, "", None) for p in pieces]


def decode_all(recognizer, pieces: list[Piece], width: int, batch: int) -> None:
    """Decode ``pieces`` padded to ``width`` mel frames, ``batch`` at a time, keeping each
    piece's text."""
    for start in range(0, len(pieces), batch):
        group = pieces[start:start + batch]
        for piece, h in zip(group, recognizer.decode(_requests(group, recognizer.xp), window_frames=width)):
            piece.text[width] = " ".join(w.text.strip() for w in h.words)


def timings_ms(runtime, recognizer, batches: dict[int, list[Piece]], repeats: int) -> dict[int, tuple[float, float]]:
    """Width -> (median ms per window of the recognizer's whole call, of the encoder alone) on
    its batch of pieces, the contexts taking turns."""
    widths = sorted(batches)
    requests = {w: _requests(batches[w], recognizer.xp) for w in widths}
    sync = recognizer._synchronize or (lambda: None)
    mels = {w: recognizer._input(requests[w], w).copy() for w in widths}
    for w in widths:  # warm-up: graph set-up, CUDA graph capture
        recognizer.decode(requests[w], window_frames=w)
        runtime.encode(mels[w])
    calls: dict[int, list[float]] = {w: [] for w in widths}
    encodes: dict[int, list[float]] = {w: [] for w in widths}
    for _ in range(repeats):
        for w in widths:
            sync()
            began = time.perf_counter()
            recognizer.decode(requests[w], window_frames=w)
            calls[w].append(time.perf_counter() - began)
            sync()
            began = time.perf_counter()
            runtime.encode(mels[w])  # ONNX Runtime returns once its stream is done
            encodes[w].append(time.perf_counter() - began)
    return {w: (1000 * float(np.median(calls[w])) / len(batches[w]), 1000 * float(np.median(encodes[w])) / len(batches[w]))
            for w in widths}


def score(clips: list[dict], pieces: list[Piece], pick, words, texts: dict | None = None) -> tuple[int, int]:
    """(word errors, reference words) over the recordings, each one's piece texts joined in order;
    ``pick(piece)`` says which context's text a piece contributes; ``texts`` receives each
    recording's joined text."""
    errors = units = 0
    by_clip: dict[str, list[Piece]] = {}
    for p in pieces:
        by_clip.setdefault(p.clip, []).append(p)
    for clip in clips:
        own = sorted(by_clip.get(clip["id"], []), key=lambda p: p.index)
        if not own:
            continue
        reference = words(clip["reference"])
        joined = " ".join(p.text[pick(p)] for p in own)
        if texts is not None:
            texts[clip["id"]] = joined
        hypothesis = words(joined)
        errors += word_edits(reference, hypothesis)
        units += len(reference)
    return errors, units


def run(args) -> dict:
    from captioner.engine.whisper import WhisperRecognizer, default_streaming_options
    from captioner.gpu.backend import get_backend
    from captioner.gpu.features_ref import log_mel_spectrogram
    from captioner.models.runtime import load_runtime
    from captioner.models.tokenizer import WhisperTokenizer

    folder = speech_dir()
    clips = english_clips(folder)
    if args.only:
        clips = [c for c in clips if c["id"] in set(args.only)]
    audio = {}
    for clip in clips:
        try:
            audio[clip["id"]] = read_16k(folder / clip["wav"])
        except (ImportError, ValueError) as e:
            print(f"skipping {clip['id']}: {e}", file=sys.stderr)
    clips = [c for c in clips if c["id"] in audio]
    if not clips:
        raise ValueError(f"no readable English recordings at {folder}")
    normalised_by, words = normaliser()
    backend = get_backend(args.device)
    backend.use()
    sync = backend.synchronize if backend.is_cuda else None
    rows, models = [], []
    for model in args.models:
        runtime = load_runtime(model, device=backend.name, encoder_windows_s=args.contexts_s)
        tokenizer = WhisperTokenizer(runtime.files.tokenizer_path, runtime.files.config_path, n_vocab=runtime.n_vocab)
        recognizer = WhisperRecognizer(runtime, tokenizer, xp=backend.xp, synchronize=sync,
                                       options=default_streaming_options(), context_margin_s=args.margin_s)
        models.append({"model": model, "provider": runtime.provider, "device": runtime.device_name,
                       "precision": runtime.precision, "contexts": list(runtime.audio_contexts)})
        for window_s in args.windows_s:
            pieces = [Piece(c["id"], i, log_mel_spectrogram(p, runtime.n_mels), len(p) / SAMPLE_RATE_HZ)
                      for c in clips for i, p in enumerate(cut(audio[c["id"]], window_s))]
            longest = max(p.log_mel.shape[1] for p in pieces)
            # Timed batches: the longest windows, the same for every context that holds all of
            # them (the side-by-side rows); a shorter context times the windows "auto" gives it.
            by_length = sorted(pieces, key=lambda p: -p.duration_s)
            batches = {w: [p for p in by_length if (w >= longest or recognizer.window_frames(p.log_mel.shape[1]) == w)][:args.batch]
                       for w in recognizer.context_frames}
            times = timings_ms(runtime, recognizer, {w: b for w, b in batches.items() if b}, args.repeats)
            for width in sorted(recognizer.context_frames, reverse=True):  # 30 s first
                pieces_in = [p for p in pieces if p.log_mel.shape[1] <= width]
                if pieces_in:  # every window it holds, for "auto" below
                    decode_all(recognizer, pieces_in, width, args.batch)
                if width < longest:
                    continue  # a context that does not hold every window gets no row of its own
                texts: dict[str, str] = {}
                errors, units = score(clips, pieces, lambda p, w=width: w, words, texts)
                row = {"texts": texts, "model": model, "window_s": window_s, "context_s": width / 100, "windows": len(pieces),
                       "words": units, "errors": errors, "wer": errors / units,
                       "ms_per_window": times[width][0], "encoder_ms_per_window": times[width][1]}
                rows.append(row)
                print(f"{model:8s} {window_s:4.0f} s windows in {width / 100:4.0f} s: WER {100 * row['wer']:5.2f} % "
                      f"({errors}/{units}), {row['ms_per_window']:7.1f} ms/window, encoder {row['encoder_ms_per_window']:6.1f}",
                      file=sys.stderr, flush=True)
            chosen = {id(p): recognizer.window_frames(p.log_mel.shape[1]) for p in pieces}
            errors, units = score(clips, pieces, lambda p, c=chosen: c[id(p)], words)
            rows.append({"model": model, "window_s": window_s, "context_s": "auto", "windows": len(pieces),
                         "words": units, "errors": errors, "wer": errors / units,
                         "ms_per_window": float(np.mean([times[chosen[id(p)]][0] for p in pieces])),
                         "contexts_used_s": sorted({chosen[id(p)] / 100 for p in pieces})})
    return {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
            "cpu": platform.processor() or platform.machine(), "device": args.device, "batch": args.batch,
            "repeats": args.repeats,
            "margin_s": args.margin_s, "speech_dir": str(folder), "normaliser": normalised_by,
            "clips": [c["id"] for c in clips], "models": models, "rows": rows}


def markdown(result: dict) -> str:
    lines = ["| model | window | context | windows | words | WER % | vs 30 s | ms/window | encoder ms/window |",
             "|---|---|---|---|---|---|---|---|---|"]
    base = {(r["model"], r["window_s"]): r["wer"] for r in result["rows"] if r["context_s"] == 30.0}
    for r in result["rows"]:
        context = "auto (" + "/".join(f"{c:g}" for c in r["contexts_used_s"]) + " s)" if r["context_s"] == "auto" else f"{r['context_s']:g} s"
        delta = 100 * (r["wer"] - base[(r["model"], r["window_s"])])
        encoder = f"{r['encoder_ms_per_window']:.1f}" if "encoder_ms_per_window" in r else ""
        lines.append(f"| {r['model']} | {r['window_s']:g} s | {context} | {r['windows']} | {r['words']} | "
                     f"{100 * r['wer']:.2f} | {delta:+.2f} | {r['ms_per_window']:.1f} | {encoder} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--models", nargs="+", default=["tiny.en"])
    parser.add_argument("--windows-s", type=lambda t: [float(x) for x in t.split(",")], default=[5.0, 10.0, 15.0, 20.0],
                        help="window lengths the recordings are cut into (comma-separated)")
    parser.add_argument("--contexts-s", type=lambda t: [float(x) for x in t.split(",")], default=[10.0, 20.0],
                        help="shorter encoder windows to compare with 30 s (comma-separated)")
    parser.add_argument("--margin-s", type=float, default=1.0, help="silence a context must hold after the audio (auto)")
    parser.add_argument("--batch", type=int, default=4, help="windows decoded per call")
    parser.add_argument("--repeats", type=int, default=3, help="timing rounds (the median is reported)")
    parser.add_argument("--only", nargs="*", default=None, help="recording ids (default: every English one)")
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    from captioner.errors import UserError

    try:
        result = run(args)
    except (UserError, ValueError) as e:
        print(f"bench_encoder_windows: error: {e}", file=sys.stderr)
        return 2
    print(markdown(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
