"""Fixtures for the model-graph tests (imported by them): packaged Whisper models, a private ONNX cache."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import onnx
import pytest

from captioner.models import onnx_export, onnx_graphs, session
from captioner.models.registry import resolve_model
from captioner.models.runtime import WhisperRuntime
from onnx_cache import session_cache_dir

CPU = session.ProviderChoice(session.CPU, None, "cpu")


@pytest.fixture(scope="session")
def tiny_files():
    return resolve_model("tiny.en")


@pytest.fixture(scope="session")
def base_files():
    return resolve_model("base")


@pytest.fixture(scope="session")
def tiny_tok(tiny_files):
    from captioner.models.tokenizer import WhisperTokenizer

    return WhisperTokenizer(tiny_files.tokenizer_path, tiny_files.config_path, n_vocab=tiny_files.dims.n_vocab)


@pytest.fixture(scope="session")
def onnx_cache_dir(tmp_path_factory):
    """One ONNX cache for the whole session, so each model is converted once per test run
    (the same folder in every module that imports this fixture: :mod:`onnx_cache`)."""
    return session_cache_dir(tmp_path_factory)


@pytest.fixture()
def private_cache(onnx_cache_dir, monkeypatch):
    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(onnx_cache_dir))
    return onnx_cache_dir


def load_cpu_decoder(name: str, cache_dir):
    """The offline decoder of model ``name`` on the CPU, its ONNX graphs in ``cache_dir``."""
    from captioner.engine.offline import load_decoder

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CAPTIONER_CACHE_DIR", str(cache_dir))
        return load_decoder(name, "cpu")


def fixed_cache_graphs(files, fused: bool, alignment_heads=()) -> dict[str, onnx.ModelProto]:
    """The fp32 graphs of the fixed-cache decoder (the ones CUDA runs as captured graphs), by
    file name: plain MatMul attention or ``fused`` (ONNX Runtime's MultiHeadAttention), the
    step and prefill with the alignment heads' cross-attention output when given."""
    weights = files.open_weights()
    try:
        d = files.dims
        return {
            "encoder": onnx_graphs.build_encoder(weights, d, np.float32, fused_attention=fused),
            "cross_kv": onnx_graphs.build_cross_kv(weights, d, np.float32, fused_attention=fused),
            "decoder_step": onnx_graphs.build_decoder_step(weights, d, np.float32, fused_attention=fused,
                                                           alignment_heads=alignment_heads),
            "decoder_prefill": onnx_graphs.build_decoder_prefill(weights, d, np.float32, fused_attention=fused,
                                                                 alignment_heads=alignment_heads),
        }
    finally:
        weights.close()


def save_graphs(graphs: dict[str, onnx.ModelProto], folder) -> None:
    for name, graph in graphs.items():
        onnx.save_model(graph, str(folder / f"{name}.onnx"))


@dataclass
class Runtimes:
    fixed: WhisperRuntime  # fixed cache, prompts prefilled in one run
    replay: WhisperRuntime  # fixed cache without the prefill graph: prompts fed one step per token
    concat: WhisperRuntime  # the concatenating decoder (the CPU's, exact against CTranslate2): the reference


_REFERENCE_FOLDERS: dict[str, object] = {}
"""A model's hash (its weights) -> its folder of concatenating fp32 graphs, found once a test session."""


def reference_graphs(files, tmp_path_factory):
    """The folder of ``files``' concatenating fp32 graphs (the CPU's, exact against
    CTranslate2): the session's private cache (``onnx_cache_dir``), built there the first time
    a test session asks for them (here or by any CPU model test) and shared after that: every
    fixed-cache variant and test module compares with the same graphs."""
    key = onnx_export.model_hash(files)
    folder = _REFERENCE_FOLDERS.get(key)
    if folder is None:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("CAPTIONER_CACHE_DIR", str(session_cache_dir(tmp_path_factory)))
            folder = onnx_export.ensure_onnx(files, "fp32").folder
        _REFERENCE_FOLDERS[key] = folder
    return folder


_REFERENCE_RUNTIMES: dict[str, WhisperRuntime] = {}
"""A model's hash -> the concatenating runtime on its reference graphs, opened once a session."""


def reference_runtime(files, tmp_path_factory) -> WhisperRuntime:
    """The concatenating fp32 CPU runtime on :func:`reference_graphs`, opened once a test
    session and shared by every module that compares with it (it keeps no decoding state
    between calls: each ``start`` makes its own)."""
    key = onnx_export.model_hash(files)
    runtime = _REFERENCE_RUNTIMES.get(key)
    if runtime is None:
        folder = reference_graphs(files, tmp_path_factory)
        runtime = _REFERENCE_RUNTIMES[key] = WhisperRuntime(files, CPU, onnx_export.OnnxFiles(folder, "fp32", built=True))
    return runtime


_FIXED_CACHE_FOLDERS: dict[tuple, tuple] = {}
"""(model hash, variant, heads) -> the folders of its fixed-cache graphs, built once a test session."""


def fixed_cache_folders(files, tmp_path_factory, variant: str, alignment_heads=()):
    """The fixed-cache fp32 graphs of ``variant`` ("matmul" or "fused"), built the first time a
    test session asks and shared after that (the fixed-cache, ragged-batch and alignment tests
    open their own runtimes on them): (the folder without ``decoder_prefill.onnx``, where a
    prompt is fed one captured step per token; the folder with it, the same files hard-linked)."""
    key = (onnx_export.model_hash(files), variant, repr(alignment_heads))
    folders = _FIXED_CACHE_FOLDERS.get(key)
    if folders is None:
        graphs = fixed_cache_graphs(files, variant == "fused", alignment_heads)
        prefill = graphs.pop("decoder_prefill")
        without_prefill = tmp_path_factory.mktemp(f"{variant}-no-prefill")
        save_graphs(graphs, without_prefill)
        with_prefill = tmp_path_factory.mktemp(variant)
        for path in without_prefill.iterdir():
            os.link(path, with_prefill / path.name)
        save_graphs({"decoder_prefill": prefill}, with_prefill)
        folders = _FIXED_CACHE_FOLDERS[key] = (without_prefill, with_prefill)
    return folders


def fixed_cache_runtimes(files, tmp_path_factory, variant: str, alignment_heads=()) -> Runtimes:
    """The three fp32 CPU runtimes the fixed-cache tests compare; ``variant`` is "matmul" or
    "fused" (the attention of the fixed-cache graphs). The fixed-cache runtimes are the
    caller's own (tests count their passes and buffers); the graphs and the concatenating
    reference are shared within the session."""
    without_prefill, with_prefill = fixed_cache_folders(files, tmp_path_factory, variant, alignment_heads)
    replay = WhisperRuntime(files, CPU, onnx_export.OnnxFiles(without_prefill, "fp32", built=True), fixed_cache=True)
    fixed = WhisperRuntime(files, CPU, onnx_export.OnnxFiles(with_prefill, "fp32", built=True), fixed_cache=True)
    assert replay.prefill_model is None and fixed.prefill_model is not None
    return Runtimes(fixed, replay, reference_runtime(files, tmp_path_factory))


def greedy_continue(rt, logits, state, limit: int) -> list[int]:
    """Plain greedy decoding after ``rt.start``: the model's suppression lists (the "begin" list at
    the first step only), argmax, until end-of-text or ``limit`` tokens. The simplest decoder both
    runtimes can be compared with, token for token."""
    suppress = np.array(rt.suppress_ids)
    suppress_begin = np.array(rt.suppress_ids_begin)
    tokens: list[int] = []
    while len(tokens) < limit:
        row = logits[0].copy()
        row[suppress] = -np.inf
        if not tokens:
            row[suppress_begin] = -np.inf
        token = int(row.argmax())
        if token == rt.special.eot:
            break
        tokens.append(token)
        logits = rt.step(state, np.array([token]))
    return tokens
