"""Warming a recognizer up (``WhisperRecognizer.warm_up``): every batch bucket up to the limit
gets its decoder buffers and step graph before the first real batch, and nothing of the warm-up
leaks into later captions. Run on the fixed-cache decoder (the CUDA graphs' decoder) on the CPU
in fp32; the H200 run that measured what warming saves is in docs/capacity.md."""

from __future__ import annotations

import numpy as np
import pytest
from graph_fixtures import fixed_cache_runtimes, tiny_files  # noqa: F401 - fixture
from mel_helper import load_audio_16k

from captioner.engine.recognizer import WindowRequest
from captioner.engine.whisper import WhisperRecognizer
from captioner.gpu.features_ref import log_mel_spectrogram
from captioner.models.runtime import bucket_size
from captioner.models.tokenizer import WhisperTokenizer

pytestmark = pytest.mark.slow

CLIPS = ("en_ls_1089-134686-0001", "en_ljspeech_LJ001-0001", "en_jfk_inaugural_excerpt")
PROMPT = "Earlier that day, the committee met in the old hall."


@pytest.fixture(scope="module")
def tok(tiny_files):  # noqa: F811
    return WhisperTokenizer(tiny_files.tokenizer_path, tiny_files.config_path, n_vocab=tiny_files.dims.n_vocab)


@pytest.fixture(scope="module")
def requests(speech_clips):
    """Three real recordings as one batch (raw log-mel frames, as the engine hands them over)."""
    out = []
    for i, clip in enumerate(CLIPS):
        log_mel = log_mel_spectrogram(load_audio_16k(speech_clips[clip].wav))[:, :3000]
        out.append(WindowRequest(f"s{i}", np.ascontiguousarray(log_mel, dtype=np.float32), 0.0,
                                 PROMPT if i % 2 else "", None))
    return out


def _recognizer(tiny_files, tmp_path_factory, tok):  # noqa: F811
    runtime = fixed_cache_runtimes(tiny_files, tmp_path_factory, "matmul").fixed
    return WhisperRecognizer(runtime, tok, xp=np, decode_on="device")


@pytest.fixture(scope="module")
def expected(tiny_files, tmp_path_factory, tok, requests):  # noqa: F811
    """The batch's captions on a cold recognizer (decoded once for the module's tests)."""
    texts = [h.text for h in _recognizer(tiny_files, tmp_path_factory, tok).decode(requests)]
    assert all(texts), texts  # real speech: every window is heard
    return texts


def test_every_bucket_is_met_once_and_captions_do_not_change(tiny_files, tmp_path_factory, tok, requests, expected):  # noqa: F811
    warm = _recognizer(tiny_files, tmp_path_factory, tok)
    runtime = warm.runtime
    calls = warm.warm_up(3)
    buckets = {bucket_size(n) for n in range(1, 4)}
    assert buckets == {1, 2, 4}
    # No prompt, short prompts, full-length prompts, and full-length ones with forced prefixes
    # of half and all of the longest one.
    assert calls == 5 * len(buckets)
    assert {key[0] for key in runtime._slots} == buckets
    graphs = runtime._n_graphs

    # The first real batch after it: the same captions as on a cold recognizer (the silent
    # windows and filler prompts left nothing behind), and no new buffers or graph to capture.
    assert [h.text for h in warm.decode(requests)] == expected
    assert runtime._n_graphs == graphs


def test_nothing_to_warm_on_the_concatenating_decoder(tiny_files, tmp_path_factory, tok):  # noqa: F811
    # The CPU decoder grows its cache by concatenation: no buffers or graphs per batch size.
    concat = fixed_cache_runtimes(tiny_files, tmp_path_factory, "matmul").concat
    assert WhisperRecognizer(concat, tok, xp=np).warm_up(64) == 0


def test_encoder_rows_are_few_shapes_that_fit_the_bucket():
    from captioner.models.runtime import encoder_rows

    rows = [encoder_rows(n) for n in range(1, 257)]
    assert all(n <= r <= bucket_size(n) for n, r in zip(range(1, 257), rows))
    assert all(r - n < 8 for n, r in zip(range(1, 257), rows))  # at most 7 spare rows
    assert len(set(rows)) == 35  # 1, 2, 4, then every multiple of 8 up to 256


def test_auto_warms_both_greedy_paths_of_small_buckets_untimed(tiny_files, tmp_path_factory, tok, requests, expected):  # noqa: F811
    """Under ``decode_on="auto"`` a batch under 16 rows may take either path (on CUDA each has
    its own buffers and graphs per bucket): the warm-up decodes each small bucket's five
    batches on both, and times neither, so the chooser starts from real decodes alone."""
    runtime = fixed_cache_runtimes(tiny_files, tmp_path_factory, "matmul").fixed
    warm = WhisperRecognizer(runtime, tok, xp=np, choose_paths=True)
    assert warm.decode_chooser is not None
    assert warm.warm_up(2) == 2 * 5 * 2  # buckets 1 and 2, each on both paths
    assert warm.decode_chooser.table() == {}
    graphs = runtime._n_graphs
    assert [h.text for h in warm.decode(requests[:2])] == expected[:2]
    assert runtime._n_graphs == graphs
    assert warm.decode_chooser.table()[2]["host_runs"] == 1
