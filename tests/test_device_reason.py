"""Why a GPU cannot be used is said once, the same by the CLI's ``--device`` and the public API's
``device=`` (:mod:`captioner.device_check`), and is the first thing really missing: the driver
and a device before any library, so nobody is told to install an extra that would not help."""

from __future__ import annotations

import subprocess
import sys

import pytest

import captioner
from captioner import cuda_driver
from captioner.app.commands.device_option import check_device
from captioner.data import sample_speech_path
from captioner.errors import UserError
from captioner.gpu import backend
from captioner.models import session

_CACHED_PROBES = (cuda_driver.driver_devices, backend._cuda_probe, session._cuda_provider_devices)
"""The real, cached probes (taken before any test replaces one with a fake)."""


def _forget_probes() -> None:
    for probe in _CACHED_PROBES:
        probe.cache_clear()


@pytest.fixture
def fresh_probes():
    """Every probe asked again in the test, and again after it (its fakes must not stay cached)."""
    _forget_probes()
    yield
    _forget_probes()


def _api_error(device: str) -> str:
    with pytest.raises(UserError) as refused:
        captioner.LiveCaptioner(device=device)
    return str(refused.value)


def _cli_error(device: str) -> str:
    with pytest.raises(UserError) as refused:
        check_device(device)
    return str(refused.value)


@pytest.mark.skipif(cuda_driver.driver_devices()[0] > 0, reason="this machine has an NVIDIA driver and a GPU")
def test_without_a_gpu_the_api_says_what_the_cli_says(monkeypatch):
    monkeypatch.delenv("CAPTIONER_DEVICE", raising=False)
    reason = cuda_driver.driver_devices()[1]
    done = subprocess.run([sys.executable, "-m", "captioner", "transcribe", str(sample_speech_path()), "--device", "cuda:0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and reason in done.stderr
    api = _api_error("cuda:0")
    assert api == _cli_error("cuda:0") and api in done.stderr
    assert reason in api and "install" not in api and "CuPy" not in api
    # The offline API asks only the model's side, and gives the same reason.
    with pytest.raises(UserError, match=reason):
        captioner.transcribe(str(sample_speech_path()), device="cuda:0")


class _CpuOnlyOrt:
    """An onnxruntime build without the CUDA provider (``pip install onnxruntime``)."""

    @staticmethod
    def get_available_providers() -> list[str]:
        return [session.CPU]


def _no_cupy():
    raise ImportError("No module named 'cupy'")


def test_no_driver_is_said_before_any_missing_library(monkeypatch, fresh_probes):
    # Nothing at all: no driver, a CPU-only onnxruntime, no CuPy. Only the driver is worth naming.
    monkeypatch.delenv("CAPTIONER_DEVICE", raising=False)
    monkeypatch.setattr(cuda_driver, "driver_devices", lambda: (0, cuda_driver.NO_DRIVER))
    monkeypatch.setattr(session, "_ort", lambda: _CpuOnlyOrt)
    monkeypatch.setattr(backend, "_import_cupy", _no_cupy)
    for device in ("cuda", "cuda:1"):
        api, cli = _api_error(device), _cli_error(device)
        assert api == cli and cuda_driver.NO_DRIVER in api
        assert "install" not in api and "\n" not in api
    # A driver without a GPU is that, not a library to install either.
    monkeypatch.setattr(cuda_driver, "driver_devices", lambda: (0, cuda_driver.NO_DEVICE))
    _forget_probes()
    assert _api_error("cuda:0") == _cli_error("cuda:0")
    assert cuda_driver.NO_DEVICE in _api_error("cuda:0") and "install" not in _api_error("cuda:0")


def test_with_a_gpu_the_missing_library_is_named(monkeypatch, fresh_probes):
    monkeypatch.delenv("CAPTIONER_DEVICE", raising=False)
    monkeypatch.setattr(cuda_driver, "driver_devices", lambda: (1, ""))
    monkeypatch.setattr(backend, "_import_cupy", _no_cupy)
    # A driver and a GPU, the model's side working, CuPy missing: the [cuda] extra is the answer.
    monkeypatch.setattr(session, "_cuda_provider_devices", lambda: (1, ""))
    monkeypatch.setattr(session, "_probe_cuda", lambda device_id: "")
    api = _api_error("cuda:0")
    assert api == _cli_error("cuda:0") and "CuPy is not installed: install the [cuda] extra" in api
    # Both libraries missing: both callers name the model's side first, the same way.
    monkeypatch.undo()
    monkeypatch.delenv("CAPTIONER_DEVICE", raising=False)
    monkeypatch.setattr(cuda_driver, "driver_devices", lambda: (1, ""))
    monkeypatch.setattr(backend, "_import_cupy", _no_cupy)
    monkeypatch.setattr(session, "_ort", lambda: _CpuOnlyOrt)
    _forget_probes()
    api = _api_error("cuda:0")
    assert api == _cli_error("cuda:0") and "install onnxruntime-gpu" in api


def test_the_environment_is_named_by_the_api_too(monkeypatch, fresh_probes):
    monkeypatch.setenv("CAPTIONER_DEVICE", "cuda:0")
    monkeypatch.setattr(cuda_driver, "driver_devices", lambda: (0, cuda_driver.NO_DRIVER))
    api = _api_error(None)
    assert api.startswith("CAPTIONER_DEVICE=cuda:0: ") and cuda_driver.NO_DRIVER in api
    assert api == _cli_error(None)
