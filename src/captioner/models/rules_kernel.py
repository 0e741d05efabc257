"""The CUDA path of :class:`~captioner.models.device_rules.DeviceRules`: Whisper's token rules,
the greedy choice, the chosen token's log-probability and the row-state update in one kernel
launch per decoder step.

Why a kernel: the array code of ``DeviceRules`` is dozens of CuPy launches per step (masks,
maxima, sums, copies), each costing the engine thread Python and launch time, and the GPU sat
idle most of the time behind them (benchmarks/results/capacity/HISTORY.md, "Where a full step's time
goes"). Here one thread block takes one row of the [B, V] float32 logits and does in registers what the
array code does in passes over memory:

* pass A, over the whole row: the mask of each column (the static suppress list, the blank rule
  at the first token, the timestamp rules from the row's state), and the best (NumPy's argmax
  order: NaN first, ties to the lower column) of three regions: text ``[0, ts)``, timestamps
  ``[ts, te]`` and any columns after ``te``;
* pass B, over the timestamps only, where the row is checked: their log-sum-exp against the best
  text logit decides whether only a timestamp may come (the same float32 formula as the array
  code: ``peak + log(sum(exp(x - peak)))``);
* pass C: ``sum(exp(x - peak))`` over the row as ruled, for the chosen token's log-probability
  ``(x - peak) - log(sum)``, the array code's formula. Sums are of float32 terms in float64, so
  they differ from NumPy's float32 pairwise sums by its rounding only (last ulps).

Thread 0 then writes the token (int64), the log-probability (float32), both as float64 into one
[2, B] array for a single copy to the host, and, where asked, the row's new state.

Nothing here imports CuPy: :func:`compiled` takes the array module it is handed (``xp``, CuPy on
CUDA) and compiles with its ``RawModule`` once per device and process. tests/gpu/test_rules_kernel.py
checks the kernel against the array code on CUDA; tests/models/test_rules_kernel_cpu.py compiles
this very source with a host C++ compiler (a fiber per CUDA thread) and checks it on the CPU.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

THREADS = 1024
"""Threads per block (one block per row): a pass over 51,864 columns is 7 strides of 8 loads in
flight per thread, within the register budget (docs/decisions/001-gpu-kernels.md)."""
ADVANCE_THREADS = 128
"""Threads per block of the state-only kernel (one thread per row)."""
CHOOSE = "captioner_rules_choose"
ADVANCE = "captioner_rules_advance"

LAST_STEP_NONE, LAST_STEP_ALL, LAST_STEP_ROWS = 0, 1, 2
"""How the kernels learn which rows are at their last step: none, all, or per row from a [B]
uint8 array (the only case that needs one on the device)."""

_log = logging.getLogger(__name__)

_SOURCE = r"""
// One thread block per row of [B, V] float32 logits; THREADS is a multiple of 32, at most 1024.
#define THREADS @THREADS@
#define WARPS (THREADS / 32)
#define UNROLL 8
#define NO_INDEX 0x7fffffff
#define FULL_MASK 0xffffffffu

struct Best {
    float value;
    int index;
};

__device__ __forceinline__ float minus_infinity() { return __int_as_float(0xff800000); }

// NumPy's argmax order: NaN above every number, equal values to the lower column.
__device__ __forceinline__ bool beats(float a, int ia, float b, int ib) {
    const bool a_nan = isnan(a), b_nan = isnan(b);
    if (a_nan != b_nan) return a_nan;
    if (!a_nan && a != b) return a > b;
    return ia < ib;
}

__device__ __forceinline__ void take(Best& best, float value, int index) {
    if (beats(value, index, best.value, best.index)) {
        best.value = value;
        best.index = index;
    }
}

__device__ __forceinline__ Best warp_best(Best best) {
    // Lanes whose partner is past the warp get their own value back: a no-op for take().
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float value = __shfl_down_sync(FULL_MASK, best.value, offset);
        const int index = __shfl_down_sync(FULL_MASK, best.index, offset);
        take(best, value, index);
    }
    return best;
}

// Every thread gets the block's best of each of the three regions.
__device__ void block_best3(Best& a, Best& b, Best& c, Best* scratch /* [3 * WARPS] */) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    a = warp_best(a);
    b = warp_best(b);
    c = warp_best(c);
    if (lane == 0) {
        scratch[warp] = a;
        scratch[WARPS + warp] = b;
        scratch[2 * WARPS + warp] = c;
    }
    __syncthreads();
    if (warp == 0) {
        Best none;
        none.value = minus_infinity();
        none.index = NO_INDEX;
        a = lane < WARPS ? scratch[lane] : none;
        b = lane < WARPS ? scratch[WARPS + lane] : none;
        c = lane < WARPS ? scratch[2 * WARPS + lane] : none;
        a = warp_best(a);
        b = warp_best(b);
        c = warp_best(c);
        if (lane == 0) {  // slots only lane 0 read
            scratch[0] = a;
            scratch[WARPS] = b;
            scratch[2 * WARPS] = c;
        }
    }
    __syncthreads();
    a = scratch[0];
    b = scratch[WARPS];
    c = scratch[2 * WARPS];
    __syncthreads();  // the scratch is written again by the next reduction
}

// Every thread gets the block's sum (lane 0 of a shuffle-down tree holds the warp's sum).
__device__ double block_sum(double x, double* scratch /* [WARPS] */) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_down_sync(FULL_MASK, x, offset);
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    if (warp == 0) {
        x = lane < WARPS ? scratch[lane] : 0.0;
        for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_down_sync(FULL_MASK, x, offset);
        if (lane == 0) scratch[0] = x;
    }
    __syncthreads();
    x = scratch[0];
    __syncthreads();
    return x;
}

// What the rules mask in one row, decided once from the row's state.
struct RowRules {
    int ts_begin, ts_end;
    unsigned char bits;  // flag bits that mask this row: 1 always, 2 at the first token
    bool text_all;       // every text token (the first token is a timestamp)
    int text_below;      // text tokens below this (<|endoftext|> after a lone timestamp, else 0)
    bool stamps_all;     // every timestamp (a pair just closed)
    int stamps_below;    // timestamps below this (they never go back)
    int stamps_above;    // timestamps above this (the first one's limit)
};

__device__ __forceinline__ bool masked_at(int c, unsigned char flag, const RowRules& q) {
    if (flag & q.bits) return true;
    if (c < q.ts_begin) return q.text_all || c < q.text_below;
    if (c <= q.ts_end) return q.stamps_all || c < q.stamps_below || c > q.stamps_above;
    return false;
}

// The array code's advance(): a row that took a token other than <|endoftext|> records it; it
// stays active unless it ended or this was its last step.
__device__ __forceinline__ void advance_row(int r, long long token, long long* n_sampled, long long* last,
                                            long long* before_last, long long* last_timestamp,
                                            unsigned char* active, const unsigned char* last_step,
                                            int last_step_mode, int eot, int ts_begin) {
    const bool took = active[r] != 0 && token != (long long)eot;
    if (took) {
        before_last[r] = last[r];
        last[r] = token;
        if (token >= (long long)ts_begin) last_timestamp[r] = token;
        n_sampled[r] += 1;
    }
    const bool final_step = last_step_mode == 1 || (last_step_mode == 2 && last_step[r] != 0);
    active[r] = (took && !final_step) ? 1 : 0;
}

extern "C" __global__ void __launch_bounds__(THREADS) captioner_rules_choose(
    float* logits, const int n_vocab, const unsigned char* flags,
    long long* n_sampled, long long* last, long long* before_last, long long* last_timestamp,
    unsigned char* active, const unsigned char* last_step, const int last_step_mode,
    long long* tokens_out, float* logprobs_out, double* host_out, const int batch,
    const int eot, const int ts_begin, const int ts_end, const int max_initial, const int timestamps,
    const int write_back, const int advance) {
    __shared__ Best best_scratch[3 * WARPS];
    __shared__ double sum_scratch[WARPS];
    const int r = blockIdx.x;
    float* row = logits + (long long)r * n_vocab;

    // The row's state, read by every thread before any barrier (thread 0 rewrites it at the end).
    const long long n = n_sampled[r], row_last = last[r], row_before = before_last[r];
    const long long row_last_ts = last_timestamp[r];
    const bool row_active = active[r] != 0;
    const bool first = n == 0;
    const bool starting = timestamps && row_active && first;
    const bool going = timestamps && row_active && !first;
    const bool last_is_ts = row_last >= ts_begin;
    const long long before = n >= 2 ? row_before : row_last;
    const bool pair_closed = last_is_ts && before >= ts_begin;
    RowRules q;
    q.ts_begin = ts_begin;
    q.ts_end = ts_end;
    q.bits = first ? 3 : 1;
    q.text_all = starting;
    q.text_below = (going && last_is_ts && !pair_closed) ? eot : 0;
    q.stamps_all = going && pair_closed;
    q.stamps_below = (going && row_last_ts >= ts_begin) ? (int)row_last_ts : ts_begin;
    q.stamps_above = starting ? max_initial : ts_end;
    const bool check = going && !pair_closed;

    // Pass A: mask, and the best of each region.
    Best text, stamps, tail;
    text.value = stamps.value = tail.value = minus_infinity();
    text.index = stamps.index = tail.index = NO_INDEX;
    for (int base = threadIdx.x; base < n_vocab; base += UNROLL * THREADS) {
        float x[UNROLL];
        unsigned char flag[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {  // every load first, then the compares
            const int c = base + k * THREADS;
            x[k] = c < n_vocab ? row[c] : 0.0f;
            flag[k] = c < n_vocab ? flags[c] : 0;
        }
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const int c = base + k * THREADS;
            if (c < n_vocab) {
                float value = x[k];
                if (masked_at(c, flag[k], q)) {
                    value = minus_infinity();
                    if (write_back) row[c] = value;
                }
                if (c < ts_begin) take(text, value, c);
                else if (c <= ts_end) take(stamps, value, c);
                else take(tail, value, c);
            }
        }
    }
    block_best3(text, stamps, tail, best_scratch);

    // Pass B: where all timestamps together are likelier than the best text token, only a
    // timestamp may come (raw logits: both sides share the row's normaliser). Block-uniform.
    bool forced = false;
    if (check && isfinite(stamps.value)) {
        double part = 0.0;
        for (int c = ts_begin + threadIdx.x; c <= ts_end; c += THREADS) {
            const float value = masked_at(c, flags[c], q) ? minus_infinity() : row[c];
            part += (double)expf(value - stamps.value);
        }
        const float total = (float)block_sum(part, sum_scratch);
        const float mass = stamps.value + logf(total);
        forced = mass > text.value;
        if (forced && write_back) {
            for (int c = threadIdx.x; c < ts_begin; c += THREADS) row[c] = minus_infinity();
        }
    }

    // The choice: NumPy's argmax over the row as ruled.
    Best chosen = stamps;
    take(chosen, tail.value, tail.index);
    if (!forced) take(chosen, text.value, text.index);

    // Pass C: log_softmax at the chosen token, as token_logprobs() computes it.
    const float peak = chosen.value;
    const float safe_peak = isfinite(peak) ? peak : 0.0f;
    double part = 0.0;
    const int from = forced ? ts_begin : 0;  // forced rows' text is all -inf: exp() adds 0
    for (int base = from + threadIdx.x; base < n_vocab; base += UNROLL * THREADS) {
        float x[UNROLL];
        unsigned char flag[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const int c = base + k * THREADS;
            x[k] = c < n_vocab ? row[c] : 0.0f;
            flag[k] = c < n_vocab ? flags[c] : 0;
        }
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const int c = base + k * THREADS;
            if (c < n_vocab) {
                const float value = masked_at(c, flag[k], q) ? minus_infinity() : x[k];
                part += (double)expf(value - safe_peak);
            }
        }
    }
    const float total = (float)block_sum(part, sum_scratch);
    const float logprob = (peak - safe_peak) - logf(total);

    if (threadIdx.x == 0) {  // every thread read the state before the barriers above
        tokens_out[r] = chosen.index;
        logprobs_out[r] = logprob;
        host_out[r] = (double)chosen.index;
        host_out[batch + r] = (double)logprob;
        if (advance) {
            advance_row(r, chosen.index, n_sampled, last, before_last, last_timestamp, active, last_step,
                        last_step_mode, eot, ts_begin);
        }
    }
}

extern "C" __global__ void captioner_rules_advance(
    const long long* tokens, const int batch,
    long long* n_sampled, long long* last, long long* before_last, long long* last_timestamp,
    unsigned char* active, const unsigned char* last_step, const int last_step_mode,
    const int eot, const int ts_begin) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < batch) {
        advance_row(r, tokens[r], n_sampled, last, before_last, last_timestamp, active, last_step,
                    last_step_mode, eot, ts_begin);
    }
}
"""


def kernel_source(threads: int = THREADS) -> str:
    """The CUDA text, ``threads`` per block of the choosing kernel (a multiple of 32, <= 1024)."""
    if threads % 32 or not 32 <= threads <= 1024:
        raise ValueError(f"threads must be a multiple of 32 up to 1024, not {threads}")
    return _SOURCE.replace("@THREADS@", str(threads))


@dataclass(frozen=True)
class RulesKernels:
    """The two compiled kernels of one device (CuPy ``RawKernel`` objects)."""

    choose: Any
    advance: Any


_lock = threading.Lock()
_compiled: dict[int, RulesKernels | None] = {}
_failures: dict[int, str] = {}


def compiled(xp) -> tuple[RulesKernels | None, str]:
    """The kernels for ``xp``'s current device, compiled once per process and device, and
    ``""``; or ``None`` and why not (``xp`` is not CuPy, or compiling failed; a failure is
    remembered and logged once, and the caller falls back to the array code). Called by the
    thread that drives the runtime, with its device current."""
    if not hasattr(xp, "RawModule") or not hasattr(xp, "cuda"):
        return None, f"{getattr(xp, '__name__', xp)} has no RawModule (not CuPy)"
    device = int(xp.cuda.Device().id)
    with _lock:
        if device in _compiled:
            return _compiled[device], _failures.get(device, "")
        try:
            module = xp.RawModule(code=kernel_source())
            # get_function compiles (RawModule compiles on first use): a failure surfaces here.
            kernels = RulesKernels(choose=module.get_function(CHOOSE), advance=module.get_function(ADVANCE))
        except Exception as error:  # NVRTC missing or refusing the source: the array code stays
            reason = f"the rules kernel did not compile on cuda:{device}: {str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__}"
            _log.warning("%s; the token rules run as CuPy array code", reason)
            _compiled[device], _failures[device] = None, reason
            return None, reason
        _compiled[device] = kernels
        return kernels, ""
