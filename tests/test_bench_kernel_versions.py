"""benchmarks/bench_kernel_versions.py refuses what it cannot run with one line, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench_loader import load_benchmark


def test_a_missing_baseline_is_one_line_and_exit_2(tmp_path, capsys):
    assert load_benchmark("bench_kernel_versions").main([str(tmp_path / "nope.py")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a file" in err


def test_no_gpu_is_one_line_and_exit_2(capsys):
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
        pytest.skip("a CUDA GPU is here: the benchmark would run")
    except Exception:
        pass
    source = Path(__file__).resolve().parents[1] / "src" / "captioner" / "gpu" / "logmel_kernel.py"
    assert load_benchmark("bench_kernel_versions").main([str(source)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs a CUDA GPU" in err


def test_a_baseline_without_its_own_cuda_text_is_refused():
    # The working tree's logmel_kernel.py reads its template (logmel_kernel.cu) and launch plan
    # from the installed package: as a baseline it would measure the current kernel twice.
    source = Path(__file__).resolve().parents[1] / "src" / "captioner" / "gpu" / "logmel_kernel.py"
    with pytest.raises(ValueError, match="not a self-contained"):
        load_benchmark("bench_kernel_versions")._load(source)
