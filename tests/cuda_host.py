"""CUDA kernels' source run on the CPU: the test side of a kernel whose GPU run the CPU cannot make.

No GPU here, so the very text NVRTC compiles on CUDA is compiled with the host C++ compiler under
a small prelude that plays the GPU's part: one fiber (ucontext) per CUDA thread, ``__shared__``
arrays as statics (one block runs at a time), ``__syncthreads`` as a barrier of the block's
fibers and ``__shfl_down_sync`` / ``__shfl_sync`` as exchanges among the 32 fibers of a warp
through a barrier; a barrier that never opens fails the launch. What this checks is a kernel's
algorithm and indexing, its reductions across lanes and warps, and the Python that launches it
(the same argument tuples CuPy gets, NumPy arrays standing in for device arrays).

Used by tests/models/test_rules_kernel_cpu.py (Whisper's token rules) and
tests/engine/test_speech_kernel_cpu.py (the VAD's measures read from the feature rings).
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

PRELUDE = r"""
#include <cmath>
#include <cstring>
#include <functional>
#include <math.h>
#include <ucontext.h>
#include <utility>
#include <vector>

// Every CUDA thread of a block is a fiber (ucontext) of one OS thread; a fiber runs until it
// waits at a barrier, then the next one runs. One block runs at a time.
static ucontext_t scheduler_context;
static std::vector<ucontext_t> fiber_contexts;
static std::vector<char> fiber_stacks;
static std::vector<char> fiber_done;
static int current_fiber = 0;
static std::function<void()> fiber_body;
static long long resumes_left = 0;  // a barrier no thread can pass ends the launch as a failure
static const std::size_t FIBER_STACK_BYTES = 64 * 1024;

struct Dim3 { unsigned x = 0, y = 0, z = 0; };
static Dim3 threadIdx, blockIdx, blockDim;

static void yield_fiber() { swapcontext(&fiber_contexts[current_fiber], &scheduler_context); }

struct Barrier {
    explicit Barrier(int count) : count(count) {}
    void arrive_and_wait() {
        const unsigned generation_now = generation;
        if (++arrived == count) {
            arrived = 0;
            ++generation;
            return;
        }
        while (generation == generation_now) yield_fiber();
    }
    int count, arrived = 0;
    unsigned generation = 0;
};

static Barrier* block_barrier = nullptr;
static std::vector<Barrier> warp_barriers;
static unsigned long long warp_slots[2][32][32];
static unsigned char warp_parity[32][32];

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static

inline void __syncthreads() { block_barrier->arrive_and_wait(); }

inline float __int_as_float(int bits) {
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

// Slots alternate between two sets: a lane writes set p of shuffle k+2 only after every lane has
// passed the barrier of shuffle k+1, so after every read of shuffle k: one barrier per shuffle.
// Every lane offers its value; it gets lane `from`'s (its own where `from` lies outside the warp).
template <class T>
T exchange(T value, int from) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int set = warp_parity[warp][lane];
    warp_parity[warp][lane] ^= 1;
    unsigned long long slot = 0;
    std::memcpy(&slot, &value, sizeof(T));
    warp_slots[set][warp][lane] = slot;
    warp_barriers[warp].arrive_and_wait();
    T out = value;
    if (0 <= from && from < 32) std::memcpy(&out, &warp_slots[set][warp][from], sizeof(T));
    return out;
}

template <class T>
T __shfl_down_sync(unsigned, T value, int offset) { return exchange(value, (threadIdx.x & 31) + offset); }

template <class T>
T __shfl_sync(unsigned, T value, int source_lane) { return exchange(value, source_lane & 31); }

// exp10f, log10f, fmaxf, fabsf: glibc's (g++ defines _GNU_SOURCE).
"""

_DRIVER = r"""
// cuLaunchKernel's convention: params[i] points at the i-th argument's value.
template <class... A, std::size_t... I>
static void call(void (*kernel)(A...), void** params, std::index_sequence<I...>) {
    kernel(*static_cast<A*>(params[I])...);
}

static void fiber_entry() {
    fiber_body();
    fiber_done[current_fiber] = 1;
}  // returns to scheduler_context (uc_link)

// 0, or 1 when some thread waited at a barrier that never opened.
template <class... A>
static int run_grid(void (*kernel)(A...), int blocks, int threads, void** params) {
    blockDim.x = threads;
    Barrier barrier(threads);
    block_barrier = &barrier;
    warp_barriers.assign((threads + 31) / 32, Barrier(32));
    fiber_contexts.resize(threads);
    fiber_stacks.resize(threads * FIBER_STACK_BYTES);
    fiber_done.assign(threads, 0);
    std::memset(warp_parity, 0, sizeof warp_parity);
    fiber_body = [&] { call(kernel, params, std::index_sequence_for<A...>{}); };
    for (int b = 0; b < blocks; ++b) {
        blockIdx.x = b;
        for (int t = 0; t < threads; ++t) {
            getcontext(&fiber_contexts[t]);
            fiber_contexts[t].uc_stack.ss_sp = fiber_stacks.data() + t * FIBER_STACK_BYTES;
            fiber_contexts[t].uc_stack.ss_size = FIBER_STACK_BYTES;
            fiber_contexts[t].uc_link = &scheduler_context;
            makecontext(&fiber_contexts[t], fiber_entry, 0);
            fiber_done[t] = 0;
        }
        resumes_left = 100000LL * threads;
        for (int running = threads; running > 0;) {
            for (int t = 0; t < threads; ++t) {
                if (fiber_done[t]) continue;
                if (--resumes_left < 0) return 1;
                current_fiber = t;
                threadIdx.x = t;
                swapcontext(&scheduler_context, &fiber_contexts[t]);
                if (fiber_done[t]) --running;
            }
        }
    }
    return 0;
}

"""


def driver(kernels: list[str]) -> str:
    """The host side: ``launch(which, blocks, threads, params)`` runs kernel ``kernels[which]``
    over ``blocks`` blocks of ``threads`` fibers; 0, or 1 when a barrier never opened."""
    cases = "\n".join(f"    if (which == {i}) return run_grid({name}, blocks, threads, params);"
                       for i, name in enumerate(kernels))
    return _DRIVER + 'extern "C" int launch(int which, int blocks, int threads, void** params) {\n' + cases + "\n    return 2;\n}\n"


def compiler() -> str:
    """The host C++ compiler (the test skips without one)."""
    found = shutil.which("g++") or shutil.which("clang++")
    if found is None:
        pytest.skip("needs a C++ compiler (g++ or clang++) to run a kernel's source on the CPU")
    return found


def build(folder: Path, name: str, kernel_source: str, kernels: list[str]) -> ctypes.CDLL:
    """``kernel_source`` under the prelude, compiled into ``folder`` and loaded."""
    source = folder / f"{name}.cpp"
    source.write_text(PRELUDE + kernel_source + driver(kernels), encoding="utf-8")
    library = folder / f"{name}.so"
    done = subprocess.run(
        [compiler(), "-std=c++17", "-O2", "-shared", "-fPIC", "-Wno-unknown-pragmas", "-o", str(library), str(source)],
        capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lib = ctypes.CDLL(str(library))
    lib.launch.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    lib.launch.restype = ctypes.c_int
    return lib


class HostKernel:
    """Kernel ``which`` of a host build, called as CuPy calls a ``RawKernel``: ``(grid, block,
    args)``; ``threads`` (when given) overrides the block's size, for builds whose source was
    made with another one."""

    def __init__(self, lib, which: int, threads: int | None = None):
        self.lib, self.which, self.threads = lib, which, threads
        self.launches = 0

    def __call__(self, grid, block, args) -> None:
        threads = self.threads if self.threads is not None else int(block[0])
        values = []
        for arg in args:
            if isinstance(arg, np.ndarray):
                assert arg.flags.c_contiguous, "the kernel indexes arrays as contiguous"
                values.append(ctypes.c_void_p(arg.ctypes.data))
            elif isinstance(arg, np.int32):
                values.append(ctypes.c_int(int(arg)))
            elif isinstance(arg, np.float32):
                values.append(ctypes.c_float(float(arg)))
            else:  # CuPy would pass a Python int as 64 bits: the kernel's int would read garbage
                raise TypeError(f"kernel argument of type {type(arg).__name__}: pass np.int32, np.float32 or an array")
        params = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
        assert self.lib.launch(self.which, int(grid[0]), threads, params) == 0, "a barrier never opened"
        self.launches += 1
