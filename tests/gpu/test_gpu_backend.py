"""The array back-end: choice of device, overrides, GPU listing."""

from __future__ import annotations

import numpy as np
import pytest

from captioner.errors import UserError
from captioner.gpu import backend


def test_cpu_backend_is_numpy():
    b = backend.get_backend("cpu")
    assert b.xp is np and b.name == "cpu" and not b.is_cuda
    a = b.asarray([1.0, 2.0], dtype=np.float32)
    assert isinstance(b.asnumpy(a), np.ndarray) and b.asnumpy(a).tolist() == [1.0, 2.0]
    b.synchronize()  # a no-op on the CPU


def test_environment_overrides_the_automatic_choice(monkeypatch):
    monkeypatch.setenv(backend.DEVICE_ENV, "cpu")
    assert backend.get_backend().name == "cpu"
    assert backend.get_backend("auto").name == "cpu"


def test_argument_beats_environment(monkeypatch):
    monkeypatch.setenv(backend.DEVICE_ENV, "cuda:0")
    assert backend.get_backend("cpu").name == "cpu"


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "cpu:0", "tpu"])
def test_unknown_device_is_a_user_error(device):
    with pytest.raises(UserError):
        backend.get_backend(device)


def test_missing_cuda_device_is_a_user_error(monkeypatch):
    monkeypatch.setenv(backend.DEVICE_ENV, "cuda:63")
    with pytest.raises(UserError, match="cuda:63"):
        backend.get_backend()


def test_describe_gpus_matches_usability(monkeypatch):
    monkeypatch.delenv(backend.DEVICE_ENV, raising=False)  # automatic choice, no override
    gpus = backend.describe_gpus()
    assert isinstance(gpus, list)
    if not backend.cuda_usable():
        assert gpus == []
        assert backend.get_backend().name == "cpu"


@pytest.mark.gpu
def test_cuda_backend_on_a_gpu(monkeypatch):
    monkeypatch.delenv(backend.DEVICE_ENV, raising=False)
    b = backend.get_backend()
    assert b.is_cuda and b.name == "cuda:0" and b.device_name
    x = b.asarray(np.arange(4, dtype=np.float32))
    assert type(x).__module__.startswith("cupy")
    np.testing.assert_array_equal(b.asnumpy(x * 2), [0, 2, 4, 6])
    gpus = backend.describe_gpus()
    assert gpus and gpus[0].name == b.device_name
    assert gpus[0].total_vram_bytes > 1 << 30 and gpus[0].driver_version
