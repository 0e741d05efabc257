"""Shared fixtures: the real speech recordings, and skips for hardware this machine lacks."""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def speech_dir() -> Path:
    """The recordings in ``shared/speech`` beside the checkout (CI lays a copy there too)."""
    override = os.environ.get("CAPTIONER_SPEECH_DIR")
    return Path(override) if override else REPO_ROOT.parent / "shared" / "speech"


@dataclass(frozen=True)
class SpeechClip:
    id: str
    wav: Path
    language: str
    duration_s: float
    reference: str


def load_speech_manifest() -> list[SpeechClip]:
    root = speech_dir()
    manifest = root / "manifest.tsv"
    if not manifest.exists():
        return []
    with manifest.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [
        SpeechClip(r["id"], root / r["wav"], r["language"], float(r["duration_s"]), r["reference"])
        for r in rows
    ]


@pytest.fixture(scope="session")
def speech_clips() -> dict[str, SpeechClip]:
    clips = load_speech_manifest()
    if not clips:
        pytest.skip(f"no speech recordings at {speech_dir()}")
    return {c.id: c for c in clips}


def cuda_available() -> bool:
    from captioner.gpu import backend  # imported lazily: the back-end decides what "usable" means

    return backend.cuda_usable()


def pytest_collection_modifyitems(config, items):
    # get_closest_marker, not `"gpu" in item.keywords`: keywords also hold directory names,
    # so every test under tests/gpu/ would count as marked.
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    try:
        usable = cuda_available()
    except Exception:  # the back-end module not yet importable counts as "no GPU"
        usable = False
    if not usable:
        skip = pytest.mark.skip(reason="no usable CUDA device")
        for item in gpu_items:
            item.add_marker(skip)


def load_pulse_helper():
    """tests/pulse.py, loaded by path so it works under any pytest import mode."""
    import importlib.util
    import sys

    module = sys.modules.get("captioner_tests_pulse")
    if module is None:
        spec = importlib.util.spec_from_file_location("captioner_tests_pulse", Path(__file__).with_name("pulse.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def pulse_helper():
    """The tests/pulse.py module (start further servers with ``start_pulse_server()``);
    skips when the PulseAudio binaries are absent."""
    helper = load_pulse_helper()
    reason = helper.pulseaudio_missing()
    if reason:
        pytest.skip(reason)
    return helper


@pytest.fixture(scope="module")
def pulse_server(pulse_helper):
    """A private PulseAudio server (tests/pulse.py) with null sinks ``captioner_test`` (48 kHz,
    its monitor the default source) and ``captioner_test_44k`` (44.1 kHz). ``PULSE_SERVER``
    points at it while the fixture lives, so PortAudio's ALSA ``pulse``/``default`` devices
    reach it. Skips only when the PulseAudio binaries are absent; the daemon is killed on
    teardown whatever happened."""
    server = pulse_helper.start_pulse_server()
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("PULSE_SERVER", server.server)
            env.delenv("PULSE_SOURCE", raising=False)
            env.delenv("PULSE_SINK", raising=False)
            yield server
    finally:
        server.stop()
