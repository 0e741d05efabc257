"""The vectorised token rules (models/device_rules.py, what runs on the GPU with CuPy) against
their specification, ``LogitRules`` row by row, both on NumPy here: the same masks, tokens and
log-probabilities step by step on random logits, then the same tokens on real speech with
tiny.en (and base, which detects languages), with and without temperature fallback.

tests/gpu/test_device_decoding.py runs the same comparison with the rules on CUDA.
"""

from __future__ import annotations

import csv
import os
from dataclasses import replace

import numpy as np
import pytest
from graph_fixtures import load_cpu_decoder, onnx_cache_dir  # noqa: F401 - session fixture
from mel_helper import load_audio_16k, whisper_features

from captioner.models.decoding import DecodingOptions, LogitRules, _token_logprobs
from captioner.models.device_rules import DeviceRules
from captioner.models.registry import resolve_model
from captioner.models.tokenizer import WhisperTokenizer

SHIPPED = os.path.join(os.path.dirname(__file__), "..", "data", "speech")
GREEDY = DecodingOptions(temperatures=(0.0,))
RULE_VARIANTS = {
    "default": DecodingOptions(),
    "no_timestamps": DecodingOptions(without_timestamps=True),
    "no_blank_rule": DecodingOptions(suppress_blank=False, suppress_tokens=False),
    "initial_0s": DecodingOptions(max_initial_timestamp_s=0.0),
}


@pytest.fixture(scope="module")
def tok() -> WhisperTokenizer:
    files = resolve_model("base")
    return WhisperTokenizer(files.tokenizer_path, files.config_path, n_vocab=files.dims.n_vocab)


def _random_logits(tok, rng, batch: int) -> np.ndarray:
    """Logits that visit every rule: now and then timestamps (the mass test), the end token or
    one text token far ahead, so rows sample pairs, lone timestamps, text and endings."""
    logits = rng.normal(0, 1, (batch, tok.n_vocab)).astype(np.float32)
    ts = tok.timestamp_begin
    for b in range(batch):
        kind = rng.integers(0, 5)
        if kind == 0:
            logits[b, ts:] += np.float32(rng.uniform(0, 4))
        elif kind == 1:
            logits[b, ts + rng.integers(0, 1500)] += 12.0
        elif kind == 2:
            logits[b, rng.integers(0, tok.eot)] += 12.0
        elif kind == 3 and rng.random() < 0.2:
            logits[b, tok.eot] += 12.0
    return logits


@pytest.mark.parametrize("variant", sorted(RULE_VARIANTS))
def test_vectorised_rules_equal_the_row_by_row_rules(tok, variant):
    """A batch of 24 rows decoded for 60 steps from random logits by the specification; at every
    step the vectorised rules, given only the per-row state arrays, mask the same entries of the
    rows still decoding and choose the same tokens with the same log-probabilities."""
    options = RULE_VARIANTS[variant]
    rng = np.random.default_rng(12)
    batch = 24
    spec = LogitRules(tok, options, tok.n_vocab)
    rules = DeviceRules(np, tok, options, tok.n_vocab)
    state = rules.new_state(batch)
    sampled: list[list[int]] = [[] for _ in range(batch)]
    done = np.zeros(batch, dtype=bool)
    forced = 0
    for _step in range(60):
        raw = _random_logits(tok, rng, batch)
        want, got = raw.copy(), raw.copy()
        spec.apply(want, sampled, active=~done)
        tokens, logprobs = rules.choose(got, state)
        live = ~done
        np.testing.assert_array_equal(got[live], want[live])
        want_tokens = np.argmax(want, axis=-1)
        np.testing.assert_array_equal(tokens[live], want_tokens[live])
        np.testing.assert_array_equal(logprobs[live], _token_logprobs(want, want_tokens)[live])
        forced += int(np.sum(np.isneginf(want[live, : tok.timestamp_begin]).all(axis=-1)))
        for b in np.flatnonzero(live):
            if tokens[b] == tok.eot:
                done[b] = True
            else:
                sampled[b].append(int(tokens[b]))
        rules.advance(state, tokens, last_step=False)
        np.testing.assert_array_equal(state.active, ~done)
        np.testing.assert_array_equal(state.n, [len(s) for s in sampled])
        if done.all():
            break
    assert any(len(s) > 3 for s in sampled), "the walk should run long enough to test pairs"
    if not options.without_timestamps:
        assert forced > 0, "some steps should allow only timestamps"


def _shipped_rows() -> list[dict[str, str]]:
    with open(os.path.join(SHIPPED, "manifest.tsv"), newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def _shipped_windows(limit_s: float = 30.0) -> tuple[list[str], np.ndarray]:
    rows = _shipped_rows()
    ids, mels = [], []
    for row in rows:
        audio = load_audio_16k(os.path.join(SHIPPED, row["wav"]))
        for offset_s in (0.0, 30.0):  # the long readings give a second window
            piece = audio[int(offset_s * 16000):][: int(limit_s * 16000)]
            if len(piece) >= 16000:
                ids.append(f"{row['id']}@{offset_s:.0f}s")
                mels.append(whisper_features(piece))
    return ids, np.stack(mels)


@pytest.fixture(scope="module")
def tiny(onnx_cache_dir):  # noqa: F811
    return load_cpu_decoder("tiny.en", onnx_cache_dir)


def _assert_same(ids, host, device):
    assert len(host) == len(device) == len(ids)
    for clip, h, d in zip(ids, host, device):
        assert d.tokens == h.tokens, f"{clip}: {d.text!r} != {h.text!r}"
        assert d.sum_logprob == pytest.approx(h.sum_logprob, abs=1e-5), clip
        assert d.no_speech_prob == pytest.approx(h.no_speech_prob, abs=1e-6), clip
        assert (d.text, d.dropped, d.failures, d.temperature, d.language) == (h.text, h.dropped, h.failures, h.temperature, h.language)


@pytest.mark.slow
def test_device_rules_give_the_host_tokens_on_the_shipped_recordings(tiny):
    """Every recording in tests/data/speech (a second window of the long ones), in one batch,
    greedy with Whisper's timestamp rules: the same tokens, log-probabilities and verdicts."""
    ids, mel = _shipped_windows()
    host = tiny.decode(mel, replace(GREEDY, decode_on="host"))
    device = tiny.decode(mel, replace(GREEDY, decode_on="device"))
    _assert_same(ids, host, device)
    assert sum(len(w.tokens) for w in host) > 300


@pytest.mark.slow
def test_device_rules_with_prompts_and_temperature_fallback(tiny):
    """Previous-text prompts of different lengths (passes grouped by length) and Whisper's
    temperature fallback: greedy passes rule on the device, sampling passes on the host, and
    every window comes out as the host path has it (the sampling draws are the same)."""
    ids, mel = _shipped_windows()
    keep = [0, 3, 5, 9, 12]  # five windows keep the five samples per fallback affordable on the CPU
    ids, mel = [ids[i] for i in keep], mel[keep]
    prompts = [tiny.tokenizer.encode(" The meeting began at noon, and then")[: (i % 4) * 3] for i in range(len(ids))]
    # A log-probability threshold few windows pass makes them fall back; one sampling temperature,
    # two samples and 48 tokens at most keep it short on the CPU.
    options = DecodingOptions(logprob_threshold=-0.05, temperatures=(0.0, 0.5), best_of=2, sample_len=48)
    host = tiny.decode(mel, replace(options, decode_on="host"), previous_tokens=prompts)
    device = tiny.decode(mel, replace(options, decode_on="device"), previous_tokens=prompts)
    _assert_same(ids, host, device)
    assert any(w.temperature > 0 for w in host), "the thresholds should make some windows fall back"


@pytest.mark.slow
def test_device_rules_with_language_detection(onnx_cache_dir):  # noqa: F811
    """base (multilingual), languages detected from the language tokens' logits only."""
    base = load_cpu_decoder("base", onnx_cache_dir)
    ids, mel = _shipped_windows()
    keep = [i for i, clip in enumerate(ids) if clip.startswith(("de_", "zh_", "en_jfk"))]
    ids, mel = [ids[i] for i in keep], mel[keep]
    host = base.decode(mel, replace(GREEDY, decode_on="host"))
    device = base.decode(mel, replace(GREEDY, decode_on="device"))
    _assert_same(ids, host, device)
    assert {w.language for w in device} >= {"de", "zh", "en"}
    for h, d in zip(host, device):
        assert d.language_probs == h.language_probs


@pytest.mark.slow
def test_device_rules_on_the_full_speech_set(tiny, speech_clips):
    """The full set of recordings (../shared/speech) when present, one window each; those of
    tests/data/speech are compared by the test above (the same recordings, the same first
    window), so only the others are decoded here, and of the conversations the first of each
    collection (AMI, NOTSOFAR, the phone calls: more of them added a minute and no new rule)."""
    if not speech_clips.is_full:
        pytest.skip("needs the full set of recordings at ../shared/speech (or CAPTIONER_SPEECH_DIR)")
    shipped = {row["id"] for row in _shipped_rows()}
    collections = {}
    for clip in sorted(set(speech_clips) - shipped):
        collections.setdefault("_".join(clip.split("_")[:3]) if clip.startswith("en_spont_") else clip, clip)
    ids = sorted(collections.values())
    assert ids, "the full set has recordings beyond the shipped subset"
    mel = np.stack([whisper_features(load_audio_16k(speech_clips[c].wav)[:480_000]) for c in ids])
    host = tiny.decode(mel, replace(GREEDY, decode_on="host"))
    device = tiny.decode(mel, replace(GREEDY, decode_on="device"))
    _assert_same(ids, host, device)


def test_decode_on_must_be_known():
    with pytest.raises(ValueError, match="decode_on"):
        DecodingOptions(decode_on="gpu")
