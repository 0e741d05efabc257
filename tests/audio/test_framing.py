import numpy as np
import pytest

from captioner.audio.framing import Framer
from captioner.events import FRAME_SAMPLES, SAMPLE_RATE_HZ


def frame_all(chunks, first_sample=0):
    framer = Framer("s", first_sample=first_sample)
    blocks = [b for i, c in enumerate(chunks) if (b := framer.push(c, capture_ns=i)) is not None]
    return framer, blocks


@pytest.mark.parametrize("seed", range(5))
def test_any_chunking_gives_the_same_frames_and_indices(seed):
    rng = np.random.default_rng(seed)
    signal = rng.standard_normal(48_123).astype(np.float32)
    cuts = np.sort(rng.choice(np.arange(1, len(signal)), size=int(rng.integers(1, 400)), replace=False))
    chunks = np.split(signal, cuts)
    framer, blocks = frame_all(chunks, first_sample=320)

    whole = (len(signal) // FRAME_SAMPLES) * FRAME_SAMPLES
    out = np.concatenate([b.samples for b in blocks])
    np.testing.assert_array_equal(out, signal[:whole])  # nothing lost, repeated or reordered
    assert blocks[0].first_sample == 320
    assert all(a.end_sample == b.first_sample for a, b in zip(blocks, blocks[1:]))
    assert all(b.n_samples % FRAME_SAMPLES == 0 and b.n_samples > 0 for b in blocks)
    assert framer.pending_samples == len(signal) - whole
    assert framer.next_sample == 320 + whole


def test_small_chunks_wait_for_a_whole_frame():
    framer = Framer("s")
    assert framer.push(np.ones(100, np.float32), 0) is None
    block = framer.push(np.full(100, 2, np.float32), 1_000_000)
    assert block.first_sample == 0 and block.n_samples == FRAME_SAMPLES
    np.testing.assert_array_equal(block.samples[:100], 1)
    np.testing.assert_array_equal(block.samples[100:], 2)
    # 40 samples are left over, so the block's last sample is 40 samples older than the chunk's.
    assert block.capture_ns == 1_000_000 - round(40 * 1e9 / SAMPLE_RATE_HZ)
    assert framer.pending_samples == 40


def test_blocks_do_not_share_the_callers_buffer():
    framer = Framer("s")
    buffer = np.ones(FRAME_SAMPLES, np.float32)
    block = framer.push(buffer, 0)
    buffer[:] = 5
    assert np.all(block.samples == 1)
    assert not block.samples.flags.writeable


def test_flush_pads_the_last_partial_frame_with_zeros():
    framer = Framer("s")
    framer.push(np.ones(FRAME_SAMPLES + 30, np.float32), 0)
    tail = framer.flush(capture_ns=7)
    assert tail.first_sample == FRAME_SAMPLES and tail.n_samples == FRAME_SAMPLES
    assert np.all(tail.samples[:30] == 1) and np.all(tail.samples[30:] == 0)
    assert framer.flush(8) is None


def test_jump_moves_to_the_next_frame_boundary():
    framer = Framer("s")
    framer.push(np.ones(FRAME_SAMPLES + 50, np.float32), 0)
    framer.jump_to(1_000)  # 1000 is not on the 160-sample grid: the next boundary is 1120
    block = framer.push(np.ones(FRAME_SAMPLES, np.float32), 0)
    assert block.first_sample == 1_120
    framer.jump_to(10)  # never backwards
    assert framer.next_sample == 1_280


def test_capture_time_is_estimated_for_the_blocks_last_sample():
    framer = Framer("s")
    # The device has reached sample 500 at t=1 s, but only 330 samples came out of a resampler.
    block = framer.push(np.ones(330, np.float32), 1_000_000_000, captured_to_sample=500)
    assert block.end_sample == 320
    assert block.capture_ns == 1_000_000_000 - round(180 * 1e9 / SAMPLE_RATE_HZ)
    # An estimate never runs backwards, even when chunks arrive in a burst.
    later = framer.push(np.ones(160, np.float32), 1_000_000_000, captured_to_sample=2_000)
    assert later.capture_ns == block.capture_ns
