"""AlignAtt on CUDA (issue 14): the fp16 fixed-cache step graph (captured as a CUDA graph) gives
the alignment heads' attention, word times and commits like the CPU's fp32 graphs.

Marked ``gpu``: skipped where no CUDA device is usable. Run on the H200:
``python -m pytest -q tests/engine/test_alignatt_cuda.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from captioner.engine.core import EngineConfig
from captioner.engine.live import LiveCaptioner, load_recognizer
from captioner.engine.policy.config import PolicyConfig
from captioner.engine.policy.words import normalize_word
from captioner.engine.recognizer import WindowRequest
from captioner.engine.simulate import replay

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

JFK = "en_jfk_inaugural_excerpt"


@pytest.fixture(scope="module")
def models():
    return load_recognizer("tiny.en", "cpu"), load_recognizer("tiny.en", "cuda:0")


def test_cuda_words_and_times_match_the_cpu(models, speech_clips):
    from captioner.audio.file_source import read_audio_16k
    from captioner.gpu.features_ref import log_mel_spectrogram

    (_, cpu), (gpu_backend, gpu) = models
    assert gpu.provider == "CUDAExecutionProvider" and gpu.runtime.has_alignment
    audio = read_audio_16k(speech_clips[JFK].wav)[: 16_000 * 8]
    log_mel = np.asarray(log_mel_spectrogram(audio, n_mels=cpu.n_mels))
    want = cpu.decode([WindowRequest("s", log_mel, 0.0, "", None, alignment=True)])[0]
    got = gpu.decode([WindowRequest("s", gpu_backend.xp.asarray(log_mel), 0.0, "", None, alignment=True)])[0]
    assert [w.key for w in got.words] == [w.key for w in want.words] and len(want.words) >= 10
    for g, w in zip(got.words, want.words):
        assert g.attend_s is not None
        assert abs(g.start_s - w.start_s) <= 0.1 and abs(g.end_s - w.end_s) <= 0.1, (g, w)


def test_cuda_alignatt_replay_commits_jfk_right(models, speech_clips):
    _, (backend, recognizer) = models
    config = EngineConfig(policy=PolicyConfig(kind="alignatt"))
    result = replay(lambda clock, timer: LiveCaptioner(recognizer=recognizer, backend=backend, config=config,
                                                       clock_ns=clock, timer_ns=timer),
                    {"s": speech_clips[JFK].wav}, compute="measured")
    words = [normalize_word(t) for u in result.updates if u.kind == "final" for t in u.text.split()]
    assert words[:4] == ["and", "so", "my", "fellow"], words
