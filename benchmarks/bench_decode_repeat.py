"""Is the decoder reproducible? The same batch of windows decoded several times in one process:
per call and row, whether every word, time, attention frame and probability came out as the
first call's, and the largest difference of a word's probability.

The batch is tests/gpu/test_encoder_windows_cuda.py's mixed one: four recordings of 3-11 s and a
40 s window built from them, attention asked for, host decoding (``--decode-on``).

    python benchmarks/bench_decode_repeat.py --device cpu
    python3 benchmarks/bench_decode_repeat.py --device cuda:0 --repeats 6 --out repeat.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf

from word_times import load_manifest

MIXED = ("en_ls_1089-134686-0001", "en_jfk_inaugural_excerpt", "en_ls_7902-96591-0000", "en_ljspeech_LJ001-0001")


def _key(hypothesis) -> list[tuple]:
    return [(w.text, round(w.start_s, 6), round(w.end_s, 6), w.attend_s, w.confidence) for w in hypothesis.words]


def run(device: str, repeats: int, decode_on: str) -> dict:
    from captioner.engine.recognizer import WindowRequest
    from captioner.engine.whisper import WhisperRecognizer
    from captioner.gpu.backend import get_backend
    from captioner.gpu.features_ref import log_mel_spectrogram
    from captioner.models.runtime import load_runtime
    from captioner.models.tokenizer import WhisperTokenizer

    backend = get_backend(device)
    backend.use()
    runtime = load_runtime("tiny.en", device=backend.name, encoder_windows_s=(10.0, 20.0))
    tokenizer = WhisperTokenizer(runtime.files.tokenizer_path, runtime.files.config_path, n_vocab=runtime.n_vocab)
    recognizer = WhisperRecognizer(runtime, tokenizer, xp=backend.xp, decode_on=decode_on,
                                   synchronize=backend.synchronize if backend.is_cuda else None)
    clips = {c["id"]: c for c in load_manifest()}
    missing = [c for c in MIXED if c not in clips]
    if missing:
        raise SystemExit(f"bench_decode_repeat: the speech set lacks {', '.join(missing)}")
    mels = [log_mel_spectrogram(sf.read(clips[c]["path"], dtype="float32")[0], 80) for c in MIXED]
    windows = mels + [np.concatenate(mels + mels, axis=1)[:, :4000]]
    requests = [WindowRequest(f"s{i}", backend.xp.asarray(m), 0.5 * i, "", None, alignment=True)
                for i, m in enumerate(windows)]
    first = recognizer.decode(requests)
    calls = []
    for _ in range(repeats):
        again = recognizer.decode(requests)
        diffs = [abs((x.confidence or 0.0) - (y.confidence or 0.0))
                 for a, b in zip(first, again) for x, y in zip(a.words, b.words)]
        calls.append({"rows_identical": [_key(a) == _key(b) for a, b in zip(first, again)],
                      "words_differ": [[w.text for w in a.words] != [w.text for w in b.words] for a, b in zip(first, again)],
                      "max_probability_difference": max(diffs, default=0.0)})
    return {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "device": backend.name,
            "device_name": getattr(recognizer, "device_name", ""), "provider": runtime.provider,
            "decode_on": decode_on, "command": " ".join(sys.argv), "windows": [*MIXED, "40 s of them"],
            "calls": calls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--decode-on", default="host", choices=("host", "device"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = run(args.device, args.repeats, args.decode_on)
    for k, call in enumerate(result["calls"]):
        print(f"call {k + 1}: rows identical {call['rows_identical']}, "
              f"max probability difference {call['max_probability_difference']:.2e}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
