"""The rules kernel (models/rules_kernel.py) on CUDA against the CuPy array code it replaces and
the NumPy specification (``LogitRules``): the same masks, tokens and row states on hard random
logits, and the same words on every recording of the set in use.

Log-probabilities may differ in the last ulps (the kernel sums in float64 in its own order, CuPy
in float32 in another): within 1e-5 per token. tests/models/test_rules_kernel_cpu.py runs the
same source on the CPU. Run on the H200:

    PYTHONPATH=src:/tmp/site:/tmp/stage/ortsite:/tmp/stage python -m pytest -q tests/gpu/test_rules_kernel.py
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from captioner.errors import UserError
from captioner.gpu.backend import get_backend
from captioner.gpu.features_ref import whisper_input_features
from captioner.models import rules_kernel
from captioner.models.decoding import (
    DecodingOptions,
    LogitRules,
    _token_logprobs,
    decode,
)
from captioner.models.device_rules import KERNEL_ENV, DeviceRules
from captioner.models.registry import resolve_model
from captioner.models.tokenizer import WhisperTokenizer

pytestmark = pytest.mark.gpu

LOGPROB_ATOL = 1e-5
GREEDY = DecodingOptions(temperatures=(0.0,))
VARIANTS = {
    "default": DecodingOptions(),
    "no_timestamps": DecodingOptions(without_timestamps=True),
    "no_blank_rule": DecodingOptions(suppress_blank=False, suppress_tokens=False),
    "initial_0s": DecodingOptions(max_initial_timestamp_s=0.0),
    "initial_0.4s": DecodingOptions(max_initial_timestamp_s=0.4),
}


@pytest.fixture(scope="module")
def backend():
    backend = get_backend("cuda")
    backend.use()
    return backend


@pytest.fixture(scope="module", params=["tiny.en", "base"])
def tok(request) -> WhisperTokenizer:
    """Both vocabularies: English-only (51,864 tokens) and multilingual (51,865, an odd row stride)."""
    try:
        files = resolve_model(request.param)
    except UserError as error:
        pytest.skip(f"{request.param} is not installed here: {error}")
    return WhisperTokenizer(files.tokenizer_path, files.config_path, n_vocab=files.dims.n_vocab)


def hard_logits(tok, rng, batch: int) -> np.ndarray:
    """Rows all -inf, rows of exact ties, timestamp-heavy rows, rows where the timestamps' mass
    test can go either way, a timestamp / the end / a text token far ahead, and a tie at the top
    between a text token and a timestamp (the text token, the lower column, wins)."""
    ts, n_vocab = tok.timestamp_begin, tok.n_vocab
    logits = rng.normal(0, 1, (batch, n_vocab)).astype(np.float32)
    for b in range(batch):
        kind = rng.integers(0, 9)
        if kind == 0:
            logits[b] = -np.inf
        elif kind == 1:
            logits[b] = rng.integers(-2, 2, n_vocab).astype(np.float32)
        elif kind == 2:
            logits[b, ts:] += np.float32(rng.uniform(0, 4))
        elif kind == 3:
            logits[b, :ts] -= 3.0
            logits[b, rng.integers(0, tok.eot)] += np.float32(rng.uniform(2, 12))
        elif kind == 4:
            logits[b, ts + rng.integers(0, n_vocab - ts)] += 12.0
        elif kind == 5:
            logits[b, rng.integers(0, tok.eot)] += 12.0
        elif kind == 6 and rng.random() < 0.3:
            logits[b, tok.eot] += 12.0
        elif kind == 7:
            top = np.float32(logits[b].max() + 5.0)
            logits[b, rng.integers(0, tok.eot)] = top
            logits[b, ts + rng.integers(0, 50)] = top
    return logits


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_kernel_equals_the_array_code_on_random_logits(backend, tok, variant):
    """64 rows, up to 60 steps: at every step the kernel masks what the CuPy array code masks
    (and ``LogitRules`` on the live rows), picks the same tokens, the same log-probabilities
    within 1e-5, and leaves the same row state after its fused step; some rows hit their
    length limit now and then."""
    xp = backend.xp
    options = VARIANTS[variant]
    rng = np.random.default_rng(21)
    batch = 64
    spec = LogitRules(tok, options, tok.n_vocab)
    array = DeviceRules(xp, tok, options, tok.n_vocab, kernel=False)
    kernel = DeviceRules(xp, tok, options, tok.n_vocab, kernel=True)
    a_state, k_state = array.new_state(batch), kernel.new_state(batch)
    sampled: list[list[int]] = [[] for _ in range(batch)]
    done = np.zeros(batch, dtype=bool)
    forced = all_inf = 0
    with np.errstate(divide="ignore", invalid="ignore"):
        for step in range(60):
            raw = hard_logits(tok, rng, batch)
            live = ~done
            want = raw.copy()
            spec.apply(want, sampled, active=live)
            masked_a, masked_k = xp.asarray(raw), xp.asarray(raw)
            array.apply(masked_a, a_state)
            kernel.apply(masked_k, k_state)
            np.testing.assert_array_equal(masked_k.get(), masked_a.get())
            np.testing.assert_array_equal(masked_k.get()[live], want[live])

            tokens_a, logprobs_a = (a.get() for a in array.choose(xp.asarray(raw), a_state))
            tokens_k, logprobs_k = (a.get() for a in kernel.choose(xp.asarray(raw), k_state))
            np.testing.assert_array_equal(tokens_k, tokens_a)
            np.testing.assert_array_equal(tokens_k[live], np.argmax(want, axis=-1)[live])
            np.testing.assert_allclose(logprobs_k, logprobs_a, rtol=0, atol=LOGPROB_ATOL, equal_nan=True)
            np.testing.assert_allclose(logprobs_k[live], _token_logprobs(want, tokens_a)[live], rtol=0,
                                       atol=LOGPROB_ATOL, equal_nan=True)

            last_step = np.zeros(batch, dtype=bool)
            if step % 9 == 8:
                last_step[rng.random(batch) < 0.3] = True
            both = kernel.choose_and_advance(xp.asarray(raw), k_state, last_step)
            np.testing.assert_array_equal(both[0], tokens_a.astype(np.float64))
            array.advance(a_state, xp.asarray(tokens_a), xp.asarray(last_step))
            for name in ("n", "last", "before_last", "last_timestamp", "active"):
                np.testing.assert_array_equal(getattr(k_state, name).get(), getattr(a_state, name).get(), err_msg=name)

            forced += int(np.isneginf(want[live, : tok.timestamp_begin]).all(axis=-1).sum())
            all_inf += int(np.isneginf(raw).all(axis=-1).sum())
            for b in np.flatnonzero(live):
                if tokens_a[b] == tok.eot or last_step[b]:
                    done[b] = True
                if tokens_a[b] != tok.eot:
                    sampled[b].append(int(tokens_a[b]))
            if done.all():
                break
    assert all_inf > 0 and max(len(s) for s in sampled) > 3
    if not options.without_timestamps:
        assert forced > 0


@pytest.mark.parametrize("batch", [1, 7, 257])
def test_kernel_at_odd_batch_sizes(backend, tok, batch):
    """One block per row and the state kernel's blocks of 128 rows: one row, a few, and 257
    (three state blocks, the last with one row), first steps and later ones, some rows ending."""
    xp = backend.xp
    rng = np.random.default_rng(batch)
    array = DeviceRules(xp, tok, GREEDY, tok.n_vocab, kernel=False)
    kernel = DeviceRules(xp, tok, GREEDY, tok.n_vocab, kernel=True)
    a_state, k_state = array.new_state(batch), kernel.new_state(batch)
    with np.errstate(divide="ignore", invalid="ignore"):
        for _ in range(6):
            raw = hard_logits(tok, rng, batch)
            last_step = rng.random(batch) < 0.1
            want = array.choose_and_advance(xp.asarray(raw), a_state, last_step)
            tokens, logprobs = kernel.choose(xp.asarray(raw), k_state)
            kernel.advance(k_state, tokens, xp.asarray(last_step))  # the state kernel alone, a device mask
            np.testing.assert_array_equal(tokens.get(), want[0].astype(np.int64))
            np.testing.assert_allclose(logprobs.get(), want[1], rtol=0, atol=LOGPROB_ATOL, equal_nan=True)
            for name in ("n", "last", "before_last", "last_timestamp", "active"):
                np.testing.assert_array_equal(getattr(k_state, name).get(), getattr(a_state, name).get(), err_msg=name)


def test_rows_at_the_initial_timestamp_limit(backend, tok):
    """First tokens: the latest allowed first timestamp is the best one left, a better one just
    after it is masked; the kernel picks the limit."""
    xp = backend.xp
    options = DecodingOptions(max_initial_timestamp_s=0.4)
    kernel = DeviceRules(xp, tok, options, tok.n_vocab, kernel=True)
    array = DeviceRules(xp, tok, options, tok.n_vocab, kernel=False)
    logits = np.random.default_rng(3).normal(0, 1, (6, tok.n_vocab)).astype(np.float32)
    logits[:, kernel.max_initial] += 20.0
    logits[:, kernel.max_initial + 1] += 30.0
    tokens_k, logprobs_k = kernel.choose(xp.asarray(logits), kernel.new_state(6))
    tokens_a, logprobs_a = array.choose(xp.asarray(logits), array.new_state(6))
    assert (tokens_k.get() == kernel.max_initial).all()
    np.testing.assert_array_equal(tokens_k.get(), tokens_a.get())
    np.testing.assert_allclose(logprobs_k.get(), logprobs_a.get(), rtol=0, atol=LOGPROB_ATOL)


def test_the_kernel_is_compiled_once_per_device(backend, tok):
    xp = backend.xp
    first, why = rules_kernel.compiled(xp)
    assert first is not None, why
    assert rules_kernel.compiled(xp)[0] is first
    assert DeviceRules(xp, tok, GREEDY, tok.n_vocab).kernels is first


def test_the_switch_turns_the_kernel_off(backend, tok, monkeypatch):
    monkeypatch.setenv(KERNEL_ENV, "0")
    assert not DeviceRules(backend.xp, tok, GREEDY, tok.n_vocab).uses_kernel
    monkeypatch.delenv(KERNEL_ENV)
    assert DeviceRules(backend.xp, tok, GREEDY, tok.n_vocab).uses_kernel


@pytest.fixture(scope="module")
def model(backend):
    from captioner.models.runtime import load_runtime

    runtime = load_runtime("tiny.en", device=backend.name)
    tokenizer = WhisperTokenizer(runtime.files.tokenizer_path, runtime.files.config_path, n_vocab=runtime.n_vocab)
    return runtime, tokenizer


@pytest.fixture(scope="module")
def windows(speech_audio):
    ids = sorted(speech_audio)
    mel = np.stack([np.asarray(whisper_input_features(speech_audio[c][:480_000], 80), dtype=np.float32) for c in ids])
    return ids, mel


class Twin:
    """Stands in for ``DeviceRules`` inside decoding: every greedy step runs the array code on a
    copy of the step's logits, then the kernel on the logits themselves, each on its own row
    state, and holds them to the same tokens, log-probabilities (1e-5) and states. So both read
    the very same logits, whatever the model does between two decodes."""

    steps = rows = 0

    def __init__(self, xp, tokenizer, options, n_vocab):
        self.xp = xp
        self.kernel = DeviceRules(xp, tokenizer, options, n_vocab, kernel=True)
        self.array = DeviceRules(xp, tokenizer, options, n_vocab, kernel=False)

    def new_state(self, batch, prefixes=None):
        return self.kernel.new_state(batch, prefixes), self.array.new_state(batch, prefixes)

    def take(self, state, rows):
        return self.kernel.take(state[0], rows), self.array.take(state[1], rows)

    def choose_and_advance(self, logits, state, last_step):
        want = self.array.choose_and_advance(logits.copy(), state[1], last_step)
        got = self.kernel.choose_and_advance(logits, state[0], last_step)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_allclose(got[1], want[1], rtol=0, atol=LOGPROB_ATOL)
        for name in ("n", "last", "before_last", "last_timestamp", "active"):
            np.testing.assert_array_equal(getattr(state[0], name).get(), getattr(state[1], name).get(), err_msg=name)
        Twin.steps += 1
        Twin.rows += len(got[0])
        return got


@pytest.fixture
def twin(monkeypatch):
    from captioner.models import decoding

    monkeypatch.setattr(decoding, "DeviceRules", Twin)
    Twin.steps = Twin.rows = 0
    return Twin


@pytest.mark.slow
def test_kernel_gives_the_array_codes_tokens_on_every_recording(backend, model, windows, twin):
    """Every recording of the set (first 30 s; German on tiny.en too), in batches of 16, greedy
    with Whisper's timestamp rules: at every step of every pass, kernel and array code choose the
    same tokens from the same logits. The words are those of the host path where it is compared
    (tests/gpu/test_device_decoding.py, which now runs the kernel)."""
    runtime, tokenizer = model
    xp = backend.xp
    ids, mel = windows
    decoded = []
    for first in range(0, len(ids), 16):
        decoded += decode(runtime, tokenizer, xp.asarray(mel[first:first + 16]), replace(GREEDY, decode_on="device"), xp=xp)
    assert len(decoded) == len(ids) and sum(len(w.tokens) for w in decoded) > 300
    assert twin.steps > 100 and twin.rows > 500  # finished rows leave the batch: 916 rows over 362 steps on the H200


@pytest.mark.slow
def test_kernel_with_prompts_and_temperature_fallback(backend, model, windows, twin):
    """Prompts of different lengths (one ragged pass, rows compacted as they finish) and the
    temperature fallback (greedy passes through the rules, sampling passes on the host): every
    greedy step the same from kernel and array code."""
    runtime, tokenizer = model
    xp = backend.xp
    ids, mel = windows
    keep = list(range(min(8, len(ids))))
    prompts = [tokenizer.encode(" The meeting began at noon, and then")[: (i % 4) * 3] for i in keep]
    options = DecodingOptions(logprob_threshold=-0.05, temperatures=(0.0, 0.5), best_of=2, sample_len=48,
                              decode_on="device")
    decoded = decode(runtime, tokenizer, xp.asarray(mel[keep]), options, xp=xp, previous_tokens=prompts)
    assert any(w.temperature > 0 for w in decoded), "the thresholds should make some windows fall back"
    assert twin.steps > 20
