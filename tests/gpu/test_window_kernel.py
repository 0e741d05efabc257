"""A model step's batch read from the feature rings on CUDA (gpu/window_kernel.py through
FeaturePool.model_input and ``WhisperRecognizer`` given ring windows): the same bits as the batch
built from the gathered windows, on real speech in several banks (windows longer than the width,
shorter ones, one empty), and so the same tokens. tests/engine/test_window_kernel_cpu.py checks
the kernels' source on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

from captioner.gpu.backend import cuda_usable, get_backend

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda():
    if not cuda_usable():
        pytest.skip("no usable CUDA device")
    backend = get_backend("cuda")
    backend.use()
    return backend


def _pool(cuda, speech_audio):
    from captioner.gpu.features import FeaturePool

    pool = FeaturePool(cuda, n_mels=80, ring_frames=4096, block_streams=4)
    slots = [pool.acquire() for _ in range(10)]  # three banks
    clips = sorted(speech_audio)
    audio = np.stack([np.pad(a[:160 * 1200], (0, max(0, 160 * 1200 - a.size)))
                      for a in (speech_audio[clips[i % len(clips)]] for i in range(10))]).astype(np.float32)
    for start in range(0, 1200, 100):
        pool.push_batch(slots, audio[:, start * 160:(start + 100) * 160])
    return pool, slots


def test_a_batch_from_the_rings_equals_the_gathered_one(cuda, speech_audio):
    from captioner.engine.whisper import WhisperRecognizer
    from captioner.gpu.features import RingWindow

    pool, slots = _pool(cuda, speech_audio)
    ready = int(pool.frames_ready(slots[0]))
    windows = [RingWindow(pool, slots[i], first, ready - first)
               for i, first in zip((9, 0, 5, 3, 1, 7), (0, ready - 300, ready - 5, 40, ready, ready - 1000))]

    class Arrays:  # what _input needs of a recognizer
        xp, n_mels, _batches, _ring_batches = cuda.xp, 80, {}, {}

    class Request:
        def __init__(self, log_mel):
            self.log_mel = log_mel

    for width in (3000, 500):  # the 30 s window, and a short context (a window longer than it)
        from_rings = cuda.asnumpy(WhisperRecognizer._input(Arrays(), [Request(w) for w in windows], width))
        gathered = cuda.asnumpy(WhisperRecognizer._input(Arrays(), [Request(w.read()) for w in windows], width))
        np.testing.assert_array_equal(from_rings, gathered)


def test_whisper_decodes_the_same_from_the_rings(cuda, speech_audio):
    from captioner.engine.live import load_recognizer
    from captioner.engine.recognizer import WindowRequest
    from captioner.gpu.features import RingWindow

    _, recognizer = load_recognizer("tiny.en", cuda.name)
    pool, slots = _pool(cuda, speech_audio)
    ready = int(pool.frames_ready(slots[0]))
    rings = [WindowRequest(f"s{i}", RingWindow(pool, slot, 0, ready), 0.0, "", None) for i, slot in enumerate(slots)]
    arrays = [WindowRequest(r.stream, r.log_mel.read(), 0.0, "", None) for r in rings]
    got, want = recognizer.decode(rings), recognizer.decode(arrays)
    assert [h.text for h in got] == [h.text for h in want] and all(h.text for h in want)
    assert [h.tokens for h in got] == [h.tokens for h in want]
