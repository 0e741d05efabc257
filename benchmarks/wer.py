"""Word error rate on the real recordings: our ONNX Runtime Whisper next to the reference
runtime (CTranslate2 on the same model.bin), side by side in one run.

Both sides go through the same offline transcription loop (30 s windows, segment by segment,
same features, same guards); only the model runtime and the token rules differ. Text is
normalised as the Open ASR Leaderboard does: Whisper's English normaliser for English, its basic
normaliser for other languages; Mandarin is scored by characters (CER).

    /work/venv/bin/python benchmarks/wer.py [--models tiny.en base] [--device cpu] [--json OUT]

tiny.en is English-only: it is scored on the English recordings. The language is given from
the manifest (``--language auto`` lets the multilingual model detect it instead).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SPEECH = REPO.parent / "shared" / "speech"


@dataclass
class Clip:
    id: str
    wav: Path
    language: str
    duration_s: float
    reference: str


def load_clips(root: Path) -> list[Clip]:
    with (root / "manifest.tsv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [Clip(r["id"], root / r["wav"], r["language"], float(r["duration_s"]), r["reference"]) for r in rows]


def _normalisers():
    from whisper_normalizer.basic import BasicTextNormalizer
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer(), BasicTextNormalizer()


def word_edits(reference: list[str], hypothesis: list[str]) -> int:
    """Word-level Levenshtein distance (substitutions + deletions + insertions), in plain
    Python: for benchmarks that must score where jiwer is not installed (the GPU box)."""
    row = list(range(len(hypothesis) + 1))
    for i, word in enumerate(reference, 1):
        prev, row = row, [i] + [0] * len(hypothesis)
        for j in range(1, len(hypothesis) + 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (word != hypothesis[j - 1]))
    return row[-1]


def score(reference: str, hypothesis: str, language: str, normalisers) -> tuple[int, int, str]:
    """(errors, reference units, unit) after normalisation: words, or characters for Mandarin."""
    import jiwer

    english, basic = normalisers
    # Typographic apostrophes would split words differently on the two sides.
    ref = reference.replace("\u2019", "'").replace("\u2018", "'")
    hyp = hypothesis.replace("\u2019", "'").replace("\u2018", "'")
    normalise = english if language == "en" else basic
    ref, hyp = normalise(ref), normalise(hyp)
    if language in ("zh", "ja", "ko", "th"):
        ref, hyp = "".join(ref.split()), "".join(hyp.split())
        out = jiwer.process_characters(ref, hyp if hyp else " ")
        units, unit = len(ref), "char"
    else:
        ref, hyp = " ".join(ref.split()), " ".join(hyp.split())
        out = jiwer.process_words(ref, hyp if hyp else "")
        units, unit = len(ref.split()), "word"
    return out.substitutions + out.deletions + out.insertions, units, unit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny.en", "base"])
    parser.add_argument("--speech", type=Path, default=Path(os.environ.get("CAPTIONER_SPEECH_DIR", DEFAULT_SPEECH)))
    parser.add_argument("--device", default="cpu", help="where our runtime runs (the reference runs on the CPU)")
    parser.add_argument("--language", choices=("given", "auto"), default="given")
    parser.add_argument("--only", nargs="*", default=None, help="clip ids to score (default: all)")
    parser.add_argument("--json", type=Path, default=None, help="write every transcript and count here")
    args = parser.parse_args(argv)

    from captioner.audio.file_source import read_audio_16k
    from captioner.engine.offline import (
        TranscribeOptions,
        load_decoder,
        transcribe_audio,
    )
    from captioner.models.ct2_oracle import Ct2Decoder
    from captioner.models.registry import resolve_model

    clips = load_clips(args.speech)
    if args.only:
        clips = [c for c in clips if c.id in set(args.only)]
    normalisers = _normalisers()
    records = []
    for model in args.models:
        ours = load_decoder(model, args.device)
        reference = Ct2Decoder(resolve_model(model), ours.tokenizer)
        seconds = {"ours": 0.0, "ctranslate2": 0.0}
        for clip in clips:
            if not ours.is_multilingual and clip.language != "en":
                continue
            audio = read_audio_16k(clip.wav)
            language = clip.language if args.language == "given" else "auto"
            options = TranscribeOptions(model=model, language=language)
            row = {"model": model, "clip": clip.id, "language": clip.language, "duration_s": clip.duration_s}
            for side, decoder in (("ours", ours), ("ctranslate2", reference)):
                started = time.perf_counter()
                result = transcribe_audio(decoder, audio, options)
                seconds[side] += time.perf_counter() - started
                errors, units, unit = score(clip.reference, result.text, clip.language, normalisers)
                row[side] = {
                    "text": result.text,
                    "errors": errors,
                    "units": units,
                    "detected_language": result.info.language,
                    "skipped": [s.reason for s in result.info.skipped],
                }
                row["unit"] = unit
            records.append(row)
            print(f"{model:8s} {clip.id:32s} ours {row['ours']['errors']:3d}  ref {row['ctranslate2']['errors']:3d}"
                  f"  / {row['ours']['units']} {unit}s", file=sys.stderr, flush=True)
        records.append({"model": model, "seconds": seconds, "provider": ours.runtime.provider})

    print(render_markdown(records, args))
    if args.json:
        args.json.write_text(json.dumps(records, indent=1, ensure_ascii=False), encoding="utf-8")
    return 0


def _rate(errors: int, units: int) -> str:
    return f"{100.0 * errors / units:.1f}" if units else "-"


def render_markdown(records: list[dict], args) -> str:
    lines = [
        f"Run {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC on {platform.machine()} "
        f"({os.cpu_count()} CPUs), language {args.language}; our runtime on {args.device}.",
        "",
        "| model | recording | lang | detected (ours / ref) | unit | ours % | ctranslate2 % | identical text |",
        "|---|---|---|---|---|---:|---:|:---:|",
    ]
    totals: dict[tuple[str, str], list[int]] = {}
    for r in records:
        if "clip" not in r:
            continue
        o, c = r["ours"], r["ctranslate2"]
        same = "yes" if o["text"] == c["text"] else "no"
        detected = f"{o['detected_language']} / {c['detected_language']}"
        lines.append(f"| {r['model']} | {r['clip']} | {r['language']} | {detected} | {r['unit']} | {_rate(o['errors'], o['units'])} "
                     f"| {_rate(c['errors'], c['units'])} | {same} |")
        t = totals.setdefault((r["model"], r["language"]), [0, 0, 0, 0])
        t[0] += o["errors"]
        t[1] += c["errors"]
        t[2] += o["units"]
        t[3] += int(same == "yes")
    lines += ["", "| model | language | pooled ours % | pooled ctranslate2 % | difference (points) | identical texts |",
              "|---|---|---:|---:|---:|---:|"]
    for (model, group), (ours_e, ref_e, units, same) in totals.items():
        n = sum(1 for r in records if r.get("model") == model and "clip" in r and r["language"] == group)
        lines.append(f"| {model} | {group} | {_rate(ours_e, units)} | {_rate(ref_e, units)} | "
                     f"{100.0 * (ours_e - ref_e) / units:+.2f} | {same}/{n} |")
    for r in records:
        if "seconds" in r:
            s = r["seconds"]
            lines.append(f"\n{r['model']}: ours ({r['provider']}) {s['ours']:.1f} s, ctranslate2 (CPU) "
                         f"{s['ctranslate2']:.1f} s for all its recordings (shared machine; informative only).")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
