"""The engine's host path at many streams: the batched reads it relies on give what the
per-stream reads gave (docs/capacity.md, "The engine's host path at many streams")."""

from __future__ import annotations

import math

import numpy as np
import pytest

from captioner.engine.vad import VadConfig
from captioner.engine.vad_bank import VadBank


def _windows_agree(backend) -> None:
    """A step's windows, read in one gather per bank, equal each stream's own window: streams
    over three banks, asked out of order, windows of different lengths (one empty), one
    wrapping around its ring."""
    from captioner.gpu.features import FeaturePool

    pool = FeaturePool(backend, n_mels=80, ring_frames=64, block_streams=4)
    slots = [pool.acquire() for _ in range(10)]
    rng = np.random.default_rng(5)
    for _ in range(2):  # 80 frames pushed into rings of 64: the oldest frames were overwritten
        pool.push_batch(slots, (0.1 * rng.standard_normal((10, 160 * 40))).astype(np.float32))
    ready = pool.frames_ready(slots[0])
    assert ready > pool.ring_frames
    order = [9, 0, 5, 4, 1, 7]
    firsts = [ready - 64, ready - 30, ready - 5, ready - 50, ready, ready - 63]
    counts = [64, 30, 5, 20, 0, 63]
    got = pool.log_mel_windows([slots[i] for i in order], firsts, counts)
    assert len(got) == len(order)
    for window, i, first, n in zip(got, order, firsts, counts):
        assert window.shape == (80, n)
        want = backend.asnumpy(pool.log_mel_window(slots[i], first, n))
        np.testing.assert_array_equal(backend.asnumpy(window), want)
    with pytest.raises(ValueError, match="not in the ring"):
        pool.log_mel_windows([slots[0]], [ready - 65], [10])  # overwritten already
    with pytest.raises(ValueError, match="not in the ring"):
        pool.log_mel_windows([slots[0]], [ready - 2], [3])  # not computed yet


def test_a_steps_windows_in_one_gather_equal_each_streams_window():
    from captioner.gpu.backend import cpu_backend

    _windows_agree(cpu_backend())


@pytest.mark.gpu
def test_a_steps_windows_in_one_gather_equal_each_streams_window_on_the_gpu():
    from captioner.gpu.backend import cuda_usable, get_backend

    if not cuda_usable():
        pytest.skip("no usable CUDA device")
    _windows_agree(get_backend("cuda"))


def test_the_silences_of_many_rows_read_at_once_equal_each_rows():
    bank = VadBank(VadConfig())
    rows = [bank.acquire() for _ in range(70)]  # past the first 64 rows: the bank grew
    rng = np.random.default_rng(2)
    for _ in range(20):
        # Quiet rows, loud rows and rows that switch: every silence count shows up.
        energy = rng.choice([-90.0, -20.0], size=(len(rows), 10), p=[0.7, 0.3]) + rng.normal(0, 2, (len(rows), 10))
        bank.push(rows, energy)
        fresh = bank.acquire()  # a row that saw nothing yet
        many = bank.silence_frames_many([*rows, fresh]).tolist()
        assert many == [bank.silence_frames(r) for r in [*rows, fresh]]
        bank.release(fresh)
    assert len(set(many)) > 3


def test_a_streams_level_is_that_of_its_newest_block():
    """The level is worked out when the status asks, from the newest block taken in."""
    from scripted import ScriptedRecognizer

    from captioner.engine.live import LiveCaptioner

    live = LiveCaptioner(recognizer=ScriptedRecognizer({}), language="en")
    stream = live.open_stream("a")
    assert live.status().input_levels_dbfs == (-120.0,)
    quiet = np.full(1600, 0.001, dtype=np.float32)
    loud = np.full(1600, 0.1, dtype=np.float32)
    stream.accept_waveform(16000, np.concatenate([quiet, loud]))
    live.step()
    assert live.status().input_levels_dbfs == (round(20 * math.log10(0.1), 1),)
    live.close()


def test_pushes_longer_than_the_floor_window_decide_as_voice_activity():
    """A push of more frames than the noise floor's window (after a stall, or a rebuilt ring)
    takes the frame-by-frame path of the floor: the same decisions as
    :class:`~captioner.engine.vad.VoiceActivity`."""
    from captioner.engine.vad import VoiceActivity

    config = VadConfig()
    rng = np.random.default_rng(4)
    n_rows = 5
    bank = VadBank(config)
    rows = [bank.acquire() for _ in range(n_rows)]
    singles = [VoiceActivity(config) for _ in range(n_rows)]
    for size in (3, config.floor_window_frames + 50, 10, 2 * config.floor_window_frames + 7, 1):
        # Loud bursts over a falling floor: the evicted minimum must be found again.
        energy = rng.normal(-70.0, 3.0, (n_rows, size)) - np.linspace(0, 10, size)
        energy[:, rng.random(size) < 0.2] = -20.0
        got = bank.push(rows, energy)
        for k in range(n_rows):
            assert np.array_equal(got[k], singles[k].push(energy[k]))
            assert bank.floor_db[rows[k]] == singles[k].floor_db
            assert bank.silence_frames(rows[k]) == singles[k].silence_frames()
            assert bank.voiced_frames[rows[k]] == singles[k].voiced_frames
