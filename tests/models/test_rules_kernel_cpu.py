"""The rules kernel's CUDA source (models/rules_kernel.py) run on the CPU, against the array code.

No GPU here, so the very text NVRTC compiles on CUDA is compiled with the host C++ compiler under
the prelude of tests/cuda_host.py, which plays the GPU's part (a fiber per CUDA thread, barriers
for ``__syncthreads`` and the warp shuffles).
``DeviceRules`` then launches it through its own kernel path (the same argument tuples CuPy
gets, NumPy arrays standing in for device arrays), so what is checked is the kernel's algorithm
and indexing, its reductions across warps and the Python that launches it. Float results differ
from the array code only by summation order: log-probabilities within 1e-5 (absolute).

tests/gpu/test_rules_kernel.py checks the compiled kernel itself on CUDA.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from graph_fixtures import load_cpu_decoder, onnx_cache_dir  # noqa: F401 - session fixture
from test_device_rules import _assert_same, _shipped_windows

import cuda_host
from captioner.models import rules_kernel
from captioner.models.decoding import DecodingOptions, LogitRules, _token_logprobs
from captioner.models.device_rules import DeviceRules
from captioner.models.registry import resolve_model
from captioner.models.tokenizer import WhisperTokenizer

LOGPROB_ATOL = 1e-5
"""Float32 log-probabilities of the chosen tokens: the kernel sums exp() terms in float64, NumPy
in float32 (pairwise); the two differ by NumPy's rounding, under 1e-6 on 51,864 terms."""


class HostKernels:
    """The kernels' source built for the CPU, with ``threads`` per block of the choosing kernel
    (the shipped block size is THREADS; a host build may use fewer, and its source says how many,
    so the choosing launch follows the build)."""

    def __init__(self, lib, threads: int):
        self.choose = cuda_host.HostKernel(lib, 0, threads)
        self.advance = cuda_host.HostKernel(lib, 1)


@pytest.fixture(scope="module")
def host_build(tmp_path_factory):
    """threads -> the kernels compiled for the host (g++ or clang++)."""
    cuda_host.compiler()
    built: dict[int, object] = {}

    def build(threads: int):
        if threads not in built:
            folder = tmp_path_factory.mktemp(f"rules_kernel_{threads}")
            built[threads] = cuda_host.build(folder, "rules_kernel_host", rules_kernel.kernel_source(threads),
                                             ["captioner_rules_choose", "captioner_rules_advance"])
        return HostKernels(built[threads], threads)

    return build


@pytest.fixture(scope="module")
def tok() -> WhisperTokenizer:
    files = resolve_model("base")
    return WhisperTokenizer(files.tokenizer_path, files.config_path, n_vocab=files.dims.n_vocab)


def hard_logits(tok, rng, batch: int) -> np.ndarray:
    """Random logits with the cases the kernel must get right: rows all -inf, rows of exact ties
    (the lowest column wins), rows where the timestamps' mass wins or nearly wins, one timestamp
    far ahead (pairs and lone timestamps follow), the end token, and a text token far ahead."""
    ts, n_vocab = tok.timestamp_begin, tok.n_vocab
    logits = rng.normal(0, 1, (batch, n_vocab)).astype(np.float32)
    for b in range(batch):
        kind = rng.integers(0, 9)
        if kind == 0:
            logits[b] = -np.inf
        elif kind == 1:  # ties everywhere: a few values only
            logits[b] = rng.integers(-2, 2, n_vocab).astype(np.float32)
        elif kind == 2:  # timestamps heavy
            logits[b, ts:] += np.float32(rng.uniform(0, 4))
        elif kind == 3:  # text strong enough that the mass test can go either way
            logits[b, :ts] -= 3.0
            logits[b, rng.integers(0, tok.eot)] += np.float32(rng.uniform(2, 12))
        elif kind == 4:
            logits[b, ts + rng.integers(0, n_vocab - ts)] += 12.0
        elif kind == 5:
            logits[b, rng.integers(0, tok.eot)] += 12.0
        elif kind == 6 and rng.random() < 0.3:
            logits[b, tok.eot] += 12.0
        elif kind == 7:  # a tie at the top between a text token and a timestamp
            top = np.float32(logits[b].max() + 5.0)
            logits[b, rng.integers(0, tok.eot)] = top
            logits[b, ts + rng.integers(0, 50)] = top
    return logits


class _SideBySide:
    """The array code and the kernel decoding the same random logits, each on its own state,
    and ``LogitRules`` (the specification) on the rows' token lists."""

    def __init__(self, tok, options, kernels, batch: int, seed: int):
        self.tok, self.batch = tok, batch
        self.rng = np.random.default_rng(seed)
        self.spec = LogitRules(tok, options, tok.n_vocab)
        self.array = DeviceRules(np, tok, options, tok.n_vocab, kernel=False)
        self.kernel = DeviceRules(np, tok, options, tok.n_vocab, kernel=kernels)
        assert self.kernel.uses_kernel and not self.array.uses_kernel
        self.a_state, self.k_state = self.array.new_state(batch), self.kernel.new_state(batch)
        self.sampled: list[list[int]] = [[] for _ in range(batch)]
        self.done = np.zeros(batch, dtype=bool)
        self.seen = {"forced": 0, "all_inf": 0, "ended_at_limit": 0}

    def step(self, last_step: np.ndarray) -> None:
        """One step: the same masked logits (kernel ``apply``), tokens, log-probabilities and row
        states (the kernel's fused ``choose_and_advance``, the array code's ``choose`` then
        ``advance``): two launches."""
        tok, array, kernel, live = self.tok, self.array, self.kernel, ~self.done
        raw = hard_logits(tok, self.rng, self.batch)
        want = raw.copy()
        self.spec.apply(want, self.sampled, active=live)
        masked_a, masked_k = raw.copy(), raw.copy()
        array.apply(masked_a, self.a_state)
        kernel.apply(masked_k, self.k_state)
        np.testing.assert_array_equal(masked_k, masked_a)
        np.testing.assert_array_equal(masked_k[live], want[live])

        tokens_a, logprobs_a = array.choose(raw.copy(), self.a_state)
        both = kernel.choose_and_advance(raw.copy(), self.k_state, last_step)
        tokens_k, logprobs_k = both[0].astype(np.int64), both[1].astype(np.float32)
        np.testing.assert_array_equal(tokens_k, tokens_a)
        np.testing.assert_array_equal(tokens_k[live], np.argmax(want, axis=-1)[live])
        np.testing.assert_allclose(logprobs_k, logprobs_a, rtol=0, atol=LOGPROB_ATOL, equal_nan=True)
        np.testing.assert_allclose(logprobs_k[live], _token_logprobs(want, tokens_a)[live], rtol=0,
                                   atol=LOGPROB_ATOL, equal_nan=True)
        array.advance(self.a_state, tokens_a, last_step)
        for name in ("n", "last", "before_last", "last_timestamp", "active"):
            np.testing.assert_array_equal(getattr(self.k_state, name), getattr(self.a_state, name), err_msg=name)

        self.seen["forced"] += int(np.isneginf(want[live, : tok.timestamp_begin]).all(axis=-1).sum())
        self.seen["all_inf"] += int(np.isneginf(raw).all(axis=-1).sum())
        for b in np.flatnonzero(live):
            if tokens_a[b] == tok.eot:
                self.done[b] = True
            else:
                self.sampled[b].append(int(tokens_a[b]))
                if last_step[b]:
                    self.done[b] = True
                    self.seen["ended_at_limit"] += 1
        np.testing.assert_array_equal(self.k_state.active, ~self.done)


def _walk(tok, options, kernels, *, batch: int, steps: int, seed: int, last_step_every: int = 0) -> dict[str, int]:
    """Up to ``steps`` steps side by side; every ``last_step_every``-th step some rows have
    reached their length limit. Returns what the walk met (forced rows, all -inf rows...)."""
    walk = _SideBySide(tok, options, kernels, batch, seed)
    with np.errstate(divide="ignore", invalid="ignore"):  # all -inf rows: NaN, as in NumPy
        for step in range(steps):
            last_step = np.zeros(batch, dtype=bool)
            if last_step_every and step % last_step_every == last_step_every - 1:
                last_step[walk.rng.random(batch) < 0.3] = True
            walk.step(last_step)
            if walk.done.all():
                break
    return {**walk.seen, "longest": max(len(s) for s in walk.sampled)}


VARIANTS = {
    "default": DecodingOptions(),
    "no_timestamps": DecodingOptions(without_timestamps=True),
    "no_blank_rule": DecodingOptions(suppress_blank=False, suppress_tokens=False),
    "initial_0s": DecodingOptions(max_initial_timestamp_s=0.0),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_kernel_source_on_the_cpu_equals_the_array_code(tok, host_build, variant):
    """96 threads a block (3 warps: the second reduction level sees lanes past the warps), 10
    rows, 20 steps of hard random logits, some rows at their last step now and then."""
    seen = _walk(tok, VARIANTS[variant], host_build(96), batch=10, steps=20, seed=5, last_step_every=6)
    assert seen["all_inf"] > 0 and seen["longest"] > 3
    if not VARIANTS[variant].without_timestamps:
        assert seen["forced"] > 0, "some steps should allow only timestamps"


def test_kernel_source_at_the_shipped_block_size(tok, host_build):
    """The block size CUDA runs (THREADS = 1024, 32 warps), on a few rows and steps."""
    kernels = host_build(rules_kernel.THREADS)
    seen = _walk(tok, DecodingOptions(), kernels, batch=4, steps=4, seed=8)
    assert kernels.choose.launches >= 4 * 2 and seen["longest"] >= 3


@pytest.mark.parametrize("last_step", ["none", "all", "rows"])
def test_advance_alone_equals_the_array_code(tok, host_build, last_step):
    """The state-only kernel (``advance`` after ``choose``), every way of saying which rows end:
    none, all (one bool), some (an array)."""
    kernel = DeviceRules(np, tok, DecodingOptions(), tok.n_vocab, kernel=host_build(32))
    array = DeviceRules(np, tok, DecodingOptions(), tok.n_vocab, kernel=False)
    rng = np.random.default_rng(11)
    batch = 300  # three blocks of the advance kernel's 128 threads
    k_state, a_state = kernel.new_state(batch), array.new_state(batch)
    ts, eot = tok.timestamp_begin, tok.eot
    for _ in range(4):
        tokens = np.where(rng.random(batch) < 0.5, rng.integers(0, eot, batch), rng.integers(ts, tok.n_vocab, batch))
        tokens[rng.random(batch) < 0.1] = eot
        ending = {"none": False, "all": True, "rows": rng.random(batch) < 0.2}[last_step]
        kernel.advance(k_state, tokens, ending)
        array.advance(a_state, tokens, ending)
        for name in ("n", "last", "before_last", "last_timestamp", "active"):
            np.testing.assert_array_equal(getattr(k_state, name), getattr(a_state, name), err_msg=name)
        if last_step != "all":
            assert k_state.active.any() and not k_state.active.all()


def test_rows_at_the_initial_timestamp_limit(tok, host_build):
    """First tokens only: the latest allowed first timestamp carries the row's best logit, the
    one after it a better one (masked); the kernel picks the limit, as the array code does."""
    options = DecodingOptions(max_initial_timestamp_s=0.4)
    kernel = DeviceRules(np, tok, options, tok.n_vocab, kernel=host_build(64))
    array = DeviceRules(np, tok, options, tok.n_vocab, kernel=False)
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 1, (6, tok.n_vocab)).astype(np.float32)
    logits[:, kernel.max_initial] += 20.0
    logits[:, kernel.max_initial + 1] += 30.0
    tokens_k, logprobs_k = kernel.choose(logits.copy(), kernel.new_state(6))
    tokens_a, logprobs_a = array.choose(logits.copy(), array.new_state(6))
    assert (tokens_k == kernel.max_initial).all()
    np.testing.assert_array_equal(tokens_k, tokens_a)
    np.testing.assert_allclose(logprobs_k, logprobs_a, rtol=0, atol=LOGPROB_ATOL)


def test_python_ints_would_not_reach_the_kernel(tok, host_build):
    """Every scalar the kernel path passes is a 32-bit int (CuPy passes a Python int as 64 bits,
    which the kernel's ``int`` parameters would misread): the host launcher refuses others."""
    kernels = host_build(32)
    rules = DeviceRules(np, tok, replace(DecodingOptions(), without_timestamps=True), tok.n_vocab, kernel=kernels)
    rules.choose(np.zeros((2, tok.n_vocab), np.float32), rules.new_state(2))
    with pytest.raises(TypeError, match="np.int32"):
        kernels.choose((1,), (32,), (np.zeros(1, np.float32), 5))


def test_the_kernel_is_refused_without_cuda(tok):
    """``kernel=True`` on NumPy says why it cannot be; the default quietly runs the array code."""
    with pytest.raises(RuntimeError, match="RawModule"):
        DeviceRules(np, tok, DecodingOptions(), tok.n_vocab, kernel=True)
    assert not DeviceRules(np, tok, DecodingOptions(), tok.n_vocab).uses_kernel


@pytest.mark.slow
def test_decoding_through_the_kernel_gives_the_host_tokens(host_build, onnx_cache_dir, monkeypatch):  # noqa: F811
    """Greedy decoding of five shipped windows with tiny.en on the CPU, its rules through the
    kernel's source (decoding.py's call, row compaction as rows finish, the state updated in
    place): the tokens, log-probabilities and verdicts of the host path (``LogitRules``)."""
    from captioner.models import decoding

    kernels = host_build(96)
    monkeypatch.setattr(decoding, "DeviceRules",
                        lambda xp, tokenizer, options, n_vocab: DeviceRules(xp, tokenizer, options, n_vocab, kernel=kernels))
    tiny = load_cpu_decoder("tiny.en", onnx_cache_dir)
    ids, mel = _shipped_windows()
    keep = [0, 3, 5, 9, 12]
    ids, mel = [ids[i] for i in keep], mel[keep]
    options = DecodingOptions(temperatures=(0.0,), sample_len=40)
    host = tiny.decode(mel, replace(options, decode_on="host"))
    device = tiny.decode(mel, replace(options, decode_on="device"))
    _assert_same(ids, host, device)
    assert kernels.choose.launches > 20 and sum(len(w.tokens) for w in host) > 100
