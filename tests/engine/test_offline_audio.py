"""Offline transcription's reader: windows and speech positions of a recording read as it goes,
the same as from the whole array, holding only about a window of audio."""

from __future__ import annotations

import numpy as np

from captioner.audio.synthetic import noise
from captioner.engine.offline_audio import VAD_CHUNK_FRAMES, AudioWindows
from captioner.events import FRAME_SAMPLES, SAMPLE_RATE_HZ


def recording(seed: int = 0) -> np.ndarray:
    """3 minutes of room noise with loud noise bursts ("speech") at 20 s, 95 s and 170 s."""
    rate = SAMPLE_RATE_HZ
    audio = noise(180.0, amplitude=10 ** (-70 / 20), seed=seed)
    for at_s in (20.0, 95.0, 170.0):
        audio[int(at_s * rate):int((at_s + 2.0) * rate)] += noise(2.0, amplitude=0.2, seed=seed + 1)
    return audio


def blocks_of(audio: np.ndarray, block_samples: int = 3_000):
    for first in range(0, audio.shape[0], block_samples):
        yield audio[first:first + block_samples]


def test_streamed_and_whole_give_the_same_speech_and_samples():
    audio = recording()
    whole = AudioWindows([audio], 80)
    streamed = AudioWindows(blocks_of(audio), 80)
    found = []
    seek = 0
    while (at := streamed.next_speech(seek)) is not None:
        assert whole.next_speech(seek) == at
        found.append(at / 100)
        n = streamed.frames_from(at, 3000)
        np.testing.assert_array_equal(streamed.samples(at, n), audio[at * FRAME_SAMPLES:(at + n) * FRAME_SAMPLES])
        seek = at + 500  # past this burst
    assert [round(s) for s in found] == [20, 95, 170]
    assert whole.next_speech(seek) is None and streamed.ended


def test_only_about_a_window_is_held():
    audio = recording()
    streamed = AudioWindows(blocks_of(audio), 80)
    at = streamed.next_speech(0)
    streamed.samples(at, 3000)
    bound_samples = (30 + VAD_CHUNK_FRAMES // 100 + 1) * SAMPLE_RATE_HZ  # a window, a VAD chunk, a block
    assert sum(piece.shape[0] for _, piece in streamed._pieces) <= bound_samples
    at = streamed.next_speech(at + 500)  # over 75 s of silence to the next burst
    assert sum(piece.shape[0] for _, piece in streamed._pieces) <= bound_samples


def test_positions_only_move_forward():
    import pytest

    streamed = AudioWindows(blocks_of(recording()), 80)
    streamed.samples(5000, 100)
    with pytest.raises(ValueError, match="already released"):
        streamed.samples(100, 100)
