"""Prompt prefills are padded to a few widths, so ONNX Runtime meets few input shapes
(runtime.PREFILL_COLUMNS); the decode itself is checked with padding in test_ragged_batch.py."""

import numpy as np

from captioner.models.runtime import PREFILL_COLUMNS, _pad_columns


def test_prompts_are_padded_to_a_multiple_of_the_column_step_with_each_rows_last_token():
    tokens = np.array([[5, 6, 7], [8, 9, 9]], dtype=np.int64)  # row 1 already padded to the batch's width
    padded = _pad_columns(tokens, limit=448)
    assert padded.shape == (2, PREFILL_COLUMNS)
    assert (padded[:, :3] == tokens).all()
    assert (padded[0, 3:] == 7).all() and (padded[1, 3:] == 9).all()
    widths = {_pad_columns(np.ones((1, n), np.int64), limit=448).shape[1] for n in range(1, 60)}
    assert widths == {PREFILL_COLUMNS, 2 * PREFILL_COLUMNS}


def test_padding_stays_inside_the_text_context_and_leaves_full_widths_alone():
    assert _pad_columns(np.ones((1, 40), np.int64), limit=50).shape == (1, 50)
    exact = np.arange(PREFILL_COLUMNS, dtype=np.int64)[None]
    assert _pad_columns(exact, limit=448) is exact
