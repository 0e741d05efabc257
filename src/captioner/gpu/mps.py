"""Whether NVIDIA's Multi-Process Service (MPS) is running for this user's processes.

Engines in separate processes on one GPU take turns on it (time-slicing) unless MPS runs:
without it two engines held fewer connections than one, with it three held the whole test
(benchmarks/results/serve/HISTORY.md, "two engines on one GPU" and "Three engines on one GPU with MPS").
The check reads the control daemon's pipe directory, as CUDA's own clients find it; it loads no library
and never raises."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_PIPE_DIRECTORY = "/tmp/nvidia-mps"
"""Where ``nvidia-cuda-mps-control -d`` puts its control pipe unless ``CUDA_MPS_PIPE_DIRECTORY`` says."""


def mps_pipe_directory() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIRECTORY)


def mps_running() -> bool:
    """Whether an MPS control daemon's pipe is where this process's CUDA clients will look."""
    try:
        return (mps_pipe_directory() / "control").exists()
    except OSError:
        return False
