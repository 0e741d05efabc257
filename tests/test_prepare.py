"""`python -m captioner.app.prepare` (run by scripts/setup.sh): the default model's ONNX graphs,
and those of the language check's model, are built into the user cache before the first launch,
so the first window captions at once; a second call finds them cached and shows no progress. A
device that does not exist is one line and exit status 2, with nothing built."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def prepare(cache, *argv):
    env = {k: v for k, v in os.environ.items() if k not in ("CAPTIONER_DEVICE", "CAPTIONER_CACHE_DIR")}
    env["XDG_CACHE_HOME"] = str(cache)
    return subprocess.run([sys.executable, "-m", "captioner.app.prepare", "--device", "cpu", *argv],
                          capture_output=True, text=True, timeout=300, env=env)


def graph_folders(cache):
    root = cache / "captioner" / "onnx"
    return sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) if root.exists() else []


def test_the_first_call_builds_the_graphs_and_the_second_finds_them(tmp_path):
    from captioner.models.registry import resolve_model

    first = prepare(tmp_path)
    assert first.returncode == 0, first.stderr
    assert "tiny.en: ONNX graphs ready" in first.stderr and "captioner: tiny.en ready on cpu" in first.stderr
    built = graph_folders(tmp_path)
    try:
        resolve_model("base")
    except Exception:
        assert len(built) == 1  # base not installed: only tiny.en
    else:
        assert len(built) == 2 and "base (language check) ready on cpu" in first.stderr
    second = prepare(tmp_path)
    assert second.returncode == 0, second.stderr
    # Nothing to build: no progress, only what is ready.
    assert "ONNX graphs" not in second.stderr and "building" not in second.stderr
    assert "captioner: tiny.en ready on cpu" in second.stderr
    assert graph_folders(tmp_path) == built


def test_a_device_that_does_not_exist_builds_nothing(tmp_path):
    done = prepare(tmp_path, "--device", "tpu")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "unknown device 'tpu'" in done.stderr
    assert graph_folders(tmp_path) == []
