"""A caller's 2-D audio is read by its shape (:mod:`captioner.audio.channels`): channels first
(torchaudio, librosa) is transposed, ``[n, channels]`` taken as it is, and a shape whose layout
cannot be told is refused with one line, never read the wrong way round."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from captioner.audio.channels import MAX_CHANNELS, channels_last
from captioner.audio.ingest import StreamIngest
from captioner.data import sample_speech_path
from captioner.errors import UserError


def jfk_stereo() -> tuple[np.ndarray, int]:
    """6 s of the bundled JFK recording as ``[n, 2]``: the left channel as recorded, the right
    one the same speech 0.3 s later at half level, so the channels really differ."""
    mono, rate = sf.read(str(sample_speech_path()), dtype="float32", frames=6 * 16000)
    assert mono.ndim == 1
    delay = int(0.3 * rate)
    right = np.concatenate([np.zeros(delay, np.float32), 0.5 * mono[:-delay]])
    return np.stack([mono, right], axis=1), rate


@pytest.fixture(scope="module")
def stereo() -> tuple[np.ndarray, int]:
    return jfk_stereo()


def test_channels_first_is_transposed_and_channels_last_kept(stereo):
    samples, _ = stereo
    assert channels_last(samples) is samples or np.shares_memory(channels_last(samples), samples)
    np.testing.assert_array_equal(channels_last(samples), samples)
    first = np.ascontiguousarray(samples.T)  # [2, n], as torchaudio.load gives it
    np.testing.assert_array_equal(channels_last(first), samples)
    assert np.shares_memory(channels_last(first), first)  # a view, no copy
    # A mono row (librosa's [1, n]) and a mono column are both one channel.
    row = samples[:, 0][None, :]
    np.testing.assert_array_equal(channels_last(row)[:, 0], samples[:, 0])
    np.testing.assert_array_equal(channels_last(samples[:, :1]), samples[:, :1])
    # The widest layout still told apart: 8 channels of 9 samples, either way round.
    eight = np.arange(72, dtype=np.float32).reshape(9, MAX_CHANNELS)
    np.testing.assert_array_equal(channels_last(eight), eight)
    np.testing.assert_array_equal(channels_last(eight.T.copy()), eight)


def test_other_ranks_and_empty_arrays_pass_to_the_ingest_checks(stereo):
    samples, _ = stereo
    mono = samples[:, 0]
    assert channels_last(mono) is mono
    assert channels_last(np.zeros((0, 2), np.float32)).shape == (0, 2)
    assert channels_last(np.zeros((2, 2, 2), np.float32)).shape == (2, 2, 2)  # refused later, as before


@pytest.mark.parametrize("shape", [(4, 2), (2, 4), (8, 8), (1, 1), (16, 1600), (1600, 16)])
def test_an_ambiguous_shape_is_one_line_saying_what_is_taken(shape):
    with pytest.raises(UserError) as refused:
        channels_last(np.zeros(shape, np.float32))
    message = str(refused.value)
    assert "\n" not in message and str(shape) in message
    assert "[n, channels]" in message and "[channels, n]" in message


def test_the_ingest_makes_the_same_audio_of_either_layout(stereo):
    samples, rate = stereo
    blocks = []
    for layout in (samples, np.ascontiguousarray(samples.T)):
        ingest = StreamIngest("s")
        block = ingest.accept(rate, channels_last(layout), 1_000_000_000)
        blocks.append(block.samples)
    np.testing.assert_array_equal(blocks[0], blocks[1])
    # Read the wrong way round, the same audio would have been 2 samples of 96,000 channels.
    assert blocks[0].shape[0] > 90_000
