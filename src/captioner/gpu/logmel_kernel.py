"""One fused CUDA kernel for streaming log-mel (and MFCC): samples in, ring frames out.

Why one kernel: the earlier design (windowed frames cut out to memory, cuFFT, then a mel
pass) moved every frame through HBM three times and could not pass about 1,750 hours of audio
per second. Here a block reads its stream's samples once into shared memory and writes only
the finished log-mel (and MFCC) frames; what limits it now is instruction issue, not memory
(docs/gpu-validation.md).

The 400-point real FFT (float32 arithmetic) is done the textbook way for real input:

* pack the windowed frame ``x`` as 200 complex points ``z[n] = x[2n] + i x[2n+1]``;
* a 200-point complex FFT in two register stages, ``200 = 8 x 25`` (Cooley-Tukey):
  stage 1 does ``25`` DFT-8 over ``z[n2 + 25 m]`` and multiplies by ``W200^(n2 k1)``;
  stage 2 does ``8`` DFT-25 (``5 x 5``, twiddles inside) giving ``Z[k1 + 8 k2]``;
* untangle the even and odd halves: with ``E = (Z[k] + conj Z[200-k]) / 2`` and
  ``O = (Z[k] - conj Z[200-k]) / 2i``, ``X[k] = E + W400^k O`` and ``X[200-k] = conj(E - W400^k O)``.

Accuracy: every twiddle and DFT constant is computed in float64 and rounded once, and the
DFT-5 uses Winograd's form, whose cosine part cancels exactly on smooth input. Even so, a
float32 transform leaves the quietest kept cells of loud frames (7 to 8 decades under the peak)
about 1e-4 off a float64 reference: measured 1.1e-4 on the 20 recordings, against 1.9e-4 for
cuFFT's float32 transform. Most of that rounding happens in the DFT-25 stage, so ``"mixed"``
precision runs that stage in float64 (6.7e-5). The two scale factors of 1/2 become one exact
1/4 folded into the float32 mel weights, which are written into the code as constants.

Layout: a block takes 32 consecutive frames of one stream; lane ``f`` of every warp works on
frame ``f``, and the 8 warps split each stage's roles (25 DFT-8s, 8 DFT-25s, 100 untangling
pairs, mel-band groups), so a role's constants are the same across the warp. Per-frame rows in
shared memory have odd strides, so the 32 lanes hit 32 different banks.

:func:`emulate_power` runs the same factorisation, tables and DFT formulas in NumPy, so the
CPU tests check the algorithm the kernel encodes; the GPU tests check the kernel itself.
"""

from __future__ import annotations

import numpy as np

from captioner.gpu.features_ref import HOP, N_BINS, N_FFT, hann_window

HISTORY = 360  # raw samples a stream keeps between pushes: the oldest its next frame can need

TILE_FRAMES = 32  # frames per block: one per lane, so every warp works on 32 frames at once
WARPS = 8
THREADS = 32 * WARPS
FRAME_STRIDE = 201  # float2 (or float) per frame in shared memory: odd, so lanes hit distinct banks
_POST_ROLES = N_FFT // 4  # k = 0..99 (role 0 also does bin 100): bins k and 200 - k
_TILE_SAMPLES = HOP * (TILE_FRAMES - 1) + N_FFT
_XS_FLOATS = -(-(_TILE_SAMPLES + _TILE_SAMPLES // HOP) // 4) * 4  # one pad float per 160 samples
SHARED_BYTES = 4 * _XS_FLOATS + 8 * TILE_FRAMES * FRAME_STRIDE


def _f32(value: float) -> str:
    """A float32 literal that rounds-trips exactly (9 significant digits)."""
    return f"{float(np.float32(value)):.9e}f"


def _w(n: int, k: int) -> complex:
    """``exp(-2 pi i k / n)`` in float64."""
    return complex(np.exp(-2j * np.pi * k / n))


def stage1_twiddles() -> np.ndarray:
    """``W200^(n2 k1)`` for ``n2 = 0..24``, ``k1 = 0..7``: complex128 ``[25, 8]``."""
    return np.exp(-2j * np.pi * np.outer(np.arange(25), np.arange(8)) / 200.0)


def post_twiddles() -> np.ndarray:
    """``-i W400^k`` for ``k = 0..100`` (``(-sin, -cos)`` of ``2 pi k / 400``): complex128."""
    theta = 2.0 * np.pi * np.arange(_POST_ROLES + 1) / N_FFT
    return -np.sin(theta) - 1j * np.cos(theta)


def compact_filters(filters: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Each mel filter's non-zero run as ``(first_bin, weights / 4)`` (float32).

    The factor 1/4 (exact in float32) undoes the two halvings the kernel leaves out of the
    untangling. The kernel has these weights written into its code as constants.
    """
    runs = []
    for row in np.asarray(filters, dtype=np.float32):
        nz = np.flatnonzero(row > 0)
        lo, hi = int(nz[0]), int(nz[-1]) + 1
        runs.append((lo, (row[lo:hi] * np.float32(0.25)).astype(np.float32)))
    return runs


# --- the DFT formulas, once for NumPy (here) and once for CUDA (the source below) ----------
_K5 = np.sqrt(5.0) / 4.0  # (cos(2 pi / 5) - cos(4 pi / 5)) / 2
_S1, _S2 = np.sin(2 * np.pi / 5), np.sin(4 * np.pi / 5)
_R2 = np.sqrt(0.5)


def _np_dft5(a0, a1, a2, a3, a4, dtype=np.complex64):
    # Winograd's form of the cosine part: (c1 + c2) / 2 = -1/4 exactly, so a near-constant
    # input cancels exactly (a0 - t1 / 4) instead of through two rounded cosines.
    real = np.float32 if dtype == np.complex64 else np.float64
    k, s1, s2 = (real(v) for v in (_K5, _S1, _S2))
    s14, d14, s23, d23 = a1 + a4, a1 - a4, a2 + a3, a2 - a3
    t1, t2 = s14 + s23, s14 - s23
    base = a0 - real(0.25) * t1
    m2 = k * t2
    r1, r2 = base + m2, base - m2
    u1 = s1 * d14 + s2 * d23
    u2 = s2 * d14 - s1 * d23
    j = dtype(1j)
    return a0 + t1, r1 - j * u1, r2 - j * u2, r2 + j * u2, r1 + j * u1


def _np_dft8(a):
    j = np.complex64(1j)
    w1 = np.complex64(complex(_R2, -_R2))
    w3 = np.complex64(complex(-_R2, -_R2))
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


def emulate_power(windowed: np.ndarray, stage2=np.complex64) -> np.ndarray:
    """The kernel's FFT and untangling in NumPy: ``4 |rfft(windowed)|^2``, float32 ``[..., 201]``.

    (The kernel's mel weights carry the 1/4.) Vectorised over leading axes, complex64
    arithmetic as the kernel's float32; ``stage2=np.complex128`` mirrors the ``mixed`` kernel.
    """
    x = np.asarray(windowed, dtype=np.float32)
    z = (x[..., 0::2] + np.complex64(1j) * x[..., 1::2]).astype(np.complex64)  # [..., 200]
    tw1 = stage1_twiddles().astype(np.complex64)
    y = np.empty(z.shape[:-1] + (25, 8), np.complex64)  # y[n2, k1]
    for n2 in range(25):
        out = _np_dft8([z[..., n2 + 25 * m] for m in range(8)])
        for k1 in range(8):
            y[..., n2, k1] = out[k1] * tw1[n2, k1] if k1 else out[k1]
    big_z = np.empty(z.shape, np.complex64)
    for k1 in range(8):
        out = _np_dft25([y[..., n2, k1].astype(stage2) for n2 in range(25)], stage2)
        for k2 in range(25):
            big_z[..., k1 + 8 * k2] = out[k2]
    tw2 = post_twiddles().astype(np.complex64)
    k = np.arange(_POST_ROLES + 1)
    zk = big_z[..., k]
    zn = np.conj(big_z[..., (200 - k) % 200])
    e2 = zk + zn  # 2 E
    d2 = (zk - zn) * tw2  # 2 W400^k O
    power = np.empty(x.shape[:-1] + (N_BINS,), np.float32)
    u, v = e2 + d2, e2 - d2
    power[..., k] = (u.real * u.real + u.imag * u.imag).astype(np.float32)
    power[..., 200 - k] = (v.real * v.real + v.imag * v.imag).astype(np.float32)
    return power


# --- CUDA --------------------------------------------------------------------------------
def _dft25_cuda() -> str:
    lines = []
    for q in range(5):  # inner DFT-5 over p, in place on y[q + 5 p] -> c[q][r] at y[q + 5 r]
        lines.append(f"dft5(y[{q}], y[{q + 5}], y[{q + 10}], y[{q + 15}], y[{q + 20}]);")
    for q in range(1, 5):
        for r in range(1, 5):
            w = _w(25, q * r)
            lines.append(f"y[{q + 5 * r}] = cmul(y[{q + 5 * r}], cpx<C>((R){w.real!r}, (R){w.imag!r}));")
    for r in range(5):  # outer DFT-5 over q of c[q][r] = y[q + 5 r] -> X[r + 5 s] at y[5 r + s]
        lines.append(f"dft5(y[{5 * r}], y[{5 * r + 1}], y[{5 * r + 2}], y[{5 * r + 3}], y[{5 * r + 4}]);")
    return "\n    ".join(lines)


def _stage2_stores() -> str:
    """``X[k2]`` of the DFT-25 lives at ``y[5 r + s]`` with ``k2 = r + 5 s``: ``Z[k1 + 8 k2]``."""
    return "\n            ".join(
        f"dst[{8 * (r + 5 * s)}] = make_float2((float)y[{5 * r + s}].x, (float)y[{5 * r + s}].y);"
        for r in range(5) for s in range(5)
    )


def _mel_groups(runs) -> list[list[int]]:
    """Split the bands into one contiguous group per warp with about equal numbers of weights."""
    total = sum(len(w) for _, w in runs)
    groups: list[list[int]] = [[] for _ in range(WARPS)]
    done = 0
    for m, (_, w) in enumerate(runs):
        g = min(WARPS - 1, int(WARPS * (done + len(w) / 2) / total))
        groups[g].append(m)
        done += len(w)
    return groups


def _mel_code(filters: np.ndarray) -> str:
    runs = compact_filters(filters)
    cases = []
    for g, bands in enumerate(_mel_groups(runs)):
        body = []
        for m in bands:
            lo, w = runs[m]
            terms = "".join(f"a = fmaf({_f32(wk)}, p[{lo + i}], a); " for i, wk in enumerate(w))
            body.append(f"{{ float a = 0.0f; {terms}lm[{m}] = __log10f(fmaxf(a, 1e-10f)); }}")
        cases.append(f"case {g}: {{\n            " + "\n            ".join(body) + "\n            break; }")
    return "\n        ".join(cases)


def _constants() -> str:
    window = ", ".join(_f32(v) for v in hann_window())
    rows = ", ".join("{" + ", ".join(f"{{{_f32(w.real)}, {_f32(w.imag)}}}" for w in row) + "}" for row in stage1_twiddles())
    tw2 = ", ".join(f"{{{_f32(w.real)}, {_f32(w.imag)}}}" for w in post_twiddles())
    return (
        f"__constant__ float c_window[{N_FFT}] = {{{window}}};\n"
        f"__constant__ float2 c_tw1[25][8] = {{{rows}}};\n"
        f"__constant__ float2 c_tw2[{_POST_ROLES + 1}] = {{{tw2}}};\n"
    )


def kernel_source(filters: np.ndarray, precision: str = "float32") -> str:
    """CUDA C++ of ``captioner_logmel_fused`` (for these mel filters) and ``captioner_roll``.

    ``precision``: ``"float32"``, or ``"mixed"`` (the DFT-25 stage in float64).
    """
    if precision not in ("float32", "mixed"):
        raise ValueError(f"precision must be 'float32' or 'mixed', got {precision!r}")
    n_mels = filters.shape[0]
    s2c = "double2" if precision == "mixed" else "float2"
    replacements = {
        "@K5@": repr(float(_K5)), "@S1@": repr(float(_S1)), "@S2@": repr(float(_S2)), "@R2@": _f32(_R2),
        "@S2C@": s2c, "@MIN_BLOCKS@": "2" if precision == "mixed" else "3",
        "@DFT25@": _dft25_cuda(), "@STAGE2_STORES@": _stage2_stores(),
        "@MEL_CASES@": _mel_code(filters), "@N_MELS@": str(n_mels),
        "@HISTORY@": str(HISTORY), "@HOP@": str(HOP), "@N_FFT@": str(N_FFT),
        "@TILE@": str(TILE_FRAMES), "@THREADS@": str(THREADS), "@FRAME_STRIDE@": str(FRAME_STRIDE),
        "@XS_FLOATS@": str(_XS_FLOATS), "@POST_ROLES@": str(_POST_ROLES),
    }
    source = _SOURCE
    for key, value in replacements.items():
        source = source.replace(key, value)
    return source.replace("@CONSTANTS@", _constants())


_SOURCE = r"""
#define HISTORY @HISTORY@
#define HALF (N_FFT / 2)
#define HOP @HOP@
#define N_FFT @N_FFT@
#define TILE @TILE@
#define THREADS @THREADS@
#define FS @FRAME_STRIDE@
#define XS_FLOATS @XS_FLOATS@
#define POST_ROLES @POST_ROLES@
#define N_MELS @N_MELS@
#define LM_STRIDE (N_MELS + 1)  // odd: lanes (frames) hit distinct banks
#define S2C @S2C@

@CONSTANTS@

// Complex helpers for float2 and double2 (the DFT-25 stage is double2 in "mixed" precision).
template <typename C> __device__ __forceinline__ C cpx(decltype(C::x) x, decltype(C::x) y) { C r; r.x = x; r.y = y; return r; }
template <typename C> __device__ __forceinline__ C cadd(C a, C b) { return cpx<C>(a.x + b.x, a.y + b.y); }
template <typename C> __device__ __forceinline__ C csub(C a, C b) { return cpx<C>(a.x - b.x, a.y - b.y); }
template <typename C> __device__ __forceinline__ C mul_neg_i(C a) { return cpx<C>(a.y, -a.x); }  // -i a
__device__ __forceinline__ float fma_(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double fma_(double a, double b, double c) { return fma(a, b, c); }
template <typename C> __device__ __forceinline__ C cmul(C a, C w) {
    return cpx<C>(fma_(a.x, w.x, -a.y * w.y), fma_(a.x, w.y, a.y * w.x));
}

// Forward DFT-5 in place. The cosine part in Winograd's form: (c1 + c2) / 2 = -1/4 exactly,
// so a near-constant input cancels exactly (a0 - t1 / 4) rather than through two rounded
// cosines (that cancellation was the largest float32 error on quiet bins of real speech).
template <typename C> __device__ __forceinline__ void dft5(C& a0, C& a1, C& a2, C& a3, C& a4) {
    typedef decltype(C::x) R;
    const R k = (R)@K5@, s1 = (R)@S1@, s2 = (R)@S2@, quarter = (R)0.25;
    const C s14 = cadd(a1, a4), d14 = csub(a1, a4), s23 = cadd(a2, a3), d23 = csub(a2, a3);
    const C t1 = cadd(s14, s23), t2 = csub(s14, s23);
    const C base = cpx<C>(fma_(-quarter, t1.x, a0.x), fma_(-quarter, t1.y, a0.y));
    const C m2 = cpx<C>(k * t2.x, k * t2.y);
    const C r1 = cadd(base, m2), r2 = csub(base, m2);
    const C u1 = cpx<C>(fma_(s1, d14.x, s2 * d23.x), fma_(s1, d14.y, s2 * d23.y));
    const C u2 = cpx<C>(fma_(s2, d14.x, -s1 * d23.x), fma_(s2, d14.y, -s1 * d23.y));
    a0 = cadd(a0, t1);
    a1 = cadd(r1, mul_neg_i(u1));
    a4 = csub(r1, mul_neg_i(u1));
    a2 = cadd(r2, mul_neg_i(u2));
    a3 = csub(r2, mul_neg_i(u2));
}

template <typename C> __device__ __forceinline__ void dft25(C* y) {
    typedef decltype(C::x) R;
    @DFT25@
}

// Forward DFT-8 in place, natural order out (radix-2 over two DFT-4).
__device__ __forceinline__ void dft8(float2* a) {
    const float r2 = @R2@;
    const float2 t0 = cadd(a[0], a[4]), t1 = csub(a[0], a[4]);
    const float2 t2 = cadd(a[2], a[6]), t3 = mul_neg_i(csub(a[2], a[6]));
    const float2 t4 = cadd(a[1], a[5]), t5 = csub(a[1], a[5]);
    const float2 t6 = cadd(a[3], a[7]), t7 = mul_neg_i(csub(a[3], a[7]));
    const float2 e0 = cadd(t0, t2), e1 = cadd(t1, t3), e2 = csub(t0, t2), e3 = csub(t1, t3);
    const float2 o0 = cadd(t4, t6), o1 = cadd(t5, t7), o2 = csub(t4, t6), o3 = csub(t5, t7);
    const float2 w1 = make_float2(r2 * (o1.x + o1.y), r2 * (o1.y - o1.x));   // (1 - i)/sqrt2 * o1
    const float2 w2 = mul_neg_i(o2);
    const float2 w3 = make_float2(r2 * (o3.y - o3.x), -r2 * (o3.x + o3.y));  // (-1 - i)/sqrt2 * o3
    a[0] = cadd(e0, o0); a[4] = csub(e0, o0);
    a[1] = cadd(e1, w1); a[5] = csub(e1, w1);
    a[2] = cadd(e2, w2); a[6] = csub(e2, w2);
    a[3] = cadd(e3, w3); a[7] = csub(e3, w3);
}

__device__ __forceinline__ int padded(int s) { return s + s / HOP; }  // one pad float per 160

// One block = up to TILE consecutive new frames of one row (stream); lane f of every warp
// works on frame f, and warps split each stage's roles. Frame t = b0 - 1 + j covers the
// reflect-padded signal p[160 t .. 160 t + 399], p[q] = x[|q - 200|]; x comes from the
// stream's history (x[160 b0 - 360 ..)) or the new samples. Frames with t < 0 (the first
// block of a stream completes none) are computed but not written.
extern "C" __global__ void __launch_bounds__(THREADS, @MIN_BLOCKS@) captioner_logmel_fused(
    const float* __restrict__ samples, const long long* __restrict__ slots,
    const long long* __restrict__ b0s, const float* __restrict__ history,
    const float* __restrict__ dct, float* __restrict__ mel_ring, float* __restrict__ mfcc_ring,
    int n_frames, int tiles_per_row, int ring_frames, int n_mfcc)
{
    extern __shared__ float4 shared_raw[];
    float* xs = reinterpret_cast<float*>(shared_raw);        // padded samples; later log-mel
    float2* zs = reinterpret_cast<float2*>(xs + XS_FLOATS);  // FFT work; later power, MFCC
    float* ps = reinterpret_cast<float*>(zs);
    const int tid = threadIdx.x, warp = tid >> 5, f = tid & 31;
    const int r = blockIdx.x / tiles_per_row;
    const int j0 = (blockIdx.x - r * tiles_per_row) * TILE;
    const int nf = min(TILE, n_frames - j0);
    const bool live = f < nf;
    const long long b0 = b0s[r];
    const long long slot = slots[r];
    const float* h = history + slot * HISTORY;
    const int n_new = n_frames * HOP;
    const float* x_new = samples + (long long)r * n_new;
    const int n_load = HOP * (nf - 1) + N_FFT;

    // 1. The tile's samples into shared memory, padded. Past the stream's start (no reflection)
    // the tile is ext[160 j0 ..] of ext = history ++ new samples; past the history, new only.
    if (b0 - 1 + j0 >= 2 && HOP * j0 >= HISTORY) {
        const float4* src = reinterpret_cast<const float4*>(x_new + HOP * j0 - HISTORY);
        for (int i = tid; i < n_load / 4; i += THREADS) {
            const float4 v = src[i];
            float* d = xs + padded(4 * i);  // 160 is a multiple of 4: no pad inside a float4
            d[0] = v.x; d[1] = v.y; d[2] = v.z; d[3] = v.w;
        }
    } else if (b0 - 1 + j0 >= 2) {
        for (int i = tid; i < n_load; i += THREADS) {
            const int e = HOP * j0 + i;
            xs[padded(i)] = e < HISTORY ? h[e] : x_new[e - HISTORY];
        }
    } else {
        const long long q0 = HOP * (b0 - 1 + j0);
        const long long origin = HOP * b0 - HISTORY;  // stream index of h[0]
        for (int i = tid; i < n_load; i += THREADS) {
            const long long q = q0 + i;
            const long long e = (q >= HALF ? q - HALF : HALF - q) - origin;
            float v = 0.0f;  // samples not yet known only reach frames that are not written
            if (e >= 0 && e < HISTORY) v = h[e];
            else if (e >= HISTORY && e < HISTORY + n_new) v = x_new[e - HISTORY];
            xs[padded(i)] = v;
        }
    }
    __syncthreads();

    // 2. Stage 1, roles n2 = warp, + 8, ...: z[n] = x[2n] + i x[2n+1] (windowed: float32
    // products, as Whisper); DFT-8 of z[n2 + 25 m] over m, times W200^(n2 k1) -> y[f][k1][n2].
    if (live) {
        const float* xf = xs + (HOP + 1) * f;
        for (int n2 = warp; n2 < 25; n2 += THREADS / 32) {
            float2 a[8];
#pragma unroll
            for (int m = 0; m < 8; ++m) {
                const int j = 2 * n2 + 50 * m;  // even, so j and j + 1 share a pad block
                const float* x = xf + padded(j);
                a[m] = make_float2(x[0] * c_window[j], x[1] * c_window[j + 1]);
            }
            dft8(a);
            float2* dst = zs + f * FS + n2;
            dst[0] = a[0];
#pragma unroll
            for (int k1 = 1; k1 < 8; ++k1) dst[25 * k1] = cmul(a[k1], c_tw1[n2][k1]);
        }
    }
    __syncthreads();

    // 3. Stage 2, role k1 = warp: DFT-25 over n2 of y[f][k1][n2] -> Z[k1 + 8 k2].
    {
        const int k1 = warp;
        S2C y[25];
        if (live) {
            const float2* src = zs + f * FS + 25 * k1;
#pragma unroll
            for (int n2 = 0; n2 < 25; ++n2) y[n2] = cpx<S2C>(src[n2].x, src[n2].y);
            dft25(y);
        }
        __syncthreads();  // every read of stage 1's output is done: overwrite in place
        if (live) {
            float2* dst = zs + f * FS + k1;
            @STAGE2_STORES@
        }
    }
    __syncthreads();

    // 4. Untangle the packed halves: 4 |X[k]|^2 and 4 |X[200 - k]|^2 for roles k = warp + 8 i
    // (role 0 also 4 |X[100]|^2 = 4 |Z[100]|^2). Held in registers until every read is done.
    {
        float pk[13], pn[13], p100 = 0.0f;
        const float2* zf = zs + f * FS;
#pragma unroll
        for (int i = 0; i < 13; ++i) {
            const int k = warp + 8 * i;
            if (live && k < POST_ROLES) {
                const float2 zk = zf[k];
                const float2 zn = zf[k == 0 ? 0 : 200 - k];
                const float2 e2 = make_float2(zk.x + zn.x, zk.y - zn.y);  // Z[k] + conj Z[-k]
                const float2 d2 = cmul(make_float2(zk.x - zn.x, zk.y + zn.y), c_tw2[k]);
                const float2 u = cadd(e2, d2), v = csub(e2, d2);
                pk[i] = fmaf(u.x, u.x, u.y * u.y);
                pn[i] = fmaf(v.x, v.x, v.y * v.y);
            }
        }
        if (live && warp == 0) {
            const float2 z = zf[100];
            p100 = 4.0f * fmaf(z.x, z.x, z.y * z.y);
        }
        __syncthreads();
        float* pf = ps + f * FS;
#pragma unroll
        for (int i = 0; i < 13; ++i) {
            const int k = warp + 8 * i;
            if (live && k < POST_ROLES) { pf[k] = pk[i]; pf[200 - k] = pn[i]; }
        }
        if (live && warp == 0) pf[100] = p100;
    }
    __syncthreads();

    // 5. Mel filters (weights written into the code, a band group per warp), log10, into
    // shared memory as [frame][mel].
    if (live) {
        const float* p = ps + f * FS;
        float* lm = xs + f * LM_STRIDE;
        switch (warp) {
        @MEL_CASES@
        }
    }
    __syncthreads();

    // 6. Coalesced copy of the tile's log-mel frames into the ring (frame t at column t % ring).
    const long long t0 = b0 - 1 + j0;
    const int col0 = (int)(((t0 % ring_frames) + ring_frames) % ring_frames);  // t0 may be -1
    for (int e = tid; e < nf * N_MELS; e += THREADS) {
        const int g = e / N_MELS, m = e - g * N_MELS;
        if (t0 + g < 0) continue;
        int col = col0 + g;
        if (col >= ring_frames) col -= ring_frames;
        mel_ring[(slot * ring_frames + col) * N_MELS + m] = xs[g * LM_STRIDE + m];
    }
    if (n_mfcc == 0) return;

    // 7. MFCC: orthonormal DCT-II of each frame's log-mel (coefficient c = warp + 8 i), staged
    // in shared memory, then copied out like the log-mel.
    const int mf_stride = n_mfcc | 1;
    float* mf = ps;
    if (live) {
        for (int c = warp; c < n_mfcc; c += THREADS / 32) {
            const float* d = dct + c * N_MELS;
            const float* v = xs + f * LM_STRIDE;
            float acc = 0.0f;
#pragma unroll 8
            for (int m = 0; m < N_MELS; ++m) acc = fmaf(__ldg(d + m), v[m], acc);
            mf[f * mf_stride + c] = acc;
        }
    }
    __syncthreads();
    for (int e = tid; e < nf * n_mfcc; e += THREADS) {
        const int g = e / n_mfcc, c = e - g * n_mfcc;
        if (t0 + g < 0) continue;
        int col = col0 + g;
        if (col >= ring_frames) col -= ring_frames;
        mfcc_ring[(slot * ring_frames + col) * n_mfcc + c] = mf[g * mf_stride + c];
    }
}

// Roll each row's history on to the last 360 samples of (history + new samples). One block
// per row: everything is read into registers before anything is written.
extern "C" __global__ void captioner_roll(
    const float* __restrict__ samples, const long long* __restrict__ slots,
    float* __restrict__ history, int n_new)
{
    const int r = blockIdx.x;
    float* h = history + slots[r] * HISTORY;
    const float* x_new = samples + (long long)r * n_new;
    float keep0 = 0.0f, keep1 = 0.0f;
    const int k0 = threadIdx.x, k1 = threadIdx.x + blockDim.x;
    if (k0 < HISTORY) { const int e = n_new + k0; keep0 = e < HISTORY ? h[e] : x_new[e - HISTORY]; }
    if (k1 < HISTORY) { const int e = n_new + k1; keep1 = e < HISTORY ? h[e] : x_new[e - HISTORY]; }
    __syncthreads();
    if (k0 < HISTORY) h[k0] = keep0;
    if (k1 < HISTORY) h[k1] = keep1;
}
"""
