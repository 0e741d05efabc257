"""The fused log-mel kernel: its algorithm in NumPy (CPU), and the kernel itself (GPU)."""

from __future__ import annotations

import numpy as np
import pytest
from whisper_oracle import kept, whisper_log_mel_f64

from captioner.gpu import features_ref as ref
from captioner.gpu import logmel_kernel as lk
from captioner.gpu.features import StreamingFeatures


def _windowed_frames(audio: np.ndarray) -> np.ndarray:
    padded = np.pad(audio, 200, mode="reflect")
    n = audio.shape[0] // 160
    frames = np.lib.stride_tricks.sliding_window_view(padded, 400)[: n * 160 : 160]
    return (frames * ref.hann_window()).astype(np.float32)


def test_emulated_factorisation_is_the_real_fft():
    # Random frames, a pure tone, an impulse and a constant: every bin, both untangled halves.
    rng = np.random.default_rng(5)
    frames = np.vstack([
        rng.standard_normal((64, 400)),
        np.sin(2 * np.pi * 37.0 * np.arange(400) / 400)[None, :],
        np.eye(1, 400, 123),
        np.ones((1, 400)),
    ]).astype(np.float32)
    got = lk.emulate_power(frames) / 4.0
    want = np.abs(np.fft.rfft(frames.astype(np.float64), axis=-1)) ** 2
    scale = want.max(axis=-1, keepdims=True)
    assert (np.abs(got - want) / scale).max() < 1e-6
    assert np.argmax(got[64]) == 37  # the tone lands in its own bin


def test_emulated_kernel_on_speech_stays_near_the_float64_oracle(speech_audio):
    # The kernel's float32 algorithm, applied to real speech: kept cells near Whisper's formula.
    audio = speech_audio["en_ls_1089-134691-0000"]
    audio = audio[: audio.shape[0] // 160 * 160]
    dense = np.zeros((80, ref.N_BINS), np.float32)
    for m, (first, weights) in enumerate(lk.compact_filters(ref.mel_filters(80))):
        dense[m, first : first + weights.size] = weights
    got = np.log10(np.maximum(lk.emulate_power(_windowed_frames(audio)) @ dense.T, 1e-10)).T
    oracle = whisper_log_mel_f64(audio, 80)
    assert np.abs(got - oracle)[kept(oracle)].max() < 2e-4


def test_compact_filters_hold_every_weight_quartered():
    for n_mels in ref.SUPPORTED_N_MELS:
        filters = ref.mel_filters(n_mels)
        rebuilt = np.zeros_like(filters)
        for m, (first, weights) in enumerate(lk.compact_filters(filters)):
            rebuilt[m, first : first + weights.size] = weights
        np.testing.assert_array_equal(rebuilt, filters * np.float32(0.25))


@pytest.mark.parametrize("precision", ["float32", "mixed"])
@pytest.mark.parametrize("n_mels", ref.SUPPORTED_N_MELS)
def test_source_has_every_placeholder_filled_and_every_band(precision, n_mels):
    source = lk.kernel_source(ref.mel_filters(n_mels), precision)
    assert "@" not in source
    assert "captioner_logmel_fused" in source and "captioner_roll" in source
    for m in range(n_mels):  # every band is computed exactly once, in one warp's case
        assert source.count(f"v{m} = __log10f") == 1
    blocks = 2 if precision == "mixed" else 4  # what the register budget allows
    assert blocks * (lk.shared_bytes(precision) + 1024) <= 228 * 1024  # and shared memory too


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="precision"):
        lk.kernel_source(ref.mel_filters(80), "float16")


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["mixed", "float32"])
def test_cuda_kernel_on_every_recording(speech_audio, precision):
    """All recordings, 80 and 128 mels, 1 s pushes: the default precision keeps kept cells
    within 1e-4 of the float64 oracle; float32 is held to what it was measured at."""
    from captioner.gpu.backend import get_backend

    xb = get_backend("cuda")
    limit = 1e-4 if precision == "mixed" else 2e-4
    worst = 0.0
    for n_mels in ref.SUPPORTED_N_MELS:
        for name, audio in speech_audio.items():
            audio = audio[: audio.shape[0] // 160 * 160]
            sf = StreamingFeatures(xb, n_mels=n_mels, max_streams=1, ring_frames=audio.shape[0] // 160,
                                   fft_precision=precision)
            assert sf.path.startswith(f"cuda-fused-{precision}"), sf.kernel_error
            sf.push(0, audio)
            n = sf.frames_ready(0)
            got = xb.asnumpy(sf.log_mel_window(0, 0, n))
            oracle = whisper_log_mel_f64(audio, n_mels)[:, :n]
            err = float(np.abs(got - oracle)[kept(whisper_log_mel_f64(audio, n_mels))[:, :n]].max())
            worst = max(worst, err)
            assert err < limit, f"{name} at {n_mels} mels: {err:.2e}"
    print(f"worst kept-cell error, {precision}: {worst:.2e}")
