"""On CUDA the engine's text work runs while the encoder computes (EngineConfig.overlap_updates):
the recognizer queues the encoder's run without waiting, runs the work, then waits for the
device. The hypotheses must be those of a plain decode, on real speech, with work long enough
that the encoder is still running when it ends. Run on the H200:

    PYTHONPATH=src:/tmp/site:/tmp/stage/ortsite:/tmp/stage python -m pytest -q tests/gpu/test_encoder_overlap_cuda.py
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from captioner.engine.recognizer import WindowRequest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

JFK = "en_jfk_inaugural_excerpt"


def test_work_during_the_encoder_leaves_the_hypotheses_unchanged(speech_clips):
    from captioner.audio.file_source import read_audio_16k
    from captioner.engine.live import load_recognizer
    from captioner.gpu.features_ref import log_mel_spectrogram

    backend, recognizer = load_recognizer("tiny.en", "cuda:0")
    assert recognizer.overlaps_host_work
    audio = read_audio_16k(speech_clips[JFK].wav)
    windows = [np.asarray(log_mel_spectrogram(audio[16_000 * a // 2:16_000 * b // 2], n_mels=recognizer.n_mels))
               for a, b in ((0, 8), (2, 15), (4, 22), (0, 22))] * 16  # 64 windows: a 64-row encoder run
    requests = [WindowRequest(f"s{i}", backend.xp.asarray(w), 0.0, "", None) for i, w in enumerate(windows)]
    plain = recognizer.decode(requests)
    seen = []

    def host_work():  # pure Python, as the policies' fold is: it must not touch the device
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.03:
            sum(range(1000))
        seen.append(True)
    got = recognizer.decode(requests, while_encoding=host_work)
    assert seen == [True]
    assert [h.words for h in got] == [h.words for h in plain] and all(h.words for h in got[:4])


def test_hypotheses_read_while_the_next_batch_encodes_are_the_plain_ones(speech_clips):
    """What the engine does under load (``decode_pending``): a step's hypotheses are read during
    the next step's encoding; both steps' hypotheses are the plain decode's."""
    from captioner.audio.file_source import read_audio_16k
    from captioner.engine.live import load_recognizer
    from captioner.gpu.features_ref import log_mel_spectrogram

    backend, recognizer = load_recognizer("tiny.en", "cuda:0")
    audio = read_audio_16k(speech_clips[JFK].wav)
    windows = [np.asarray(log_mel_spectrogram(audio[16_000 * a // 2:16_000 * b // 2], n_mels=recognizer.n_mels))
               for a, b in ((0, 8), (2, 15), (4, 22), (0, 22))] * 16
    requests = [WindowRequest(f"s{i}", backend.xp.asarray(w), 0.0, "", None) for i, w in enumerate(windows)]
    plain = [h.words for h in recognizer.decode(requests)]
    first = recognizer.decode_pending(requests)
    read = []
    second = recognizer.decode_pending(requests[::-1], while_encoding=lambda: read.append(first.hypotheses()))
    assert len(read) == 1 and [h.words for h in read[0]] == plain and all(h.words for h in read[0][:4])
    assert [h.words for h in second.hypotheses()] == plain[::-1]
