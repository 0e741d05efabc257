"""The model-input kernels' CUDA source (gpu/window_kernel.py) run on the CPU (tests/cuda_host.py),
against what the recognizer builds from arrays (``WhisperRecognizer._input``: the window's last
frames, Whisper's padding, the peak, the clamp and scale): the same bits. The rings are real host
arrays whose addresses the kernels get, as they get device addresses on CUDA;
tests/gpu/test_window_kernel.py checks the compiled kernels through FeaturePool.model_input."""

from __future__ import annotations

import numpy as np
import pytest

import cuda_host
from captioner.engine.whisper import LOG_FLOOR, WhisperRecognizer
from captioner.gpu import window_kernel

RING_FRAMES = 96


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    lib = cuda_host.build(tmp_path_factory.mktemp("window_kernel"), "window_kernel_host", window_kernel.kernel_source(),
                          [window_kernel.PEAK_KERNEL, window_kernel.WRITE_KERNEL])
    return cuda_host.HostKernel(lib, 0), cuda_host.HostKernel(lib, 1)


class _Arrays:
    """What ``WhisperRecognizer._input`` needs of a recognizer and a request (array windows)."""

    def __init__(self, n_mels):
        self.xp, self.n_mels, self._batches, self._ring_batches = np, n_mels, {}, {}


class _Request:
    def __init__(self, log_mel):
        self.log_mel = log_mel


@pytest.mark.parametrize("n_mels", [80, 128])
def test_kernel_source_on_the_cpu_builds_the_recognizers_batch(kernels, n_mels):
    rng = np.random.default_rng(n_mels)
    rings = np.ascontiguousarray(rng.uniform(-9.0, 1.5, (6, RING_FRAMES, n_mels)).astype(np.float32))
    rings[2, :, :] = -12.0  # below the floor everywhere: the padding is the peak
    width = 70
    cases = [(0, 5, 40), (1, 90, 12), (2, 10, 30), (3, 0, 70), (4, 50, 85), (5, 20, 1), (0, 60, 0)]  # (slot, first, frames)
    used = np.array([min(n, width) for _, _, n in cases])
    starts = np.array([f + n - u for (_, f, n), u in zip(cases, used)])
    addresses = np.array([rings.ctypes.data + s * RING_FRAMES * n_mels * 4 for s, _, _ in cases], dtype=np.int64)
    table = window_kernel.row_table(addresses, starts % RING_FRAMES, used)
    out = np.full((len(cases), n_mels, width), np.nan, dtype=np.float32)
    peaks = np.zeros(len(cases), dtype=np.float32)
    window_kernel.launch(kernels, table, len(cases), RING_FRAMES, n_mels, width, LOG_FLOOR, 8.0, 4.0, 0.25, peaks, out)
    windows = [_Request(rings[s][(f + np.arange(n)) % RING_FRAMES].T.copy()) for s, f, n in cases]
    want = WhisperRecognizer._input(_Arrays(n_mels), windows, width)
    np.testing.assert_array_equal(out, want)


def test_bands_beyond_the_kernels_tile_are_refused(kernels):
    with pytest.raises(ValueError, match="mel bands"):
        window_kernel.launch(kernels, np.zeros((1, 4), np.int64), 1, 8, 200, 8, LOG_FLOOR, 8.0, 4.0, 0.25,
                             np.zeros(1, np.float32), np.zeros((1, 200, 8), np.float32))
