"""The decoder's shared slot memory (captioner.models.slot_memory), on ONNX Runtime CPU memory."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from captioner.models.slot_memory import ALIGN_BYTES, MAX_REGIONS, Layout, RegionPool


class _State:
    """Stands for a DecoderState: the pool only holds a weak reference to it."""


def _pool():
    retired = []
    pool = RegionPool(lambda n: ort.OrtValue.ortvalue_from_numpy(np.zeros(n, np.uint8), "cpu", 0), ("cpu", 0),
                      retired.append)
    return pool, retired


def test_passes_one_after_another_share_one_region_sized_by_the_largest():
    pool, retired = _pool()
    first = pool.acquire(1000)
    pool.own(first, state := _State())
    del state  # the pass is over
    assert pool.acquire(400) is first, "a smaller pass lands in the same region"
    bigger = pool.acquire(5000)
    assert bigger is not first and retired == [first] and [r.nbytes for r in pool.regions] == [5000]
    assert pool.acquire(1000) is bigger and pool.nbytes == 5000


def test_live_states_get_regions_of_their_own_then_the_oldest_is_taken_over():
    pool, retired = _pool()
    states, regions = [], []
    for _ in range(MAX_REGIONS):
        region = pool.acquire(100)
        states.append((region, pool.own(region, s := _State()), s))
        regions.append(region)
    assert len({r.index for r in regions}) == MAX_REGIONS
    taken = pool.acquire(100)
    assert taken is regions[0]
    pool.own(taken, _keep := _State())
    region, generation, _ = states[0]
    assert region.generation != generation, "the first state lost its region"
    assert all(r.generation == g for r, g, _ in states[1:])
    assert not retired


def test_a_released_region_is_free_and_its_state_stale():
    pool, _ = _pool()
    region = pool.acquire(100)
    generation = pool.own(region, state := _State())
    pool.release(region)
    assert region.free and region.generation != generation
    assert pool.acquire(100) is region
    del state


def test_the_scratch_region_grows_by_need_and_is_counted():
    pool, _ = _pool()
    small = pool.scratch(100)
    assert pool.scratch(50) is small
    large = pool.scratch(300)
    assert large is not small and large.nbytes == 300 and pool.nbytes == 300 and pool.held == [large]


def test_views_are_aligned_and_laid_end_to_end():
    layout = Layout()
    assert layout.add((3, 5), np.float16) == 0
    assert layout.add((2,), np.float32) == 1
    pool, _ = _pool()
    region = pool.acquire(layout.nbytes)
    first, second = layout.place(region)
    assert first.offset == 0 and first.nbytes == 30
    assert second.offset == ALIGN_BYTES and second.ptr == region.ptr + ALIGN_BYTES
    assert layout.nbytes == ALIGN_BYTES + 8
    with pytest.raises(ValueError, match="do not fit"):
        layout.place(_pool()[0].acquire(10))
