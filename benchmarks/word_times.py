"""Word end times of the reference transcripts, by forced alignment: the oracle of the latency
benchmark.

The reference text of each recording is aligned to its audio with CTranslate2's
``Whisper.align`` — dynamic time warping over the cross-attention of the model's alignment
heads (listed in its ``config.json``), the method of Whisper's word timestamps — and each
word's start and end are where the DTW path enters its first and leaves its last token
(20 ms steps). The path gives a pause to the word before it, so each word's end is then
pulled back to the last voiced 10 ms frame of its span (speech-band energy within 25 dB of the
recording's loud frames; the first run of voice when 200 ms of quiet splits the span): the end
of the sound, not the start of the next word. CTranslate2 is a test dependency that is not on every machine (the GPU host
lacks it), so results are cached in ``benchmarks/data/word_times_<model>.json``, keyed by
clip id; ``--realign`` recomputes them.

Run: ``python benchmarks/word_times.py [--model tiny.en] [--realign]``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WINDOW_SAMPLES = 480_000
TOKENS_PER_S = 50  # 1500 encoder positions per 30 s


def speech_dir() -> Path:
    """The recordings every benchmark reads: ``$CAPTIONER_SPEECH_DIR``, else the shared set
    beside the checkout, else the small set in tests/data/speech (as tests/conftest.py picks)."""
    override = os.environ.get("CAPTIONER_SPEECH_DIR")
    if override:
        return Path(override)
    shared = REPO.parent / "shared" / "speech"
    return shared if (shared / "manifest.tsv").exists() else REPO / "tests" / "data" / "speech"


def load_manifest() -> list[dict]:
    root = speech_dir()
    with (root / "manifest.tsv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    for r in rows:
        r["path"] = str(root / r["wav"])
        r["duration_s"] = float(r["duration_s"])
    return rows


def alignment_text(reference: str) -> str:
    # LibriSpeech and AMI references are upper case; Whisper aligns ordinary casing better.
    return reference.lower() if reference.isupper() else reference


def cache_path(model: str) -> Path:
    return HERE / "data" / f"word_times_{model.replace('/', '_')}.json"


def align_clip(ct2_model, tokenizer, audio: np.ndarray, text: str, n_mels: int) -> list[dict]:
    import ctranslate2

    from captioner.gpu.features_ref import whisper_input_features

    features = whisper_input_features(audio, n_mels)[None]
    tokens = tokenizer.encode(" " + text.strip())
    start = tokenizer.sot_sequence(None if not tokenizer.is_multilingual else "en", "transcribe") + [tokenizer.special.no_timestamps]
    n_frames = min(len(audio), WINDOW_SAMPLES) // 160
    result = ct2_model.align(ctranslate2.StorageView.from_array(np.ascontiguousarray(features)), start, [tokens], n_frames)[0]
    pairs = np.array(result.alignments)
    text_index, time_index = pairs[:, 0], pairs[:, 1]
    # The DTW path moves to token i at the first pair whose text index is i.
    jumps = np.concatenate([[True], np.diff(text_index) > 0])
    token_start_s = time_index[jumps] / TOKENS_PER_S  # one entry per token, plus the end token
    words: list[dict] = []
    current: list[int] = []
    first_token = 0
    pieces = [tokenizer.decode([t]) for t in tokens]
    for i, piece in enumerate(pieces + [" "]):
        if (piece.startswith(" ") or i == len(pieces)) and current:
            end_index = min(i, len(token_start_s) - 1)
            words.append({
                "word": tokenizer.decode(current).strip(),
                "start_s": float(token_start_s[first_token]),
                "end_s": float(token_start_s[end_index]),
            })
            current = []
            first_token = i
        if i < len(pieces):
            current.append(tokens[i])
    return _trim_to_voice(words, audio)


def _trim_to_voice(words: list[dict], audio: np.ndarray) -> list[dict]:
    from captioner.engine.vad import band_energy_db, speech_band
    from captioner.gpu.features_ref import log_mel_spectrogram

    energy = band_energy_db(np, log_mel_spectrogram(audio), speech_band(80))
    voiced = energy > np.percentile(energy, 95) - 25.0
    for w in words:
        first, last = int(w["start_s"] * 100), min(len(voiced), int(round(w["end_s"] * 100)))
        frames = np.flatnonzero(voiced[first:last])
        if not frames.size:
            continue
        # Runs of voice separated by 200 ms of quiet: the word is the first substantial run
        # (a pause, and the next word's onset the path gave to this word, come after it).
        breaks = np.flatnonzero(np.diff(frames) > 20)
        runs = np.split(frames, breaks + 1)
        run = next((r for r in runs if r.size >= 5), runs[0])
        w["end_s"] = max(w["start_s"], min(w["end_s"], (first + run[-1] + 1) / 100))
    return words


def compute_word_times(model: str, max_duration_s: float = 30.0, language: str = "en") -> dict:
    import soundfile as sf

    from captioner.models.ct2_oracle import load_ct2_whisper
    from captioner.models.registry import resolve_model
    from captioner.models.tokenizer import WhisperTokenizer

    files = resolve_model(model)
    tokenizer = WhisperTokenizer(files.tokenizer_path, files.config_path, n_vocab=int(files.dims.n_vocab))
    ct2_model = load_ct2_whisper(files)
    out = {}
    for clip in load_manifest():
        if clip["language"] != language or clip["duration_s"] > max_duration_s:
            continue
        audio, rate = sf.read(clip["path"], dtype="float32")
        assert rate == 16_000, clip["id"]
        out[clip["id"]] = align_clip(ct2_model, tokenizer, audio, alignment_text(clip["reference"]), files.dims.n_mels)
        print(f"{clip['id']}: {len(out[clip['id']])} words", file=sys.stderr)
    return out


def word_times(model: str, realign: bool = False) -> dict:
    """Clip id -> [{word, start_s, end_s}], from the cache or computed (needs ctranslate2)."""
    path = cache_path(model)
    if path.exists() and not realign:
        return json.loads(path.read_text(encoding="utf-8"))
    data = compute_word_times(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--realign", action="store_true")
    args = parser.parse_args()
    data = word_times(args.model, args.realign)
    print(f"{len(data)} clips, {sum(len(v) for v in data.values())} words -> {cache_path(args.model)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
