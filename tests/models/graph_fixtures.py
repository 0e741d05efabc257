"""Fixtures for the model-graph tests (imported by them): packaged Whisper models, a private ONNX cache."""

from __future__ import annotations

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
