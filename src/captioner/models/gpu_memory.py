"""How ONNX Runtime holds the model's GPU memory: the arena's growth, one arena per GPU, a cap.

ONNX Runtime gives every CUDA session an arena of its own that grows to the next power of two
of what a run asks for (its default). An engine opens some ten sessions (encoder, cross K/V,
decoder step and prefill per audio context, row gathering), so arenas sized by doubling add up
(docs/gpu-memory.md). ``CAPTIONER_ORT_ARENA`` chooses:

- ``shared`` (the default): one arena on each GPU for every session of the process, grown by
  what is asked and capped at ``CAPTIONER_GPU_MEMORY_GIB`` when that is set (ONNX Runtime's
  environment allocator, ``session.use_env_allocators``); the least memory of the three, the
  same tokens (docs/gpu-memory.md);
- ``requested``: each session's own arena, grown by what is asked;
- ``doubling``: ONNX Runtime's own default, each session's own arena.

Read in the process that opens the sessions (a model host inherits the variables).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from captioner.errors import UserError

log = logging.getLogger(__name__)

ARENA_ENV = "CAPTIONER_ORT_ARENA"
GPU_MEMORY_ENV = "CAPTIONER_GPU_MEMORY_GIB"
ARENA_MODES = ("doubling", "requested", "shared")
DEFAULT_ARENA = "shared"

_shared: dict[tuple[str, int], bool] = {}


def arena_mode() -> str:
    """The arena mode the environment asks for (:data:`ARENA_MODES`); UserError for another."""
    mode = os.environ.get(ARENA_ENV, "").strip().lower() or DEFAULT_ARENA
    if mode not in ARENA_MODES:
        raise UserError(f"{ARENA_ENV}={mode!r}: choose one of {', '.join(ARENA_MODES)}")
    return mode


def budget_bytes() -> int | None:
    """The GPU memory one engine process may use (``CAPTIONER_GPU_MEMORY_GIB``), in bytes;
    ``None`` when unset. UserError for anything but a positive number."""
    text = os.environ.get(GPU_MEMORY_ENV, "").strip()
    return parse_gib(text, GPU_MEMORY_ENV) if text else None


def parse_gib(text: str, what: str = "--gpu-memory") -> int:
    """``text`` GiB in bytes; UserError naming ``what`` for anything but a positive number."""
    try:
        gib = float(text)
    except ValueError:
        gib = -1.0
    if not 0 < gib < 2**20:
        raise UserError(f"{what}={text!r}: give the GPU memory in GiB, a positive number (e.g. 6)")
    return int(gib * 2**30)


def use_budget(text: str) -> int:
    """``--gpu-memory GIB`` for this process and the engine processes it starts: the budget in
    the environment, on the shared arena (unless ``CAPTIONER_ORT_ARENA`` says otherwise), so
    ONNX Runtime's memory is capped there. Returns the budget in bytes."""
    limit = parse_gib(text)
    os.environ[GPU_MEMORY_ENV] = text.strip()
    os.environ.setdefault(ARENA_ENV, "shared")
    arena_mode()  # a bad CAPTIONER_ORT_ARENA is the command's one-line error, not a model host's
    return limit


def provider_options() -> dict[str, Any]:
    """The CUDA provider's options for the arena mode (for sessions not on the shared arena)."""
    return {} if arena_mode() == "doubling" else {"arena_extend_strategy": "kSameAsRequested"}


def shared_arena(ort, provider: str, device_id: int) -> bool:
    """Whether sessions on ``device_id`` take their memory from the process's shared arena:
    registered with ONNX Runtime's environment on first use in ``shared`` mode. A build that
    refuses it is logged once and its sessions keep arenas of their own."""
    if arena_mode() != "shared":
        return False
    key = (provider, device_id)
    if key not in _shared:
        _shared[key] = _register(ort, provider, device_id)
    return _shared[key]


def _register(ort, provider: str, device_id: int) -> bool:
    limit = budget_bytes() or 0  # 0: ONNX Runtime's own default, no cap
    try:
        info = ort.OrtMemoryInfo("Cuda", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, device_id, ort.OrtMemType.DEFAULT)
        arena = ort.OrtArenaCfg({"max_mem": limit, "arena_extend_strategy": 1})  # 1: kSameAsRequested
        ort.create_and_register_allocator_v2(provider, info, {"device_id": str(device_id)}, arena)
    except Exception as error:  # an ONNX Runtime without environment allocators for this provider
        log.warning("one shared ONNX Runtime arena on cuda:%d is not available (%s); each session keeps its own",
                    device_id, str(error).splitlines()[0] if str(error) else type(error).__name__)
        return False
    return True
