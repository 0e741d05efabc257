"""The reference runtime: the same ``model.bin`` run by the ``ctranslate2`` package.

Tests and benchmarks compare our ONNX Runtime path with it (same features in, same greedy
tokens out; WER side by side). ``ctranslate2`` is a test dependency (the ``test`` extra), so it
is imported here only, lazily; the app never needs this module.

:class:`Ct2Decoder` has the same ``decode`` as :class:`~captioner.models.decoding.RuntimeDecoder`
and goes through the same fallback loop and guards, so a transcription run with either differs
only in the model runtime and its token rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from captioner.models.decoding import (
    N_TEXT_CTX,
    WINDOW_S,
    DecodedWindow,
    DecodingOptions,
    RawDecode,
    decode_with_fallback,
)
from captioner.models.tokenizer import TIME_PRECISION_S, WhisperTokenizer


def _ctranslate2():
    try:
        import ctranslate2  # noqa: PLC0415 - test dependency, loaded on use
    except ImportError as error:  # pragma: no cover - the test extra installs it
        raise RuntimeError("the reference runtime needs ctranslate2 (pip install 'captioner[test]')") from error
    return ctranslate2


def _vocabulary_file(model_paths: Sequence[Path], tokenizer_path: Path) -> tuple[str, bytes]:
    for folder in {p.parent for p in model_paths} | {tokenizer_path.parent}:
        for name in ("vocabulary.json", "vocabulary.txt"):
            if (folder / name).is_file():
                return name, (folder / name).read_bytes()
    raise FileNotFoundError(f"no vocabulary.json/.txt beside {model_paths[0]}")


def load_ct2_whisper(model_files, *, compute_type: str = "float32", intra_threads: int = 0):
    """A ``ctranslate2.models.Whisper`` for a registry ``ModelFiles`` (a split ``model.bin``
    is joined in memory; nothing is written)."""
    ct2 = _ctranslate2()
    paths = [Path(p) for p in model_files.model_paths]
    vocab_name, vocab_bytes = _vocabulary_file(paths, Path(model_files.tokenizer_path))
    files = {
        "model.bin": b"".join(p.read_bytes() for p in paths),
        "config.json": Path(model_files.config_path).read_bytes(),
        vocab_name: vocab_bytes,
    }
    return ct2.models.Whisper(
        str(paths[0].parent), device="cpu", compute_type=compute_type, intra_threads=intra_threads, files=files
    )


class Ct2Decoder:
    """Decodes windows with CTranslate2 (greedy; sampling with ``num_hypotheses`` for
    fallbacks), judged by our guards."""

    def __init__(self, model_files, tokenizer: WhisperTokenizer | None = None, *, intra_threads: int = 0):
        self.model = load_ct2_whisper(model_files, intra_threads=intra_threads)
        self.tokenizer = tokenizer or WhisperTokenizer(
            model_files.tokenizer_path, model_files.config_path, n_vocab=model_files.dims.n_vocab
        )
        self.n_mels = int(model_files.dims.n_mels)
        self.is_multilingual = self.tokenizer.is_multilingual
        self.name = f"{model_files.name} (ctranslate2)"

    def _features(self, mel):
        ct2 = _ctranslate2()
        return ct2.StorageView.from_array(np.ascontiguousarray(np.asarray(mel, dtype=np.float32)))

    def detect_language(self, mel) -> list[dict[str, float]]:
        results = self.model.detect_language(self._features(mel))
        return [{token[2:-2]: float(p) for token, p in row} for row in results]

    def generate(self, mel, prompts: list[list[int]], options: DecodingOptions, temperature: float = 0.0, num_hypotheses: int = 1):
        """``ctranslate2`` ``generate`` with Whisper's options as we apply them."""
        kwargs = dict(
            beam_size=1,
            return_scores=True,
            return_no_speech_prob=True,
            max_initial_timestamp_index=int(round(options.max_initial_timestamp_s / TIME_PRECISION_S)),
            suppress_blank=options.suppress_blank,
            suppress_tokens=[-1] if options.suppress_tokens else [],
            max_length=N_TEXT_CTX if options.sample_len is None else min(N_TEXT_CTX, 2 * options.sample_len),
        )
        if temperature > 0:
            kwargs.update(sampling_topk=0, sampling_temperature=temperature, num_hypotheses=num_hypotheses)
        return self.model.generate(self._features(mel), prompts, **kwargs)

    def decode(
        self,
        mel,
        options: DecodingOptions = DecodingOptions(),  # noqa: B008 - frozen: one shared default is safe
        *,
        previous_tokens: Sequence[Sequence[int]] | None = None,
        languages: Sequence[str | None] | None = None,
        window_s: Sequence[float] | float = WINDOW_S,
        prefixes: Sequence[Sequence[int]] | None = None,
    ) -> list[DecodedWindow]:
        """As :meth:`RuntimeDecoder.decode`; a forced prefix goes after the start tokens, where
        CTranslate2 takes it as the start of the text (its tokens come back, and its timestamp
        rules see them)."""
        tok = self.tokenizer
        mel = np.asarray(mel, dtype=np.float32)
        batch = int(mel.shape[0])
        detected: dict[int, dict[str, float]] = {}

        def decode_pass(rows, heads, langs, temperature, rng, forced):
            # Samples of one window arrive as consecutive equal rows: generate each once.
            unique_rows = list(dict.fromkeys(rows))
            repeats = len(rows) // len(unique_rows)
            need = [b for b in unique_rows if b not in detected]
            if self.is_multilingual and need and any(lang is None for lang in langs):
                for b, probs in zip(need, self.detect_language(mel[need])):
                    detected[b] = probs
            prompts, chosen = [], []
            for i, b in enumerate(unique_rows):
                lang = langs[i * repeats]
                if self.is_multilingual and lang is None:
                    lang = next(iter(detected[b]))
                chosen.append(lang or "en")
                prompt = heads[i * repeats] + tok.sot_sequence(lang if self.is_multilingual else None, options.task)
                if options.without_timestamps:
                    prompt.append(tok.special.no_timestamps)
                prompts.append(prompt + list(forced[i * repeats]))
            if temperature > 0:
                _ctranslate2().set_random_seed(int(rng.integers(2**31)))
            results = self.generate(mel[unique_rows], prompts, options, temperature, repeats)
            raws: list[RawDecode] = []
            for i, (b, result) in enumerate(zip(unique_rows, results)):
                for seq, score in zip(result.sequences_ids, result.scores):
                    # ctranslate2 scores are the summed log probs (end token included) over the length.
                    n = len(seq)
                    # An empty hypothesis has no length to undo: its sum is unknown, call it 0.
                    total = float(score) * n if n else 0.0
                    limit = N_TEXT_CTX // 2 if options.sample_len is None else options.sample_len
                    probs = detected.get(b) if langs[i * repeats] is None and self.is_multilingual else None
                    raws.append(RawDecode(list(seq), total, float(result.no_speech_prob), chosen[i], probs, n >= limit,
                                          forced=len(forced[i * repeats])))
            return raws

        return decode_with_fallback(
            decode_pass, tok, batch, options,
            previous_tokens=previous_tokens, languages=languages, window_s=window_s, prefixes=prefixes,
        )
