"""The private ONNX graph cache that the model tests share within one test session."""

from __future__ import annotations

from pathlib import Path


def session_cache_dir(tmp_path_factory) -> Path:
    """One folder for the whole test session, so each model is converted once per run.

    A fixed name under the session's base temporary folder rather than ``mktemp``: a
    session-scoped fixture that several test modules import is instantiated once per module
    (pytest keeps one fixture definition per module that imports it), and every instance must
    land on the same folder."""
    folder = tmp_path_factory.getbasetemp() / "captioner-onnx-cache"
    folder.mkdir(exist_ok=True)
    return folder
