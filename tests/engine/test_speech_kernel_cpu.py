"""The VAD measures kernel's CUDA source (gpu/speech_kernel.py) run on the CPU (tests/cuda_host.py),
against the NumPy path the engine runs without CUDA: frames gathered from the rings, padded at a
stream's start, then ``band_energy_db`` and ``spectral_change_db`` (engine/vad.py, the
specification). The rings are real host arrays and the kernel gets their addresses, as it gets
device addresses on CUDA; tests/gpu/test_speech_kernel.py checks the compiled kernel there."""

from __future__ import annotations

import numpy as np
import pytest

import cuda_host
from captioner.engine.vad import (
    FULL_SCALE_SINE_DB,
    VadConfig,
    band_energy_db,
    spectral_change_db,
    speech_band,
)
from captioner.gpu import speech_kernel

RING_FRAMES = 64
ATOL_DB = 2e-3
"""Float32 sums in another order (lanes, then a warp's tree) than NumPy's pairwise ones."""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    lib = cuda_host.build(tmp_path_factory.mktemp("speech_kernel"), "speech_kernel_host",
                          speech_kernel.kernel_source(), [speech_kernel.KERNEL_NAME])
    return cuda_host.HostKernel(lib, 0)


def _rings(rng, banks: int, slots: int, n_mels: int) -> list[np.ndarray]:
    """Raw log10 mel rings: a level that moves from frame to frame, a spectral shape that changes
    in some stretches and holds in others, and deep dips (held to the 40 dB range)."""
    out = []
    for _ in range(banks):
        level = rng.normal(-3.0, 1.5, (slots, RING_FRAMES, 1))
        shape = np.cumsum(rng.normal(0, 0.3, (slots, RING_FRAMES, n_mels)), axis=1) * (rng.random((slots, RING_FRAMES, 1)) < 0.7)
        dips = np.where(rng.random((slots, RING_FRAMES, n_mels)) < 0.05, -6.0, 0.0)
        out.append(np.ascontiguousarray((level + shape + dips).astype(np.float32)))
    return out


def _numpy_path(ring: np.ndarray, first: int, count: int, back: int, band, lag: int, range_db: float):
    """What the engine does without the kernel: gather, pad, measure."""
    columns = (first - back + np.arange(count + back)) % RING_FRAMES
    frames = ring[columns].T[None]  # [1, n_mels, back + count]
    if back < lag:
        frames = np.concatenate([np.repeat(frames[..., :1], lag - back, axis=-1), frames], axis=-1)
    return band_energy_db(np, frames[..., lag:], band)[0], spectral_change_db(np, frames, band, lag, range_db)[0]


@pytest.mark.parametrize("n_mels", [80, 128])
def test_kernel_source_on_the_cpu_equals_the_numpy_path(kernel, n_mels):
    rng = np.random.default_rng(n_mels)
    cfg = VadConfig()
    band, lag, range_db = speech_band(n_mels), cfg.change_lag_frames, cfg.change_range_db
    rings = _rings(rng, banks=2, slots=5, n_mels=n_mels)
    slot_bytes = RING_FRAMES * n_mels * 4
    cases = []  # (bank, slot, first frame, count, back)
    for _ in range(40):
        back = int(rng.integers(0, lag + 1)) if rng.random() < 0.4 else lag  # stream starts: fewer frames back
        cases.append((int(rng.integers(0, 2)), int(rng.integers(0, 5)), int(rng.integers(0, 3 * RING_FRAMES)),
                      int(rng.integers(1, 26)), back))
    cases.append((1, 4, RING_FRAMES - 2, 9, lag))  # across the ring's end
    addresses = np.array([rings[b].ctypes.data + s * slot_bytes for b, s, *_ in cases], dtype=np.int64)
    firsts = np.array([f % RING_FRAMES for _, _, f, _, _ in cases], dtype=np.int64)
    counts = np.array([c for *_, c, _ in cases], dtype=np.int64)
    backs = np.array([k for *_, k in cases], dtype=np.int64)
    table, total = speech_kernel.row_table(addresses, firsts, counts, backs)
    energy, change = np.full(total, np.nan, np.float32), np.full(total, np.nan, np.float32)
    launches = kernel.launches
    speech_kernel.launch(kernel, table, len(cases), total, RING_FRAMES, n_mels, band, lag, range_db,
                         FULL_SCALE_SINE_DB, energy, change)
    assert kernel.launches == launches + 1  # every row of every bank in one launch
    for (b, s, f, c, k), start in zip(cases, table[:, 4].tolist()):
        want_energy, want_change = _numpy_path(rings[b][s], f, c, k, band, lag, range_db)
        np.testing.assert_allclose(energy[start:start + c], want_energy, rtol=0, atol=ATOL_DB)
        np.testing.assert_allclose(change[start:start + c], want_change, rtol=0, atol=ATOL_DB)
    # The stretches that hold their shape (change near 0) and those that do not both occur.
    assert (change < 0.5).any() and (change > VadConfig().change_db).any()


def test_rows_of_one_frame_and_a_band_too_wide(kernel):
    """A single row of a single frame; a band of more than MAX_BAND bands is refused before launch."""
    rng = np.random.default_rng(3)
    ring = _rings(rng, 1, 1, 80)[0]
    band = speech_band(80)
    table, total = speech_kernel.row_table(np.array([ring.ctypes.data]), np.array([5]), np.array([1]), np.array([4]))
    energy, change = np.zeros(1, np.float32), np.zeros(1, np.float32)
    speech_kernel.launch(kernel, table, 1, total, RING_FRAMES, 80, band, 4, 40.0, FULL_SCALE_SINE_DB, energy, change)
    want_energy, want_change = _numpy_path(ring[0], 5, 1, 4, band, 4, 40.0)
    np.testing.assert_allclose(energy, want_energy, atol=ATOL_DB)
    np.testing.assert_allclose(change, want_change, atol=ATOL_DB)
    with pytest.raises(ValueError, match="speech band"):
        speech_kernel.launch(kernel, table, 1, total, RING_FRAMES, 200, (0, 160), 4, 40.0, FULL_SCALE_SINE_DB, energy, change)
