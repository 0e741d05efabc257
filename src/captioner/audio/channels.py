"""Which axis of a caller's 2-D audio array is its channels.

The engine's own sources hand over ``[n, channels]`` (PortAudio's layout). A caller of the public
API may hand over ``[channels, n]`` instead: torchaudio and librosa give channels first. Read as
``[n, channels]``, a second of stereo would become 16,000 "channels" of 2 samples each, averaged
into 2 samples of noise, without a word. So a 2-D array is read by its shape: the short side is
the channels when only one side can be (at most :data:`MAX_CHANNELS`, the other side longer);
any other shape is refused with one line rather than guessed.
"""

from __future__ import annotations

import numpy as np

from captioner.errors import UserError

MAX_CHANNELS = 8
"""The most channels a 2-D array may have (7.1 surround); the other side, the samples, must be
longer, so that which side is which is never in doubt."""


def channels_last(samples: object) -> np.ndarray:
    """``samples`` with its channels on the last axis: a ``[channels, n]`` array (channels ≤
    :data:`MAX_CHANNELS` < n) transposed (a view, no copy), a ``[n, channels]`` one unchanged,
    any 1-D, empty or other-rank array as it came (the ingest checks those). A 2-D shape
    whose layout cannot be told (both sides ≤ 8, or both > 8) is a one-line
    :class:`~captioner.errors.UserError` saying which layouts are taken."""
    array = np.asarray(samples)
    if array.ndim != 2 or array.size == 0:
        return array
    rows, columns = array.shape
    if columns <= MAX_CHANNELS < rows:
        return array
    if rows <= MAX_CHANNELS < columns:
        return array.T
    raise UserError(
        f"samples of shape {array.shape} are ambiguous: pass [n] (mono), [n, channels] or [channels, n] "
        f"with 1..{MAX_CHANNELS} channels and more than {MAX_CHANNELS} samples"
    )
