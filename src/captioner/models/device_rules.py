"""Whisper's token rules, greedy choice and the chosen token's log-probability as array code over
a whole batch, written once for any NumPy-like module ``xp`` (NumPy on the CPU, CuPy on a GPU).

:class:`~captioner.models.decoding.LogitRules` is the specification: it walks the rows and their
token lists in Python. Here the same rules are masks built from per-row state arrays (how many
tokens a row has sampled, its last two tokens, its last timestamp), so the logits are ruled on
where they lie and only the chosen token ids and their log-probabilities ([B] each) have to
reach the host. tests/models/test_device_rules.py holds the two to the same tokens.

The caller is the thread that drives the runtime (the GPU worker, or the CLI's main thread);
nothing here imports a GPU library: the module to compute with is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from captioner.models.tokenizer import TIME_PRECISION_S


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

    def __init__(self, xp, tokenizer, options, n_vocab: int):
        self.xp = xp
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
        # Made once per call and moved to the device once: [1, V] masks and column numbers.
        self.suppress = xp.asarray(suppress[None, :])
        self.begin = xp.asarray(begin[None, :])
        self.any_begin = bool(begin.any())
        self.columns = xp.arange(n_vocab, dtype=xp.int64)[None, :]

    def new_state(self, batch: int) -> RowState:
        xp = self.xp
        none = xp.full((batch,), -1, dtype=xp.int64)
        return RowState(
            n=xp.zeros((batch,), dtype=xp.int64), last=none, before_last=none.copy(),
            last_timestamp=none.copy(), active=xp.ones((batch,), dtype=bool),
        )

    def apply(self, logits, state: RowState) -> None:
        """Mask ``logits`` [B, V] (float32, on ``xp``'s device) in place, as
        ``LogitRules.apply(logits, sampled, active)`` does for the same rows."""
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
        on ``xp``'s device. ``logits`` is masked in place."""
        xp = self.xp
        self.apply(logits, state)
        tokens = xp.argmax(logits, axis=-1).astype(xp.int64)
        return tokens, token_logprobs(xp, logits, tokens)

    def take(self, state: RowState, rows) -> RowState:
        """The state of only ``rows`` (indices, on ``xp``'s device), in that order."""
        return RowState(n=state.n[rows], last=state.last[rows], before_last=state.before_last[rows],
                        last_timestamp=state.last_timestamp[rows], active=state.active[rows])

    def advance(self, state: RowState, tokens, last_step) -> None:
        """Record the tokens just chosen for the rows still decoding; a row ends on
        ``<|endoftext|>`` or at its last allowed step (``last_step``: one for all rows, or [B])."""
        xp = self.xp
        took = state.active & (tokens != self.eot)
        state.before_last = xp.where(took, state.last, state.before_last)
        state.last = xp.where(took, tokens, state.last)
        state.last_timestamp = xp.where(took & (tokens >= self.ts_begin), tokens, state.last_timestamp)
        state.n = state.n + took.astype(xp.int64)
        state.active = xp.logical_and(took, xp.logical_not(last_step))
