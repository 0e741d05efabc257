"""A model step's input straight from the feature rings: each stream's window of raw log-mel frames,
padded to the model's width and normalised as Whisper normalises a window, for every stream of a
step in two kernel launches, across all banks of a feature pool.

What it computes is specified by the recognizer's own array code (``WhisperRecognizer._input`` in
:mod:`captioner.engine.whisper`): the window's last ``min(n, width)`` frames, then ``floor``
(``log10(1e-10)``, what Whisper's zero padding becomes) up to ``width``; the window's peak over
all of that; every value clamped to at most ``clamp`` below the peak, then ``(x + offset) * scale``.
The same float32 operations in the same order, so the same bits (the tests hold it to that: on
the CPU under the thread emulation of the tests, on CUDA itself).

Why a kernel: at many streams reading a step's windows (a gather and an index copy per bank, a
transposing copy) and building the batch (a copy per window, four passes over it) were a
noticeable share of the engine thread (benchmarks/results/capacity/HISTORY.md, "kernels that read the
rings").

Layout: kernel 1, one block per window, takes the peak of its frames; kernel 2, one block per
(window, 32 output frames), reads those frames from the ring into shared memory frame by frame
(each frame's bands are contiguous) and writes them band by band (each band's frames are
contiguous in the batch). Called by the thread that owns the GPU; nothing here imports CuPy.
"""

from __future__ import annotations

import numpy as np

from captioner.gpu import nvrtc

ROW_FIELDS = 4
"""int64 parameters per window: ring address (the stream's first ring frame), ring column of the
window's first frame used, frames used (at most the width), unused."""
TILE_FRAMES = 32
MAX_MELS = 128
THREADS = 256

_SOURCE = r"""
#define TILE 32
#define THREADS 256
#define MAX_MELS 128

extern "C" __global__ void __launch_bounds__(THREADS)
captioner_window_peak(const long long* rows, int ring_frames, int n_mels, int width, float floor_value, float* peaks) {
    const long long* row = rows + blockIdx.x * 4;
    const float* ring = reinterpret_cast<const float*>(row[0]);
    const long long first = row[1];
    const int used = (int)row[2];
    __shared__ float best[THREADS];
    float top = used < width ? floor_value : __int_as_float(0xff800000);
    for (int k = threadIdx.x; k < used * n_mels; k += THREADS) {
        const int t = k / n_mels, m = k - t * n_mels;
        top = fmaxf(top, ring[((first + t) % ring_frames) * n_mels + m]);
    }
    best[threadIdx.x] = top;
    __syncthreads();
    for (int half = THREADS / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) best[threadIdx.x] = fmaxf(best[threadIdx.x], best[threadIdx.x + half]);
        __syncthreads();
    }
    if (threadIdx.x == 0) peaks[blockIdx.x] = best[0];
}

extern "C" __global__ void __launch_bounds__(THREADS)
captioner_window_write(const long long* rows, const float* peaks, int ring_frames, int n_mels, int width,
                       int tiles, float floor_value, float clamp, float offset, float scale, float* out) {
    const int window = blockIdx.x / tiles;
    const int t0 = (blockIdx.x - window * tiles) * TILE;
    const long long* row = rows + window * 4;
    const float* ring = reinterpret_cast<const float*>(row[0]);
    const long long first = row[1];
    const int used = (int)row[2];
    const float low = peaks[window] - clamp;
    __shared__ float tile[TILE][MAX_MELS + 1];
    // Read: the tile's frames, each frame's bands contiguous in the ring.
    for (int k = threadIdx.x; k < TILE * n_mels; k += THREADS) {
        const int j = k / n_mels, m = k - j * n_mels;
        const int t = t0 + j;
        tile[j][m] = t < used ? ring[((first + t) % ring_frames) * n_mels + m] : floor_value;
    }
    __syncthreads();
    // Write: band by band, each band's frames contiguous in the batch.
    float* base = out + (long long)window * n_mels * width;
    for (int k = threadIdx.x; k < TILE * n_mels; k += THREADS) {
        const int m = k / TILE, j = k - m * TILE;
        const int t = t0 + j;
        if (t < width) base[(long long)m * width + t] = (fmaxf(tile[j][m], low) + offset) * scale;
    }
}
"""

PEAK_KERNEL, WRITE_KERNEL = "captioner_window_peak", "captioner_window_write"


def kernel_source() -> str:
    return _SOURCE


def compiled(cp):
    """(peak, write), compiled once per process and device."""
    return nvrtc.functions(cp, kernel_source(), (PEAK_KERNEL, WRITE_KERNEL))


def row_table(ring_addresses: np.ndarray, first_cols: np.ndarray, used: np.ndarray) -> np.ndarray:
    """The kernels' [B, ROW_FIELDS] int64 parameters: window b uses ``used[b]`` frames from ring
    column ``first_cols[b]`` on."""
    table = np.zeros((len(used), ROW_FIELDS), dtype=np.int64)
    table[:, 0] = ring_addresses
    table[:, 1] = first_cols
    table[:, 2] = used
    return table


def launch(kernels, table_dev, n_windows: int, ring_frames: int, n_mels: int, width: int, floor_value: float,
           clamp: float, offset: float, scale: float, peaks_dev, out_dev) -> None:
    """Queue both kernels on the current stream: ``out_dev`` [B, n_mels, width] float32 (C order)
    from the windows of ``table_dev``; ``peaks_dev`` [B] float32 scratch."""
    if not 0 < n_mels <= MAX_MELS:
        raise ValueError(f"windows of 1..{MAX_MELS} mel bands, not {n_mels}")
    if n_windows <= 0:
        return
    i32, f32 = np.int32, np.float32
    peak, write = kernels
    tiles = -(-width // TILE_FRAMES)
    peak((n_windows,), (THREADS,), (table_dev, i32(ring_frames), i32(n_mels), i32(width), f32(floor_value), peaks_dev))
    write((n_windows * tiles,), (THREADS,), (table_dev, peaks_dev, i32(ring_frames), i32(n_mels), i32(width), i32(tiles),
                                            f32(floor_value), f32(clamp), f32(offset), f32(scale), out_dev))
