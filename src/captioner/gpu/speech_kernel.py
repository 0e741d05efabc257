"""The VAD's two measures of each new log-mel frame, read straight from the feature rings: one
CUDA kernel launch for every stream of a push, across all banks of a feature pool.

What it computes is specified by :func:`captioner.engine.vad.band_energy_db` (the speech band's
energy in dB re a full-scale sine) and :func:`captioner.engine.vad.spectral_change_db` (how much
the band's spectral shape changed against the frame ``lag`` earlier, level changes removed):
the NumPy path of the engine runs those on frames gathered from the rings, and the tests hold
this kernel to them (on the CPU under the thread emulation of the tests, on CUDA itself).

Why a kernel: at many streams the array-code VAD was a large share of the engine thread, most
of it gathering frames (one indexed copy per bank and group of streams, a dozen array operations
per group; benchmarks/results/capacity/HISTORY.md, "kernels that read the rings"). Here every row of a
push (any number of frames each, any bank) is one launch; its parameters go over in one copy and only
two floats per frame come back.

Layout: one warp per (stream, frame); each lane holds up to four bands of the frame and of the
frame ``lag`` before it, and warp shuffles do the band sums and maxima. A row's earlier frames
before the first it may read (a stream's start) are that first frame, as the NumPy path pads.

Called by the thread that owns the GPU (the engine's); nothing here imports CuPy: the array
module is passed in.
"""

from __future__ import annotations

import numpy as np

from captioner.gpu import nvrtc

ROW_FIELDS = 6
"""int64 parameters per row: ring address (the stream's first ring frame), ring column of the
first frame to judge, frames to judge, frames readable before it (at most ``lag``), output
offset, unused."""
WARPS_PER_BLOCK = 8
MAX_BAND = 128
"""Bands a warp holds: four per lane."""

_SOURCE = r"""
// One warp per (row, frame). rows[r * 6 + k]: ring address, first column, frames, frames back,
// output offset. The ring of a stream is [ring_frames, n_mels] float32, raw log10 mel.
#define WARPS {warps}

// NVRTC has no <cmath>: INFINITY spelt out.
__device__ __forceinline__ float minus_infinity() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
    return __shfl_sync(0xffffffffu, v, 0);
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, offset));
    return __shfl_sync(0xffffffffu, v, 0);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
captioner_speech_measures(const long long* rows, int n_rows, int total, int ring_frames, int n_mels,
                          int band_first, int band_stop, int lag, float floor_log10, float full_scale_db,
                          float* energy_out, float* change_out) {
    const int lane = threadIdx.x & 31;
    const int frame = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (frame >= total) return;  // a whole warp leaves together: the shuffles below stay full
    // The row whose outputs hold this frame: the last with offset <= frame (offsets ascend).
    int lo = 0, hi = n_rows - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (rows[mid * 6 + 4] <= frame) lo = mid; else hi = mid - 1;
    }
    const long long* row = rows + lo * 6;
    const float* ring = reinterpret_cast<const float*>(row[0]);
    const int i = frame - (int)row[4];
    const long long first = row[1], back = row[3];
    const long long now_col = (first + i) % ring_frames;
    long long before = i - lag;
    if (before < -back) before = -back;  // frames before the stream stand in as its first
    const long long before_col = ((first + before) % ring_frames + ring_frames) % ring_frames;
    const float* now = ring + now_col * n_mels + band_first;
    const float* old = ring + before_col * n_mels + band_first;
    const int width = band_stop - band_first;

    float x[4], y[4];
    float power = 0.0f, top_now = minus_infinity(), top_old = minus_infinity();
    for (int k = 0; k < 4; ++k) {
        const int band = lane + 32 * k;
        x[k] = band < width ? now[band] : minus_infinity();
        y[k] = band < width ? old[band] : minus_infinity();
        if (band < width) power += exp10f(x[k]);
        top_now = fmaxf(top_now, x[k]);
        top_old = fmaxf(top_old, y[k]);
    }
    power = warp_sum(power);
    top_now = warp_max(top_now);
    top_old = warp_max(top_old);
    // Each frame's bands held to at most `floor_log10` below its loudest, then compared.
    float diff[4], diff_sum = 0.0f;
    for (int k = 0; k < 4; ++k) {
        const bool inside = lane + 32 * k < width;
        diff[k] = inside ? fmaxf(x[k], top_now - floor_log10) - fmaxf(y[k], top_old - floor_log10) : 0.0f;
        diff_sum += diff[k];
    }
    const float mean_diff = warp_sum(diff_sum) / width;
    float spread = 0.0f;
    for (int k = 0; k < 4; ++k) {
        if (lane + 32 * k < width) spread += fabsf(diff[k] - mean_diff);
    }
    spread = warp_sum(spread);
    if (lane == 0) {
        const int out = (int)row[4] + i;
        energy_out[out] = 10.0f * log10f(fmaxf(power / width, 1e-10f)) - full_scale_db;
        change_out[out] = spread / width * 10.0f;
    }
}
"""


def kernel_source(warps: int = WARPS_PER_BLOCK) -> str:
    """The CUDA source (``warps`` warps, so frames, per block)."""
    return _SOURCE.replace("{warps}", str(int(warps)))


KERNEL_NAME = "captioner_speech_measures"


def compiled(cp):
    """The kernel, compiled once per process and device."""
    return nvrtc.functions(cp, kernel_source(), (KERNEL_NAME,))[0]


def row_table(ring_addresses: np.ndarray, first_cols: np.ndarray, counts: np.ndarray,
              backs: np.ndarray) -> tuple[np.ndarray, int]:
    """The kernel's [R, ROW_FIELDS] int64 parameters of rows that judge ``counts[r]`` frames from
    ring column ``first_cols[r]`` with ``backs[r]`` frames readable before it, and the total
    number of frames (outputs): row r's frames are outputs ``offset[r] .. offset[r] + counts[r]``."""
    counts = np.asarray(counts, dtype=np.int64)
    table = np.zeros((counts.size, ROW_FIELDS), dtype=np.int64)
    table[:, 0] = ring_addresses
    table[:, 1] = first_cols
    table[:, 2] = counts
    table[:, 3] = backs
    ends = np.cumsum(counts)
    table[:, 4] = ends - counts
    return table, int(ends[-1]) if ends.size else 0


def launch(kernel, table_dev, n_rows: int, total: int, ring_frames: int, n_mels: int, band: tuple[int, int],
           lag: int, range_db: float, full_scale_db: float, energy_dev, change_dev) -> None:
    """Queue the kernel on the current stream: ``table_dev`` the device copy of
    :func:`row_table`, outputs into ``energy_dev``/``change_dev`` (float32, ``total`` each)."""
    first, stop = band
    if not 0 < stop - first <= MAX_BAND:
        raise ValueError(f"the speech band must hold 1..{MAX_BAND} mel bands, not {stop - first}")
    if total <= 0:
        return
    i32, f32 = np.int32, np.float32
    blocks = -(-total // WARPS_PER_BLOCK)
    kernel((blocks,), (WARPS_PER_BLOCK * 32,),
           (table_dev, i32(n_rows), i32(total), i32(ring_frames), i32(n_mels), i32(first), i32(stop), i32(lag),
            f32(range_db / 10.0), f32(full_scale_db), energy_dev, change_dev))
