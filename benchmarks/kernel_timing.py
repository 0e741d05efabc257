"""GPU time of the fused log-mel kernels per push, for the benchmarks (not part of the package).

Imported by the benchmark scripts, which run from the repository root as
``python3 benchmarks/<script>.py`` and so find this module beside them.
"""

from __future__ import annotations


def time_stages(features, n_rows: int, frames: int, repeats: int = 20) -> dict[str, float]:
    """Milliseconds of GPU time per push of the fused kernels (both launches) of a CUDA
    ``StreamingFeatures`` (``features.path`` a ``cuda-fused-*`` one), as ``{"fused": ms}``.

    CUDA events around ``repeats`` pushes queued back to back: events around a single push would
    also count the host's time to queue it. The pushes go straight to the kernels (no copies
    from the host), as streams well past their start (every row at block 10), over rows
    ``0 .. n_rows - 1`` and whatever their device buffers hold; reset those slots afterwards.
    """
    cuda = features._cuda
    if cuda is None:
        raise ValueError(f"time_stages needs the CUDA kernels; this StreamingFeatures runs {features.path}")
    cp = cuda.cp
    start, end = cp.cuda.Event(), cp.cuda.Event()
    with features.backend.activate(), cuda.stream:
        # params_dev holds the rows' slots, their block counts, then the ring column of frame b0 - 1
        cuda.params_dev[:n_rows] = cp.arange(n_rows)
        cuda.params_dev[n_rows : 2 * n_rows] = 10
        cuda.params_dev[2 * n_rows : 3 * n_rows] = 9 % features.ring_frames
        cuda._launch(cuda.samples_dev, n_rows, frames)  # warm-up
        start.record(cuda.stream)
        for _ in range(repeats):
            cuda._launch(cuda.samples_dev, n_rows, frames)
        end.record(cuda.stream)
        end.synchronize()
        total_ms = cp.cuda.get_elapsed_time(start, end)
    return {"fused": total_ms / repeats}
