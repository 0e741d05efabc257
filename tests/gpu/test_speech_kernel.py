"""The VAD measures kernel on CUDA (gpu/speech_kernel.py through FeaturePool.speech_measures): the
same band energy and spectral change as the NumPy path over frames gathered from the rings, on
real speech in several banks. tests/engine/test_speech_kernel_cpu.py checks the kernel's source
on the CPU, tests/engine/test_speech_kernel_cuda.py an engine's decisions with and without it."""

from __future__ import annotations

import numpy as np
import pytest

from captioner.engine.vad import (
    FULL_SCALE_SINE_DB,
    VadConfig,
    band_energy_db,
    spectral_change_db,
    speech_band,
)
from captioner.gpu.backend import cuda_usable, get_backend

pytestmark = pytest.mark.gpu

ATOL_DB = 2e-3


@pytest.fixture(scope="module")
def cuda():
    if not cuda_usable():
        pytest.skip("no usable CUDA device")
    return get_backend("cuda")


def _speech(speech_audio, n: int) -> list[np.ndarray]:
    clips = sorted(speech_audio)
    return [speech_audio[clips[i % len(clips)]][16000 * (i // len(clips)):] for i in range(n)]


@pytest.mark.parametrize("n_mels", [80, 128])
def test_measures_from_the_rings_equal_the_numpy_path(cuda, speech_audio, n_mels):
    from captioner.gpu.features import FeaturePool

    pool = FeaturePool(cuda, n_mels=n_mels, ring_frames=256, block_streams=4)
    slots = [pool.acquire() for _ in range(10)]  # three banks
    assert pool.measures_on_device
    audio = [np.pad(a[:160 * 300], (0, max(0, 160 * 300 - a.size))) for a in _speech(speech_audio, 10)]
    rng = np.random.default_rng(n_mels)
    cfg = VadConfig()
    band, lag = speech_band(n_mels), cfg.change_lag_frames
    checked = 0
    for chunk in range(10):  # 3 s per stream in 0.3 s pushes: 300 frames in rings of 256 (wrapped)
        block = np.stack([a[chunk * 4800:(chunk + 1) * 4800] for a in audio]).astype(np.float32)
        pool.push_batch(slots, block)
        ready = pool.frames_ready_many(slots)
        order = rng.permutation(10)[:7]  # some streams, out of order, across banks
        counts = rng.integers(1, 31, order.size)
        firsts = ready[order] - counts
        backs = np.minimum(lag, np.maximum(firsts - np.maximum(ready[order] - 256, 0), 0))
        if chunk == 0:
            backs[:] = np.minimum(backs, rng.integers(0, lag + 1, order.size))  # stream starts
        energy, change = pool.speech_measures([slots[i] for i in order], firsts, counts, backs, band, lag,
                                              cfg.change_range_db, FULL_SCALE_SINE_DB)
        start = 0
        for k, i in enumerate(order.tolist()):
            frames = cuda.asnumpy(pool.log_mel_frames([slots[i]], [firsts[k] - backs[k]], int(counts[k] + backs[k])))
            if backs[k] < lag:
                frames = np.concatenate([np.repeat(frames[..., :1], lag - backs[k], axis=-1), frames], axis=-1)
            want_energy = band_energy_db(np, frames[..., lag:], band)[0]
            want_change = spectral_change_db(np, frames, band, lag, cfg.change_range_db)[0]
            n = int(counts[k])
            np.testing.assert_allclose(energy[start:start + n], want_energy, rtol=0, atol=ATOL_DB)
            np.testing.assert_allclose(change[start:start + n], want_change, rtol=0, atol=ATOL_DB)
            start += n
            checked += n
    assert checked > 500
    with pytest.raises(ValueError, match="not in the ring"):
        pool.speech_measures([slots[0]], [int(pool.frames_ready(slots[0])) - 300], [5], [4], band, lag, 40.0, 0.0)
