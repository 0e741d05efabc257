"""The launch plan of the fused log-mel kernels: block geometry, shared memory, grids, launches.

The host and the kernels' CUDA source share one set of sizes, defined here: frames per block,
threads, the history a stream keeps, the FFT's shape (which fixes a frame's row in shared
memory) and the padded sample layout. :mod:`captioner.gpu.logmel_kernel` writes them into the
source it generates; from them follow the shared memory a block asks for (:func:`shared_bytes`),
the blocks per multiprocessor each precision is compiled for (:data:`MIN_BLOCKS`), the grids of
a push (:func:`grids`) and the launches themselves (:func:`launch`).

Plain Python and NumPy: :func:`launch` calls the compiled kernels it is handed, so this module
neither compiles nor imports CuPy (the CPU tests check the plan).
"""

from __future__ import annotations

import numpy as np

from captioner.gpu.features_ref import HOP, N_FFT

HISTORY = 360  # raw samples a stream keeps between pushes: the oldest its next frame can need

TILE_FRAMES = 32  # frames per block: one per lane, so every warp works on 32 frames at once
WARPS = 8
THREADS = 32 * WARPS
MAX_PUSH_FRAMES = 65535 * TILE_FRAMES  # keeps 160 x frames (samples per row) far inside an int

# The FFT's shape: 200 complex points, z[n1 + 8 n2]; stage 1 is over n2 (DFT-25), stage 2 over
# n1 (DFT-8). A frame's row in shared memory holds them as 8 rows n1 of 25 columns k2.
N_HALF = N_FFT // 2
N1, N2 = 8, 25
FRAME_STRIDE = N_HALF + 1  # float2 per frame row of the FFT work area: odd, so lanes hit distinct banks

PAD_FLOATS = 2  # pad floats per 160 samples: frame rows 162 floats (81 float2, odd) apart
TILE_SAMPLES = HOP * (TILE_FRAMES - 1) + N_FFT  # samples a full block reads: 31 hops and a window
_TILE_FLOATS = TILE_SAMPLES + PAD_FLOATS * (TILE_SAMPLES // HOP)  # the same, padded, in floats


def segment_floats(rem: int) -> int:
    """Shared-memory floats from one packed segment of ``rem`` frames to the next.

    A segment's samples (``160 (rem - 1) + 400``, padded like a tile) take
    ``162 (rem - 1) + 404`` floats; two more when that is an even number of float2, so that
    lanes of different segments, like lanes of one, fall in different banks.
    """
    if not 0 < rem < TILE_FRAMES:
        raise ValueError(f"a packed segment has 1..{TILE_FRAMES - 1} frames, not {rem}")
    floats = (HOP + PAD_FLOATS) * (rem - 1) + N_FFT + 2 * PAD_FLOATS
    return floats + 2 if (floats // 2) % 2 == 0 else floats


# One area serves every stage: the padded samples, then the FFT rows (stage 1 holds its
# results in registers until every warp has read its samples), and at the end of a packed
# block its rows' new histories. About 51 KB: four blocks share an SM's 228 KB.
WORK_BYTES = 16 * -(-max(
    8 * TILE_FRAMES * FRAME_STRIDE,
    4 * _TILE_FLOATS,
    *(4 * (TILE_FRAMES // rem) * segment_floats(rem) for rem in range(1, TILE_FRAMES)),
    4 * TILE_FRAMES * HISTORY,
) // 16)

# Per precision: stage 1's complex type (its arithmetic, and the width of its twiddle table),
# and the blocks per SM the register budget is cut for (the kernels' __launch_bounds__).
STAGE1_TYPES = {"float32": "float2", "mixed": "double2"}
MIN_BLOCKS = {"float32": 4, "mixed": 2}


def tables_in_shared(precision: str) -> bool:
    """Where the kernel reads its window and twiddles: float32 is fastest from constant memory
    (in shared memory they cost registers, and spill); float64 twiddles' constant loads queue up,
    so ``mixed`` reads them from shared memory (docs/decisions/001-gpu-kernels.md)."""
    return precision != "float32"


def shared_bytes(precision: str) -> int:
    """Dynamic shared memory of one block: the work area, then (if there) the tables."""
    if not tables_in_shared(precision):
        return WORK_BYTES
    tw1 = 16 if STAGE1_TYPES[precision] == "double2" else 8
    return WORK_BYTES + 8 * N_HALF + tw1 * N1 * N2 + 8 * N_HALF


def grids(n_rows: int, n_frames: int, n_sms: int) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """The launches of a push on a GPU of ``n_sms`` multiprocessors: full blocks
    ``(rows, n_frames // TILE_FRAMES)`` (``None`` under one tile), and packed blocks for the
    rows' last ``rem = n_frames % TILE_FRAMES`` frames as ``(blocks, rows per block)`` (``None``
    when nothing remains).

    A packed block costs about what a full one does whatever its rows (its lanes run the same
    stages), so rows share blocks up to ``TILE_FRAMES // rem``; but no further than leaves a
    block per multiprocessor, because a block's loads and history roll grow with its rows
    (docs/gpu-validation.md, "The fourth session's changes").
    """
    n_full, rem = divmod(n_frames, TILE_FRAMES)
    full = (n_rows, n_full) if n_full else None
    if not rem:
        return full, None
    per = max(1, min(TILE_FRAMES // rem, n_rows // max(1, n_sms)))
    return full, (-(-n_rows // per), per)


def launch(kernels, common_args: tuple, n_rows: int, n_frames: int, n_sms: int, shared_mem: int) -> None:
    """Queue one push: ``kernels`` are the compiled ``captioner_logmel_fused`` and
    ``captioner_logmel_packed`` (CuPy ``RawModule`` functions), ``common_args`` their shared
    arguments (``samples`` .. ``ring_frames``, see the kernels' ``LOGMEL_ARGS``); the packed kernel
    also takes its rows per block. Launches only what :func:`grids` asks for."""
    fused, packed_kernel = kernels
    full, packed = grids(n_rows, n_frames, n_sms)
    if full is not None:
        fused(full, (THREADS,), common_args, shared_mem=shared_mem)
    if packed is not None:
        blocks, per = packed
        packed_kernel((blocks,), (THREADS,), common_args + (np.int32(per),), shared_mem=shared_mem)
