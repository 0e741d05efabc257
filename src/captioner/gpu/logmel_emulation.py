"""The fused log-mel kernel's FFT arithmetic in NumPy, so the CPU tests can check its algorithm.

:func:`emulate_power` runs the factorisation the CUDA source of
:mod:`captioner.gpu.logmel_kernel` encodes (200 = 25 x 8, each DFT-25 as 5 x 5, then the
untangling of the real FFT's halves) with the same twiddle tables and DFT formulas, rounding
where the kernel rounds. The GPU tests check the kernel itself; nothing at run time uses this.
"""

from __future__ import annotations

import numpy as np

from captioner.gpu.features_ref import N_BINS
from captioner.gpu.logmel_kernel import (
    DFT5_K,
    DFT5_S1,
    DFT5_S2,
    DFT8_R2,
    post_twiddles,
    stage1_twiddles,
)
from captioner.gpu.logmel_launch import N1, N2, N_HALF


def _fma(k, a, b):
    """``k a + b`` rounded once, as the kernel's fused multiply-add (exact products in float64)."""
    if a.dtype == np.complex128:
        return k * a + b
    return (np.float64(k) * a.astype(np.complex128) + b).astype(np.complex64)


def _np_dft5(a0, a1, a2, a3, a4, dtype=np.complex64):
    # Winograd's form of the cosine part: (c1 + c2) / 2 = -1/4 exactly, so a near-constant
    # input cancels exactly (a0 - t1 / 4) instead of through two rounded cosines.
    real = np.float32 if dtype == np.complex64 else np.float64
    k, s1, s2 = (real(v) for v in (DFT5_K, DFT5_S1, DFT5_S2))
    s14, d14, s23, d23 = a1 + a4, a1 - a4, a2 + a3, a2 - a3
    t1, t2 = s14 + s23, s14 - s23
    base = a0 - real(0.25) * t1
    r1, r2 = _fma(k, t2, base), _fma(-k, t2, base)
    u1 = s1 * d14 + s2 * d23
    u2 = s2 * d14 - s1 * d23
    j = dtype(1j)
    return a0 + t1, r1 - j * u1, r2 - j * u2, r2 + j * u2, r1 + j * u1


def _np_dft8(a):
    j = np.complex64(1j)
    w1 = np.complex64(complex(DFT8_R2, -DFT8_R2))
    w3 = np.complex64(complex(-DFT8_R2, -DFT8_R2))
    t0, t1 = a[0] + a[4], a[0] - a[4]
    t2, t3 = a[2] + a[6], -j * (a[2] - a[6])
    t4, t5 = a[1] + a[5], a[1] - a[5]
    t6, t7 = a[3] + a[7], -j * (a[3] - a[7])
    e = (t0 + t2, t1 + t3, t0 - t2, t1 - t3)
    o = (t4 + t6, t5 + t7, t4 - t6, t5 - t7)
    wo = (o[0], w1 * o[1], -j * o[2], w3 * o[3])
    return [e[k] + wo[k] for k in range(4)] + [e[k] - wo[k] for k in range(4)]


def _np_dft25(y, dtype=np.complex64):
    tw = np.exp(-2j * np.pi * np.outer(np.arange(5), np.arange(5)) / 25.0).astype(dtype)
    c = [[None] * 5 for _ in range(5)]  # c[q][r]: inner DFT-5 over p of y[q + 5 p]
    for q in range(5):
        out = _np_dft5(*(y[q + 5 * p] for p in range(5)), dtype=dtype)
        for r in range(5):
            c[q][r] = out[r] * tw[q, r] if q and r else out[r]
    x = [None] * 25
    for r in range(5):
        out = _np_dft5(*(c[q][r] for q in range(5)), dtype=dtype)
        for s in range(5):
            x[r + 5 * s] = out[s]
    return x


def emulate_power(windowed: np.ndarray, stage1=np.complex64) -> np.ndarray:
    """The kernel's FFT and untangling in NumPy: ``4 |rfft(windowed)|^2``, float32 ``[..., 201]``.

    (The kernel's mel weights carry the 1/4.) Vectorised over leading axes, complex64
    arithmetic as the kernel's float32; ``stage1=np.complex128`` mirrors the ``mixed`` kernel.
    """
    x = np.asarray(windowed, dtype=np.float32)
    z = (x[..., 0::2] + np.complex64(1j) * x[..., 1::2]).astype(np.complex64)  # [..., 200]
    tw1 = stage1_twiddles().astype(stage1)
    a = np.empty(z.shape[:-1] + (N1, N2), np.complex64)  # a[n1, k2]
    for n1 in range(N1):
        out = _np_dft25([z[..., n1 + N1 * n2].astype(stage1) for n2 in range(N2)], stage1)
        for k2 in range(N2):
            a[..., n1, k2] = out[k2] * tw1[n1, k2] if n1 and k2 else out[k2]
    big_z = np.empty(z.shape, np.complex64)
    for k2 in range(N2):
        out = _np_dft8([a[..., n1, k2] for n1 in range(N1)])
        for k1 in range(N1):
            big_z[..., k2 + N2 * k1] = out[k1]
    tw2 = post_twiddles().astype(np.complex64)
    k = np.arange(N_HALF // 2 + 1)
    zk = big_z[..., k]
    zn = np.conj(big_z[..., (N_HALF - k) % N_HALF])
    e2 = zk + zn  # 2 E
    d2 = (zk - zn) * tw2[k]  # 2 W400^k O
    power = np.empty(x.shape[:-1] + (N_BINS,), np.float32)
    u, v = e2 + d2, e2 - d2
    power[..., k] = (u.real * u.real + u.imag * u.imag).astype(np.float32)
    power[..., N_HALF - k] = (v.real * v.real + v.imag * v.imag).astype(np.float32)
    return power
