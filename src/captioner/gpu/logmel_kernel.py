"""The CUDA source of one fused kernel for streaming log-mel: samples in, ring frames out.

Why one kernel: the earlier design (windowed frames cut out to memory, cuFFT, then a mel
pass) moved every frame through HBM three times, which capped its throughput
(docs/gpu-validation.md, "The first session's design"). Here a block reads its stream's samples
once into shared memory and writes only the finished log-mel frames (and the speaker encoder's
bands). What limits it is how many instructions it issues (docs/gpu-validation.md), so the
kernels' layout is chosen to keep every shared-memory address a per-thread base plus a
constant, and every barrier that can go, gone.

The 400-point real FFT is done the textbook way for real input:

* pack the windowed frame ``x`` as 200 complex points ``z[n] = x[2n] + i x[2n+1]``;
* a 200-point complex FFT in two register stages, ``200 = 25 x 8`` (Cooley-Tukey): stage 1
  does 8 DFT-25 (``5 x 5``) over ``z[n1 + 8 n2]`` and multiplies by ``W200^(n1 k2)``, giving
  ``A[n1][k2]``; stage 2 does 25 DFT-8 over ``n1``, giving ``Z[k2 + 25 k1]``;
* untangle the even and odd halves: with ``E = (Z[k] + conj Z[200-k]) / 2`` and
  ``O = (Z[k] - conj Z[200-k]) / 2i``, ``X[k] = E + W400^k O`` and ``X[200-k] = conj(E - W400^k O)``.

``Z[200 - k]`` for ``k = k2 + 25 j`` is ``Z[(25 - k2) + 25 (7 - j)]``: it comes out of the DFT-8
of column ``25 - k2``. So one thread does the DFT-8s of columns ``k2`` and ``25 - k2`` and untangles
their 16 bins in registers; column 0 pairs with itself. It writes the powers into the shared
memory slots it has just read (no other thread reads them), so the bins end up permuted; the mel
code, generated with the bins' slots written in, reads them where they are.

Accuracy: every twiddle and DFT constant is computed in float64 and rounded once, and the
DFT-5 uses Winograd's form, whose cosine part cancels exactly on smooth input. A float32
transform keeps the quietest kept cells of loud frames (7 to 8 decades under the peak) within
1e-4 of a float64 reference at 80 mels but not always at 128 (narrower bands average fewer
bins); ``"mixed"`` precision runs stage 1 in float64 and stays within it, and
:func:`auto_precision` picks between the two by mel count (docs/gpu-validation.md, "Accuracy").
The two scale factors of 1/2 become one exact 1/4 folded into the float32 mel weights, which are
written into the code as constants. Bins 0 and 200 have no mel weight and are not computed.

Speaker bands: with ``speaker_filters`` (the voice encoder's 40 Slaney bands over the same 201
bins, :func:`captioner.gpu.features_ref.speaker_filters`), the mel stage works them out from the
same powers, beside Whisper's bands (the warps' groups take both), ``log10(max(., 1e-10))`` too,
and parks them after the log-mel; they go to a ring of their own. They took the place of 13
MFCC per frame that nothing read (a DCT of the log-mel: 1,040 multiply-adds a frame against
about 400 here).

Layout: a block takes 32 consecutive frames of one stream; lane ``f`` of every warp works on
frame ``f`` and the 8 warps split each stage's roles, so a role's constants are the same across
the warp. Per-frame rows in shared memory have odd strides (in the units they are read in), so
the 32 lanes hit different banks. A stream's first block (the only one that reads its history)
also rolls the history on. When 32 does not divide a push's frames, a second launch packs
the streams' last ``F % 32`` frames, several streams to a block (see
:func:`captioner.gpu.logmel_launch.grids`).

Where the parts live: the kernels' fixed CUDA text is the template ``logmel_kernel.cu``
(package data, read at run time); this module generates what depends on the mel filters and
the precision (the mel code, stage 1, the constant tables) and fills the template in
(:func:`kernel_source`). The sizes it writes in, and how a push is launched, are
:mod:`captioner.gpu.logmel_launch`; :mod:`captioner.gpu.logmel_emulation` runs the same
factorisation, tables and DFT formulas in NumPy, so the CPU tests check the algorithm the
kernel encodes; the GPU tests check the kernel itself.
"""

from __future__ import annotations

import functools
from importlib import resources

import numpy as np

from captioner.gpu.features_ref import HOP, N_FFT, hann_window
from captioner.gpu.logmel_launch import (
    FRAME_STRIDE,
    HISTORY,
    MIN_BLOCKS,
    N1,
    N2,
    N_HALF,
    PAD_FLOATS,
    STAGE1_TYPES,
    THREADS,
    TILE_FRAMES,
    TILE_SAMPLES,
    WARPS,
    WORK_BYTES,
    segment_floats,
    tables_in_shared,
)


def auto_precision(n_mels: int) -> str:
    """The precision ``"auto"`` picks: the fastest that keeps kept cells within 1e-4.

    Measured on the 20 recordings (docs/gpu-validation.md): float32 is at most 6.6e-5 off at
    80 mels but 1.07e-4 at 128, where its narrower top bands average fewer bins; ``mixed`` is
    at most 6.2e-5 off at both.
    """
    return "float32" if n_mels == 80 else "mixed"


def _f32(value: float) -> str:
    """A float32 literal that rounds-trips exactly (9 significant digits)."""
    return f"{float(np.float32(value)):.9e}f"


def _w(n: int, k: int) -> complex:
    """``exp(-2 pi i k / n)`` in float64."""
    return complex(np.exp(-2j * np.pi * k / n))


def stage1_twiddles() -> np.ndarray:
    """``W200^(n1 k2)`` for ``n1 = 0..7``, ``k2 = 0..24``: complex128 ``[8, 25]``."""
    return np.exp(-2j * np.pi * np.outer(np.arange(N1), np.arange(N2)) / N_HALF)


def post_twiddles() -> np.ndarray:
    """``-i W400^k`` for ``k = 0..199`` (``(-sin, -cos)`` of ``2 pi k / 400``): complex128."""
    theta = 2.0 * np.pi * np.arange(N_HALF) / N_FFT
    return -np.sin(theta) - 1j * np.cos(theta)


def power_slot(k: int) -> int:
    """Where the kernel leaves ``4 |X[k]|^2`` (``k = 1..199``): a float offset in a frame's row.

    The thread that untangles bins ``k2 + 25 j`` and ``200 - k2 - 25 j`` (``k2 = 0..12``) writes
    them as the two floats of complex slot ``25 j + k2``, one of the slots it read.
    """
    if not 0 < k < N_HALF:
        raise ValueError(f"bin {k} is not computed")
    j, k2 = divmod(k, N2)
    if k2 == 0:  # column 0: bins 25 j (j <= 4) and 200 - 25 j
        return 2 * N2 * j if j <= 4 else 2 * N2 * (8 - j) + 1
    if k2 <= 12:
        return 2 * (N2 * j + k2)
    k2p = N2 - k2  # bin k = 200 - k2p - 25 j'
    jp = (N_HALF - k - k2p) // N2
    return 2 * (N2 * jp + k2p) + 1


def compact_filters(filters: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Each mel filter's non-zero run as ``(first_bin, weights / 4)`` (float32).

    The factor 1/4 (exact in float32) undoes the two halvings the kernel leaves out of the
    untangling. The kernel has these weights written into its code as constants.
    """
    runs = []
    for row in np.asarray(filters, dtype=np.float32):
        nz = np.flatnonzero(row > 0)
        lo, hi = int(nz[0]), int(nz[-1]) + 1
        if lo == 0 or hi > N_HALF:
            raise ValueError("a mel filter weights bin 0 or 200, which the kernel does not compute")
        runs.append((lo, (row[lo:hi] * np.float32(0.25)).astype(np.float32)))
    return runs


# The DFT formulas' constants, written into the CUDA source here and used by the NumPy twin
# of its arithmetic (logmel_emulation), so both round the same float64 values.
DFT5_K = np.sqrt(5.0) / 4.0  # (cos(2 pi / 5) - cos(4 pi / 5)) / 2
DFT5_S1, DFT5_S2 = np.sin(2 * np.pi / 5), np.sin(4 * np.pi / 5)
DFT8_R2 = np.sqrt(0.5)  # 1 / sqrt(2), of the DFT-8's odd twiddles


def _stage1_cuda(precision: str) -> str:
    """The DFT-25 (``5 x 5``) of ``y[n2]`` and the W200 twiddles, stored to ``dst[k2]``.

    Inner DFT-5 over ``p`` of ``y[q + 5 p]`` -> ``c[q][r]`` (times ``W25^(q r)``) in ``m[q + 5 r]``;
    outer DFT-5 over ``q`` of ``c[q][r]`` -> ``X[r + 5 s]``, times ``W200^(n1 k2)``, rounded once.
    """
    c = STAGE1_TYPES[precision]
    lines = [f"{c} m[25];"]
    for q in range(5):
        names = [f"a{p}" for p in range(5)]
        lines.append("{ " + " ".join(f"{c} a{p} = to<{c}>(y[{q + 5 * p}]);" for p in range(5)))
        lines.append(f"  dft5({', '.join(names)});")
        for r in range(5):
            value = f"a{r}"
            if q and r:
                w = _w(25, q * r)
                value = f"cmul(a{r}, cpx<{c}>({w.real!r}, {w.imag!r}))"
            lines.append(f"  m[{q + 5 * r}] = to<{c}>({value});")
        lines.append("}")
    for r in range(5):
        lines.append("{ " + " ".join(f"{c} b{q} = to<{c}>(m[{q + 5 * r}]);" for q in range(5)))
        lines.append(f"  dft5({', '.join(f'b{q}' for q in range(5))});")
        for s_ in range(5):
            k2 = r + 5 * s_
            value = f"b{s_}" if k2 == 0 else f"cmul(b{s_}, to<{c}>(tw[{k2}]))"
            lines.append(f"  out[{k2}] = to<float2>({value});")
        lines.append("}")
    return "\n        ".join(lines)


# Parking places in a frame's row: 12 consecutive columns of each of the 8 rows n1 hold 24
# floats; value i goes to float (2 N2) (i // 24) + first + i % 24. The kernel has the same rule
# as park() with this first float. Log-mel band m is value m, speaker band k value n_mels + k.
_LM_FIRST = 2 * 13  # columns 13..24
PARK_CAPACITY = N1 * 24  # values a frame's row can park: log-mel and speaker bands together


def _park(i: int, first: int) -> int:
    return 2 * N2 * (i // 24) + first + i % 24


def lm_offset(m: int) -> int:
    """Float offset of log-mel band ``m`` in a frame's row: the free floats of columns 13..24.

    Stage 2 never writes columns ``25 - k2`` (13..24) and the mel stage never reads them, so
    each warp writes its bands there while others still read powers. Band pairs ``(2p, 2p + 1)``
    share one complex slot.
    """
    return _park(m, _LM_FIRST)


def speaker_offset(k: int, n_mels: int) -> int:
    """Float offset of speaker band ``k`` in a frame's row: parked after the ``n_mels`` log-mel
    bands, in the same free columns."""
    return _park(n_mels + k, _LM_FIRST)


def _band_key(first: int, weights: np.ndarray) -> float:
    """Where a band sits once bins ``k`` and ``200 - k`` (one complex slot) are folded together."""
    centre = first + (len(weights) - 1) / 2
    return min(centre, N_HALF - centre)


def _group_cost(runs, bands) -> int:
    slots = {power_slot(first + i) // 2 for m in bands for first, w in [runs[m]] for i in range(len(w))}
    return len(slots) + sum(len(runs[m][1]) + 3 for m in bands)


def _mel_groups(runs) -> list[list[int]]:
    """One group of bands per warp: contiguous in folded position (so a loaded slot usually
    feeds bands of both its bins), split to even out slot loads plus weights."""
    order = sorted(range(len(runs)), key=lambda m: (_band_key(*runs[m]), m))
    n = len(order)
    # best[g][i]: the least possible largest cost splitting order[:i] into g groups
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(WARPS + 1)]
    cut = [[0] * (n + 1) for _ in range(WARPS + 1)]
    best[0][0] = 0
    cost = {}
    for g in range(1, WARPS + 1):
        for i in range(1, n + 1):
            for j in range(g - 1, i):
                if best[g - 1][j] == inf:
                    continue
                if (j, i) not in cost:
                    cost[j, i] = _group_cost(runs, order[j:i])
                value = max(best[g - 1][j], cost[j, i])
                if value < best[g][i]:
                    best[g][i], cut[g][i] = value, j
    groups, i = [], n
    for g in range(WARPS, 0, -1):
        j = cut[g][i]
        groups.append(sorted(order[j:i]))
        i = j
    return groups[::-1]


def _mel_code(filters: np.ndarray) -> str:
    runs = compact_filters(filters)
    cases = []
    for g, bands in enumerate(_mel_groups(runs)):
        body = []
        slots = sorted({power_slot(lo + i) // 2 for m in bands for lo, w in [runs[m]] for i in range(len(w))})
        body.append(" ".join(f"const float2 s{q} = zf[{q}];" for q in slots))
        for m in bands:
            lo, w = runs[m]
            terms = "".join(
                f"a = fmaf({_f32(wk)}, s{power_slot(lo + i) // 2}.{'xy'[power_slot(lo + i) % 2]}, a); "
                for i, wk in enumerate(w)
            )
            body.append(f"float v{m}; {{ float a = 0.0f; {terms}v{m} = __log10f(fmaxf(a, 1e-10f)); }}")
        for m in bands:
            if m % 2 == 0 and m + 1 in bands:
                body.append(f"*reinterpret_cast<float2*>(row + {lm_offset(m)}) = make_float2(v{m}, v{m + 1});")
            elif not (m % 2 == 1 and m - 1 in bands):
                body.append(f"row[{lm_offset(m)}] = v{m};")
        cases.append(f"case {g}: {{\n            " + "\n            ".join(body) + "\n            break; }")
    return "\n        ".join(cases)


def _constants(precision: str) -> str:
    space = "__device__" if tables_in_shared(precision) else "__constant__"
    tw_type = STAGE1_TYPES[precision]
    lit = (lambda v: repr(float(v))) if tw_type == "double2" else _f32
    window = ", ".join(f"{{{_f32(a)}, {_f32(b)}}}" for a, b in hann_window().reshape(-1, 2))
    rows = ", ".join(
        "{" + ", ".join(f"{{{lit(w.real)}, {lit(w.imag)}}}" for w in row) + "}" for row in stage1_twiddles()
    )
    tw2 = ", ".join(f"{{{_f32(w.real)}, {_f32(w.imag)}}}" for w in post_twiddles())
    return (
        f"{space} float2 g_window2[{N_HALF}] = {{{window}}};  // (w[2n], w[2n + 1])\n"
        f"{space} {tw_type} g_tw1[{N1}][{N2}] = {{{rows}}};\n"
        f"{space} float2 g_tw2[{N_HALF}] = {{{tw2}}};\n"
    )


# The template ships as package data beside this module. Its own header (what it is, its
# placeholders) ends at this line and is not part of the kernel source.
_TEMPLATE_FILE = "logmel_kernel.cu"
_TEMPLATE_START = "// ---- end of header: the template starts on the next line ----\n"


@functools.cache
def cuda_template() -> str:
    """The kernels' CUDA text from ``logmel_kernel.cu``, past its header, placeholders unfilled.

    Read once per process (through :mod:`importlib.resources`, so an installed package finds it
    as well as a source tree).
    """
    text = (resources.files("captioner.gpu") / _TEMPLATE_FILE).read_text(encoding="utf-8")
    _header, found, template = text.partition(_TEMPLATE_START)
    if not found:
        raise RuntimeError(f"{_TEMPLATE_FILE} lacks its header's end line {_TEMPLATE_START.strip()!r}")
    return template


def kernel_source(filters: np.ndarray, precision: str = "float32", speaker_filters: np.ndarray | None = None) -> str:
    """CUDA C++ of ``captioner_logmel_fused`` (for these mel filters, and the speaker encoder's
    bands when ``speaker_filters`` are given).

    ``precision``: ``"float32"``, or ``"mixed"`` (stage 1, the DFT-25s and their twiddles, in float64).
    Worked out once per process for each set of filters: the warp grouping of the mel bands is a
    slow dynamic programme, and an engine asks again for every bank of stream slots it adds, each
    time stalling every stream (benchmarks/results/capacity/HISTORY.md, "Where a full step's time
    goes").
    """
    filters = np.ascontiguousarray(filters, dtype=np.float32)
    n_spk = 0
    if speaker_filters is not None:
        speaker_filters = np.asarray(speaker_filters, dtype=np.float32)
        n_spk = speaker_filters.shape[0]
        if speaker_filters.shape[1:] != filters.shape[1:] or n_spk % 2:
            raise ValueError(f"speaker filters must be an even number of rows over the same bins, got {speaker_filters.shape}")
        filters = np.ascontiguousarray(np.concatenate([filters, speaker_filters]))
    return _kernel_source(filters.tobytes(), filters.shape, precision, n_spk)


@functools.lru_cache(maxsize=8)
def _kernel_source(filter_bytes: bytes, shape: tuple[int, ...], precision: str, n_spk: int = 0) -> str:
    filters = np.frombuffer(filter_bytes, dtype=np.float32).reshape(shape)  # Whisper's bands, then the speaker's
    if precision not in STAGE1_TYPES:
        raise ValueError(f"precision must be 'float32' or 'mixed', got {precision!r}")
    n_mels = filters.shape[0] - n_spk
    if n_mels % 2 or n_mels > 128:  # the copy-out moves band pairs, at most two per lane
        raise ValueError(f"the fused kernel takes an even number of mel bands up to 128, got {n_mels}")
    if n_mels + n_spk > PARK_CAPACITY:
        raise ValueError(f"{n_mels} mel and {n_spk} speaker bands do not fit a frame's {PARK_CAPACITY} parking places")
    replacements = {
        "@K5@": repr(float(DFT5_K)), "@S1@": repr(float(DFT5_S1)), "@S2@": repr(float(DFT5_S2)), "@R2@": _f32(DFT8_R2),
        "@TW1_TYPE@": STAGE1_TYPES[precision],
        "@LATE_BARRIER@": "false" if precision == "float32" else "true",
        "@TABLES_IN_SHARED@": "1" if tables_in_shared(precision) else "0",
        "@MIN_BLOCKS@": str(MIN_BLOCKS[precision]),
        "@STAGE1@": _stage1_cuda(precision),
        "@MEL_CASES@": _mel_code(filters), "@N_MELS@": str(n_mels), "@N_SPK@": str(n_spk),
        "@HISTORY@": str(HISTORY), "@HOP@": str(HOP), "@N_FFT@": str(N_FFT), "@PAD@": str(PAD_FLOATS),
        "@TILE@": str(TILE_FRAMES), "@THREADS@": str(THREADS), "@WARPS@": str(WARPS),
        "@WORK_FLOATS@": str(WORK_BYTES // 4), "@N_LOAD@": str(TILE_SAMPLES),
        "@SEGMENT_FLOATS@": ", ".join(str(segment_floats(rem)) for rem in range(1, TILE_FRAMES)),
        "@FRAME_STRIDE@": str(FRAME_STRIDE), "@LM_FIRST@": str(_LM_FIRST), "@PARK_STRIDE@": str(2 * N2),
    }
    source = cuda_template()
    for key, value in replacements.items():
        source = source.replace(key, value)
    source = source.replace("@CONSTANTS@", _constants(precision))
    return source
