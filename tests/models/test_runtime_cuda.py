"""The CUDA path (fp16 graphs, CUDA-graph decoder steps, CuPy features bound by pointer) gives
the same greedy tokens as the CPU path, which equals CTranslate2 (test_oracle.py).

Marked ``gpu``: skipped where no CUDA device is usable. Run on the H200 (docs/gpu-validation.md).
"""

from __future__ import annotations

import numpy as np
import pytest
from mel_helper import load_audio_16k, whisper_features

from captioner.engine.offline import load_decoder
from captioner.models.decoding import DecodingOptions

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

CLIPS = ["en_ls_1089-134686-0000", "en_jfk_inaugural_excerpt", "en_ljspeech_LJ001-0001", "en_timit_LDC93S1"]
GREEDY = DecodingOptions(language="en", temperatures=(0.0,))


@pytest.fixture(scope="module")
def decoders():
    return load_decoder("tiny.en", device="cpu"), load_decoder("tiny.en", device="cuda:0")


def test_cuda_runtime_reports_cuda(decoders):
    _, gpu = decoders
    assert gpu.runtime.provider == "CUDAExecutionProvider"
    assert gpu.runtime.precision == "fp16"


def test_cuda_fp16_tokens_equal_cpu_on_real_speech(decoders, speech_clips):
    cpu, gpu = decoders
    mel = np.stack([whisper_features(load_audio_16k(speech_clips[c].wav)) for c in CLIPS])
    want = cpu.decode(mel, GREEDY)
    got = gpu.decode(mel, GREEDY)
    for clip, w, g in zip(CLIPS, want, got):
        assert g.tokens == w.tokens, f"{clip}: {g.text!r} != {w.text!r}"
        assert g.text.strip()


def test_features_on_the_device_need_no_host_copy(decoders, speech_clips):
    import cupy

    _, gpu = decoders
    mel = np.stack([whisper_features(load_audio_16k(speech_clips[c].wav)) for c in CLIPS[:2]])
    host = gpu.decode(mel, GREEDY)
    device = gpu.decode(cupy.asarray(mel), GREEDY)
    assert [w.tokens for w in device] == [w.tokens for w in host]


def test_warm_up_captures_every_bucket_and_changes_no_caption(decoders, speech_clips):
    import cupy

    from captioner.engine.recognizer import WindowRequest
    from captioner.engine.whisper import WhisperRecognizer
    from captioner.gpu.features_ref import log_mel_spectrogram
    from captioner.models.runtime import bucket_size, encoder_rows

    _, gpu = decoders
    recognizer = WhisperRecognizer(gpu.runtime, gpu.tokenizer, xp=cupy, decode_on="device",
                                   synchronize=cupy.cuda.runtime.deviceSynchronize)
    # On the device, as the engine's feature pool hands windows over.
    requests = [WindowRequest(f"s{i}", cupy.asarray(log_mel_spectrogram(load_audio_16k(speech_clips[c].wav))[:, :3000],
                                                    dtype=cupy.float32), 0.0, "", None) for i, c in enumerate(CLIPS)]
    cold = [h.text for h in recognizer.decode(requests)]
    buckets = {bucket_size(n) for n in range(1, 65)}
    encoder_only = {encoder_rows(n) for n in range(1, 65)} - buckets  # 40 and 56 rows
    # Per bucket: no prompt, short and full prompts, full prompts with half and all of a prefix.
    assert recognizer.warm_up(64) == 5 * len(buckets) + len(encoder_only)
    graphs = gpu.runtime._n_graphs
    assert [h.text for h in recognizer.decode(requests)] == cold
    assert gpu.runtime._n_graphs == graphs


def test_one_shared_capped_arena_gives_the_same_tokens(decoders, speech_clips, monkeypatch):
    """``CAPTIONER_ORT_ARENA=shared`` with a budget (``--gpu-memory``): every session of a newly
    loaded model takes its memory from one arena on the GPU, registered with ONNX Runtime, and
    the captions are the CUDA path's own."""
    from captioner.models import gpu_memory

    monkeypatch.setenv(gpu_memory.ARENA_ENV, "shared")
    monkeypatch.setenv(gpu_memory.GPU_MEMORY_ENV, "8")
    shared = load_decoder("tiny.en", device="cuda:0")
    assert gpu_memory._shared[("CUDAExecutionProvider", 0)] is True
    _, gpu = decoders
    mel = np.stack([whisper_features(load_audio_16k(speech_clips[c].wav)) for c in CLIPS])
    assert [w.tokens for w in shared.decode(mel, GREEDY)] == [w.tokens for w in gpu.decode(mel, GREEDY)]
