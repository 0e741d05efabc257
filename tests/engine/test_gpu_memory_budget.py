"""``--gpu-memory``: ONNX Runtime's arena mode and cap (models/gpu_memory.py) and an engine's own
memory against its budget (engine/memory_budget.py); the server's option is in tests/serve/test_bounds.py."""

from __future__ import annotations

import logging

import pytest

from captioner.engine.admission import Admission, AdmissionConfig, StreamRefused
from captioner.engine.memory_budget import ProcessMemory
from captioner.errors import UserError
from captioner.models import gpu_memory

MIB = 2**20


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv(gpu_memory.ARENA_ENV, raising=False)
    monkeypatch.delenv(gpu_memory.GPU_MEMORY_ENV, raising=False)
    monkeypatch.setattr(gpu_memory, "_shared", {})
    return monkeypatch


def test_the_arena_modes_and_the_budget_are_read_from_the_environment(clean_env):
    assert gpu_memory.arena_mode() == gpu_memory.DEFAULT_ARENA
    assert gpu_memory.budget_bytes() is None
    clean_env.setenv(gpu_memory.ARENA_ENV, "requested")
    assert gpu_memory.provider_options() == {"arena_extend_strategy": "kSameAsRequested"}
    clean_env.setenv(gpu_memory.ARENA_ENV, "doubling")
    assert gpu_memory.provider_options() == {}
    clean_env.setenv(gpu_memory.GPU_MEMORY_ENV, "1.5")
    assert gpu_memory.budget_bytes() == 3 * 2**29
    for name, value, words in ((gpu_memory.ARENA_ENV, "huge", "choose one of doubling, requested, shared"),
                               (gpu_memory.GPU_MEMORY_ENV, "-2", "a positive number"),
                               (gpu_memory.GPU_MEMORY_ENV, "lots", "a positive number")):
        clean_env.setenv(name, value)
        with pytest.raises(UserError) as refused:
            gpu_memory.arena_mode() if name == gpu_memory.ARENA_ENV else gpu_memory.budget_bytes()
        assert words in str(refused.value) and "\n" not in str(refused.value)
        clean_env.delenv(name)


def test_a_shared_arena_the_runtime_cannot_make_leaves_each_session_its_own(clean_env, caplog):
    """The CPU build of ONNX Runtime has no CUDA allocator to register: the sessions keep their
    arenas, and the reason is logged once."""
    import onnxruntime as ort

    clean_env.setenv(gpu_memory.ARENA_ENV, "requested")
    assert not gpu_memory.shared_arena(ort, "CUDAExecutionProvider", 0)  # not asked for
    clean_env.setenv(gpu_memory.ARENA_ENV, "shared")
    with caplog.at_level(logging.WARNING, logger=gpu_memory.__name__):
        assert not gpu_memory.shared_arena(ort, "CUDAExecutionProvider", 0)
        assert not gpu_memory.shared_arena(ort, "CUDAExecutionProvider", 0)
    assert [r.getMessage() for r in caplog.records if "shared ONNX Runtime arena" in r.getMessage()][0].startswith(
        "one shared ONNX Runtime arena on cuda:0 is not available")
    assert len(caplog.records) == 1


def test_the_budget_counts_what_the_engine_holds_where_nvml_cannot(clean_env):
    """No GPU here: NVML counts nothing, so the engine's own pools and buffers stand in, and a
    stream that would leave under 15 % of the budget is refused, naming the engine's budget."""
    held = [60 * MIB]
    memory = ProcessMemory(0, 100 * MIB, lambda: held[0])
    assert memory.memory().free_bytes == 40 * MIB and memory.memory().total_bytes == 100 * MIB
    admission = Admission(AdmissionConfig(gpu_memory_bytes=100 * MIB))
    admission.check_memory("a", memory.memory(), 20 * MIB, 3, " this engine may use")  # 20 MiB left: kept
    held[0] = 70 * MIB
    memory._read_at_s -= 10  # a second later: read again
    with pytest.raises(StreamRefused) as refused:
        admission.check_memory("b", memory.memory(), 20 * MIB, 4, " this engine may use")
    assert "of the 100 MiB this engine may use" in str(refused.value)
    assert admission.refusals == 1
