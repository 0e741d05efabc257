"""Whisper's token rules, greedy choice and the chosen token's log-probability as array code over
a whole batch, written once for any NumPy-like module ``xp`` (NumPy on the CPU, CuPy on a GPU).

:class:`~captioner.models.decoding.LogitRules` is the specification: it walks the rows and their
token lists in Python. Here the same rules are masks built from per-row state arrays (how many
tokens a row has sampled, its last two tokens, its last timestamp), so the logits are ruled on
where they lie and only the chosen token ids and their log-probabilities ([B] each) have to
reach the host. tests/models/test_device_rules.py holds the two to the same tokens.

On CUDA the same rules, the greedy choice, the log-probability and the row-state update run as
one kernel launch per decoder step (:mod:`captioner.models.rules_kernel`) instead of dozens of
array operations; the array code stays the path of NumPy, the fallback when the kernel does not
compile, and, with ``CAPTIONER_RULES_KERNEL=0`` (or ``kernel=False``), the CUDA path to compare
against. tests/gpu/test_rules_kernel.py holds the two to the same tokens on CUDA.

The caller is the thread that drives the runtime (the GPU worker, or the CLI's main thread);
nothing here imports a GPU library: the module to compute with is passed in.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from captioner.models import rules_kernel
from captioner.models.tokenizer import TIME_PRECISION_S

KERNEL_ENV = "CAPTIONER_RULES_KERNEL"
"""Set to ``0`` (or ``off``, ``no``, ``false``) to run the rules on CUDA as CuPy array code rather
than as the kernel: the two side by side, or a way round a kernel fault."""

SUPPRESS_FLAG, BEGIN_FLAG = 1, 2
"""Bits of the kernel's per-token flags: masked always, masked at a row's first token."""


def to_host(array) -> np.ndarray:
    """A NumPy copy of a NumPy or device array (CuPy arrays have ``get``)."""
    return array.get() if hasattr(array, "get") else np.asarray(array)


def token_logprobs(xp, logits, tokens):
    """``log_softmax(logits)[b, tokens[b]]`` per row, the same operations as
    ``decoding._token_logprobs`` (so NumPy gives the very same float32 values)."""
    peak = xp.max(logits, axis=-1, keepdims=True)
    peak = xp.where(xp.isfinite(peak), peak, xp.float32(0.0))
    total = xp.sum(xp.exp(logits - peak), axis=-1)
    picked = xp.take_along_axis(logits, tokens.reshape(-1, 1), axis=-1)[:, 0]
    return picked - peak[:, 0] - xp.log(total)


class RuleTokens(NamedTuple):
    """The token ids and switches of one decode call's rules: the one table ``LogitRules`` (row
    by row) and ``DeviceRules`` (vectorised) both read, so their logic may differ in form but
    never in the tokens it is about."""

    eot: int
    no_timestamps: int
    ts_begin: int
    ts_end: int  # the last timestamp token the logits have
    timestamps: bool
    max_initial: int  # the latest timestamp token allowed first


def rule_tokens(tokenizer, options, n_vocab: int) -> RuleTokens:
    special = tokenizer.special
    index = int(round(options.max_initial_timestamp_s / TIME_PRECISION_S))
    return RuleTokens(eot=special.eot, no_timestamps=special.no_timestamps, ts_begin=special.timestamp_begin,
                      ts_end=min(special.timestamp_end, n_vocab - 1), timestamps=not options.without_timestamps,
                      max_initial=special.timestamp_begin + index)


@dataclass
class RowState:
    """What the rules need to know of each row's sampled tokens, as [B] arrays on ``xp``'s
    device: ``n`` tokens sampled, the ``last`` and the one before it (``-1``: none), the most
    recent timestamp (``-1``: none) and whether the row still decodes."""

    n: Any
    last: Any
    before_last: Any
    last_timestamp: Any
    active: Any


class DeviceRules:
    """The rules of one decode call (same options as ``LogitRules``) over [B, V] logits."""

    def __init__(self, xp, tokenizer, options, n_vocab: int, kernel: Any = None):
        """``kernel``: ``None`` picks the rules kernel where ``xp`` is CuPy and it compiles (unless
        ``CAPTIONER_RULES_KERNEL=0``), else the array code; ``False`` always the array code;
        ``True`` the kernel or a ``RuntimeError`` saying why not; or kernels to launch (objects
        with ``choose`` and ``advance`` called as CuPy's ``RawKernel``: ``(grid, block, args)``),
        which is how the CPU tests run the kernel's source compiled for the host."""
        self.xp = xp
        self.n_vocab = int(n_vocab)
        (self.eot, self.no_timestamps, self.ts_begin, self.ts_end, self.timestamps,
         self.max_initial) = rule_tokens(tokenizer, options, n_vocab)
        suppress = np.zeros(n_vocab, dtype=bool)
        if options.suppress_tokens:
            suppress[list(tokenizer.suppress_ids)] = True
        begin = np.zeros(n_vocab, dtype=bool)
        if options.suppress_blank:
            begin[list(tokenizer.suppress_ids_begin)] = True
        if self.timestamps:
            # <|notimestamps|> is ruled out for every decoding row; folding it into the static
            # list also rules it out for finished rows, whose choices are never read.
            suppress[self.no_timestamps] = True
        self.kernels = self._pick_kernels(kernel)
        if self.kernels is not None:
            # The kernel reads one byte per token; made and moved to the device once per call.
            flags = suppress.astype(np.uint8) * SUPPRESS_FLAG + begin.astype(np.uint8) * BEGIN_FLAG
            self.flags = xp.asarray(flags)
            self._buffers: dict[int, tuple] = {}
            return
        # Made once per call and moved to the device once: [1, V] masks and column numbers.
        self.suppress = xp.asarray(suppress[None, :])
        self.begin = xp.asarray(begin[None, :])
        self.any_begin = bool(begin.any())
        self.columns = xp.arange(n_vocab, dtype=xp.int64)[None, :]

    def _pick_kernels(self, kernel):
        """The kernels to launch, or ``None`` for the array code (see ``__init__``)."""
        if kernel is False:
            return None
        if kernel is not None and kernel is not True:
            return kernel
        if not 0 < self.ts_begin <= self.ts_end < self.n_vocab:
            # The kernel's three regions need text, then timestamps; no Whisper vocabulary lacks them.
            if kernel:
                raise RuntimeError("the rules kernel needs timestamp tokens after the text tokens")
            return None
        if kernel is None and os.environ.get(KERNEL_ENV, "").strip().lower() in ("0", "off", "no", "false"):
            return None
        found, why = rules_kernel.compiled(self.xp)
        if found is None and kernel:
            raise RuntimeError(why)
        return found

    @property
    def uses_kernel(self) -> bool:
        """Whether the rules run as the kernel (else as array code)."""
        return self.kernels is not None

    def new_state(self, batch: int, prefixes=None) -> RowState:
        """Every row still decoding, having sampled nothing, or (``prefixes``: one token list per
        row) its prefix: the rules then go on as after those tokens."""
        xp = self.xp
        if prefixes is None or not any(len(p) for p in prefixes):
            none = xp.full((batch,), -1, dtype=xp.int64)
            return RowState(
                n=xp.zeros((batch,), dtype=xp.int64), last=none, before_last=none.copy(),
                last_timestamp=none.copy(), active=xp.ones((batch,), dtype=bool),
            )
        if len(prefixes) != batch:
            raise ValueError("new_state needs one prefix per row")
        rows = np.full((4, batch), -1, dtype=np.int64)
        for b, prefix in enumerate(prefixes):
            prefix = [int(t) for t in prefix]
            rows[0, b] = len(prefix)
            if prefix:
                rows[1, b] = prefix[-1]
            if len(prefix) > 1:
                rows[2, b] = prefix[-2]
            stamps = [t for t in prefix if t >= self.ts_begin]
            if stamps:
                rows[3, b] = stamps[-1]
        n, last, before_last, last_timestamp = (xp.asarray(np.ascontiguousarray(r)) for r in rows)
        return RowState(n=n, last=last, before_last=before_last, last_timestamp=last_timestamp,
                        active=xp.ones((batch,), dtype=bool))

    def apply(self, logits, state: RowState) -> None:
        """Mask ``logits`` [B, V] (float32, on ``xp``'s device) in place, as
        ``LogitRules.apply(logits, sampled, active)`` does for the same rows."""
        if self.kernels is not None:
            self._launch(logits, state, write_back=True)
            return
        xp = self.xp
        cols = self.columns
        first = state.n == 0
        masked = self.suppress
        if self.any_begin:
            masked = masked | (first[:, None] & self.begin)
        if self.timestamps:
            ts, te = self.ts_begin, self.ts_end
            active = state.active
            last_is_ts = state.last >= ts
            before = xp.where(state.n >= 2, state.before_last, state.last)
            pair_closed = last_is_ts & (before >= ts)
            starting = active & first
            going = active & ~first
            is_ts = (cols >= ts) & (cols <= te)
            # First token: a timestamp, none later than max_initial.
            late = (cols > self.max_initial) & (cols <= te)
            masked = masked | (starting[:, None] & ((cols < ts) | late))
            # After a pair only text (or the end); after a lone timestamp its partner or the end.
            masked = masked | ((going & pair_closed)[:, None] & is_ts)
            lone = going & last_is_ts & ~pair_closed
            masked = masked | (lone[:, None] & (cols < self.eot))
            # Timestamps never go back: none before the row's last one.
            back = going & (state.last_timestamp >= ts)
            masked = masked | (back[:, None] & is_ts & (cols < state.last_timestamp[:, None]))
            xp.copyto(logits, xp.float32(-np.inf), where=masked)
            self._force_timestamps(logits, going & ~pair_closed)
        else:
            xp.copyto(logits, xp.float32(-np.inf), where=masked)

    def _force_timestamps(self, logits, check) -> None:
        """Where all timestamps together are likelier than the best text token, only a
        timestamp may come (compared on raw logits: both sides share the row's normaliser)."""
        xp = self.xp
        ts, te = self.ts_begin, self.ts_end
        stamps = logits[:, ts:te + 1]
        peak = xp.max(stamps, axis=-1)
        finite = xp.isfinite(peak)
        safe_peak = xp.where(finite, peak, xp.float32(0.0))
        total = xp.sum(xp.exp(stamps - safe_peak[:, None]), axis=-1)
        # Rows with every timestamp masked have nothing to sum; they are never forced.
        mass = safe_peak + xp.log(xp.where(finite, total, xp.float32(1.0)))
        force = check & finite & (mass > xp.max(logits[:, :ts], axis=-1))
        xp.copyto(logits[:, :ts], xp.float32(-np.inf), where=force[:, None])

    def choose(self, logits, state: RowState):
        """Rules, argmax and log-probability: ([B] int64 tokens, [B] float32 log-probabilities)
        on ``xp``'s device. The array code masks ``logits`` in place; the kernel leaves them."""
        xp = self.xp
        if self.kernels is not None:
            tokens, logprobs, _pair = self._launch(logits, state)
            return tokens, logprobs
        self.apply(logits, state)
        tokens = xp.argmax(logits, axis=-1).astype(xp.int64)
        return tokens, token_logprobs(xp, logits, tokens)

    def choose_and_advance(self, logits, state: RowState, last_step) -> np.ndarray:
        """One greedy step: :meth:`choose`, then :meth:`advance` with the chosen tokens; returns
        the tokens and their log-probabilities as one host array [2, B] float64 (one copy from
        the device). With the kernel all of it is one launch."""
        if self.kernels is not None:
            _tokens, _logprobs, pair = self._launch(logits, state, last_step=last_step, reuse=True)
            return to_host(pair)
        xp = self.xp
        tokens, logprobs = self.choose(logits, state)
        both = to_host(xp.stack([tokens.astype(xp.float64), logprobs.astype(xp.float64)]))
        self.advance(state, tokens, last_step if _on_device(xp, last_step) else xp.asarray(last_step))
        return both

    def _outputs(self, batch: int, reuse: bool) -> tuple:
        """Tokens [B] int64, log-probabilities [B] float32 and both [2, B] float64: new arrays, or
        (``reuse``: the caller keeps none of them past the step) the ones kept for this size."""
        xp = self.xp
        kept = self._buffers.get(batch) if reuse else None
        if kept is None:
            kept = (xp.empty((batch,), dtype=xp.int64), xp.empty((batch,), dtype=xp.float32),
                    xp.empty((2, batch), dtype=xp.float64))
            if reuse:
                self._buffers[batch] = kept
        return kept

    def _last_step_arg(self, state: RowState, last_step, batch: int) -> tuple[Any, int]:
        """(a [B] uint8 device array, mode) telling the kernels which rows end after this step;
        only a mix of ending and going rows needs the array (else any array stands in)."""
        xp = self.xp
        if last_step is None:
            return state.active, rules_kernel.LAST_STEP_NONE
        if _on_device(xp, last_step):
            rows = xp.ascontiguousarray(xp.broadcast_to(last_step, (batch,)).astype(xp.uint8))
            return rows, rules_kernel.LAST_STEP_ROWS
        ending = np.asarray(last_step, dtype=bool)
        if ending.ndim == 0 or ending.all() or not ending.any():
            mode = rules_kernel.LAST_STEP_ALL if ending.all() else rules_kernel.LAST_STEP_NONE
            return state.active, mode
        return xp.asarray(np.broadcast_to(ending, (batch,)).astype(np.uint8)), rules_kernel.LAST_STEP_ROWS

    def _launch(self, logits, state: RowState, *, write_back: bool = False, last_step=None, reuse: bool = False):
        """One launch of the choosing kernel over ``logits`` [B, V]: (tokens, log-probabilities,
        both as [2, B] float64). ``write_back``: mask ``logits`` in place as :meth:`apply` does;
        ``last_step`` (not ``None``): also advance ``state`` in place."""
        xp = self.xp
        batch = int(logits.shape[0])
        if logits.ndim != 2 or int(logits.shape[1]) != self.n_vocab:
            raise ValueError(f"logits must be [B, {self.n_vocab}], not {tuple(logits.shape)}")
        work = logits
        if work.dtype != xp.float32 or not work.flags.c_contiguous:
            work = xp.ascontiguousarray(logits, dtype=xp.float32)
        tokens, logprobs, pair = self._outputs(batch, reuse)
        if batch == 0:
            return tokens, logprobs, pair
        ending, mode = self._last_step_arg(state, last_step, batch)
        i32 = np.int32
        self.kernels.choose((batch,), (rules_kernel.THREADS,), (
            work, i32(self.n_vocab), self.flags,
            state.n, state.last, state.before_last, state.last_timestamp, state.active, ending, i32(mode),
            tokens, logprobs, pair, i32(batch),
            i32(self.eot), i32(self.ts_begin), i32(self.ts_end), i32(self.max_initial), i32(self.timestamps),
            i32(write_back), i32(last_step is not None),
        ))
        if write_back and work is not logits:
            logits[...] = work
        return tokens, logprobs, pair

    def take(self, state: RowState, rows) -> RowState:
        """The state of only ``rows`` (indices, on ``xp``'s device), in that order."""
        return RowState(n=state.n[rows], last=state.last[rows], before_last=state.before_last[rows],
                        last_timestamp=state.last_timestamp[rows], active=state.active[rows])

    def advance(self, state: RowState, tokens, last_step) -> None:
        """Record the tokens just chosen for the rows still decoding; a row ends on
        ``<|endoftext|>`` or at its last allowed step (``last_step``: one for all rows, or [B]).
        The kernel updates ``state``'s arrays in place, the array code replaces them."""
        xp = self.xp
        if self.kernels is not None:
            batch = int(state.n.shape[0])
            if batch == 0:
                return
            ending, mode = self._last_step_arg(state, last_step, batch)
            i32 = np.int32
            self.kernels.advance(((batch + rules_kernel.ADVANCE_THREADS - 1) // rules_kernel.ADVANCE_THREADS,),
                                 (rules_kernel.ADVANCE_THREADS,), (
                xp.ascontiguousarray(tokens, dtype=xp.int64), i32(batch),
                state.n, state.last, state.before_last, state.last_timestamp, state.active, ending, i32(mode),
                i32(self.eot), i32(self.ts_begin),
            ))
            return
        took = state.active & (tokens != self.eot)
        state.before_last = xp.where(took, state.last, state.before_last)
        state.last = xp.where(took, tokens, state.last)
        state.last_timestamp = xp.where(took & (tokens >= self.ts_begin), tokens, state.last_timestamp)
        state.n = state.n + took.astype(xp.int64)
        state.active = xp.logical_and(took, xp.logical_not(last_step))


def _on_device(xp, array) -> bool:
    """Whether ``array`` is already one of ``xp``'s device arrays (NumPy's are host arrays)."""
    return xp is not np and isinstance(array, xp.ndarray)
