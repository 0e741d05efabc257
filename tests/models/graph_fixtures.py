"""Fixtures for the model-graph tests (imported by them): packaged Whisper models, a private ONNX cache."""

from __future__ import annotations

import numpy as np
import pytest

from captioner.models.registry import resolve_model


@pytest.fixture(scope="session")
def tiny_files():
    return resolve_model("tiny.en")


@pytest.fixture(scope="session")
def base_files():
    return resolve_model("base")


@pytest.fixture(scope="session")
def onnx_cache_dir(tmp_path_factory):
    """One ONNX cache for the whole session, so each model is converted once per test run."""
    return tmp_path_factory.mktemp("captioner-cache")


@pytest.fixture()
def private_cache(onnx_cache_dir, monkeypatch):
    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(onnx_cache_dir))
    return onnx_cache_dir


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
