"""Where each sampled token looked in the audio: the alignment heads' cross-attention, recorded
while a window is decoded.

:class:`AttentionRecorder` stands in for a runtime in :mod:`captioner.models.decoding` (it has
the same ``encode``/``start``/``step``): it asks the runtime for the alignment heads' weights at
every decoder run and keeps them, and hands the decoder the logits as before, so the decoding
loop itself does not change. Row k of a window's :meth:`AttentionRecorder.token_rows` is the
attention of the run whose logits chose token k (Whisper's convention for word timestamps:
the query that predicts a token says where that token is heard).

Called by the thread that owns the runtime; one recorder per decode call.
"""

from __future__ import annotations

from collections import Counter

import numpy as np


class AttentionRecorder:
    """A runtime wrapper that records ``[B, A, frames]`` attention per decoder run."""

    def __init__(self, runtime) -> None:
        if not getattr(runtime, "has_alignment", False):
            raise ValueError(f"{getattr(runtime, 'name', 'this model')}: its decoder graphs output no alignment-head attention")
        self.runtime = runtime
        self.runs: list[np.ndarray] = []  # the pass being decoded
        self._passes: list[list[np.ndarray]] = []
        self._where: dict[int, tuple[int, int] | None] = {}  # window -> (pass, row), or None

    def __getattr__(self, name):
        return getattr(self.runtime, name)

    def start(self, enc, prompt_tokens, **kwargs):
        logits, state, attention = self.runtime.start(enc, prompt_tokens, attention=True, **kwargs)
        self.runs = [attention]  # a new pass (a fallback re-decode) starts over
        return logits, state

    def step(self, state, tokens, **kwargs):
        logits, attention = self.runtime.step(state, tokens, attention=True, **kwargs)
        self.runs.append(attention)
        return logits

    def end_pass(self, windows: list[int]) -> None:
        """The pass just run decoded window ``windows[i]`` in its row i. Prompts of different
        lengths and fallbacks split a batch into passes of their own rows, so each window is read
        from the last pass that decoded it. A window sampled several times in one pass (best-of
        at a temperature) gets no rows: which sample won is decided later."""
        number = len(self._passes)
        self._passes.append(self.runs)
        samples = Counter(windows)
        for row, b in enumerate(windows):
            self._where[b] = (number, row) if samples[b] == 1 else None

    def pass_of(self, window: int) -> int | None:
        """Which pass ``window``'s rows come from (``None``: none usable); windows of one pass
        share its ``n_choices``."""
        where = self._where.get(window)
        return None if where is None else where[0]

    def token_rows(self, window: int, n_tokens: int, ended: bool, n_choices: int) -> np.ndarray:
        """``[n_tokens (+1 when ``ended`` with <|endoftext|>), A, frames]`` for ``window``.

        ``n_choices``: how many tokens the decoding loop chose per row in the pass (the longest
        row's count, its end token included). The loop stops stepping once every row is done,
        so the runs are the prompt's (start + forced tokens) and then one per choice but the
        last: the first choice came from run ``len(runs) - n_choices``. ``ValueError`` where the
        recording does not hold the window."""
        where = self._where.get(window)
        if where is None:
            raise ValueError(f"window {window} has no single row in a recorded pass")
        runs, row = self._passes[where[0]], where[1]
        first = len(runs) - n_choices
        count = n_tokens + (1 if ended else 0)
        if first < 0 or first + count > len(runs):
            raise ValueError(f"{count} tokens do not fit the {len(runs)} recorded decoder runs")
        return np.stack([runs[first + k][row] for k in range(count)]) if count else np.zeros((0,) + runs[0].shape[1:], np.float32)
