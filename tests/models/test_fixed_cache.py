"""The fixed-capacity decoder step (the graph CUDA runs as a captured CUDA graph), checked on the
CPU with plain and with fused (MultiHeadAttention) attention: same greedy tokens as the
concatenating decoder, in-place cache update, one buffer set per live decoder state."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from graph_fixtures import fixed_cache_runtimes, greedy_continue, tiny_files  # noqa: F401 - fixture
from mel_helper import load_audio_16k, whisper_features

from captioner.models.runtime import MAX_SLOTS_PER_BATCH

CLIPS = ("en_ls_1089-134686-0001", "en_ljspeech_LJ001-0001", "en_ls_7902-96591-0000")


@pytest.fixture(scope="module", params=["matmul", "fused"])
def runtimes(request, tiny_files, tmp_path_factory):  # noqa: F811
    """The fixed-cache runtimes (with and without the prefill graph) and the concatenating one,
    fp32, the fixed-cache ones with plain MatMul attention or with ONNX Runtime's
    MultiHeadAttention (the CUDA graphs' variant)."""
    return fixed_cache_runtimes(tiny_files, tmp_path_factory, request.param)


def _greedy(rt, logits, state, limit=80):
    return greedy_continue(rt, logits, state, limit)


def test_same_tokens_as_the_concatenating_decoder(runtimes, speech_clips):
    fixed, concat = runtimes.fixed, runtimes.concat
    assert fixed.step_model is not None and concat.step_model is None
    prompt = np.array([[fixed.special.sot, fixed.special.no_timestamps]])
    for clip in CLIPS:
        mel = whisper_features(load_audio_16k(speech_clips[clip].wav))[None]
        ours = _greedy(fixed, *fixed.start(fixed.encode(mel), prompt))
        reference = _greedy(concat, *concat.start(concat.encode(mel), prompt))
        assert ours == reference and len(ours) > 5, clip


def test_live_states_keep_their_own_cache(runtimes, speech_clips):
    fixed, concat = runtimes.fixed, runtimes.concat
    prompt = np.array([[fixed.special.sot, fixed.special.no_timestamps]])
    mels = [whisper_features(load_audio_16k(speech_clips[c].wav))[None] for c in CLIPS]
    expected = [_greedy(concat, *concat.start(concat.encode(m), prompt)) for m in mels]
    started = [fixed.start(fixed.encode(m), prompt) for m in mels]
    assert len({state.slot.graph_id for _, state in started}) == len(mels)
    # Step the three decodes in turn, one token each: no state may see another's cache.
    logits = [lg for lg, _ in started]
    got: list[list[int]] = [[] for _ in mels]
    for turn in range(60):
        for i, (_, state) in enumerate(started):
            if got[i][-1:] == [fixed.special.eot]:
                continue
            row = logits[i][0].copy()
            row[list(fixed.suppress_ids)] = -np.inf
            if turn == 0:
                row[list(fixed.suppress_ids_begin)] = -np.inf
            token = int(row.argmax())
            got[i].append(token)
            if token != fixed.special.eot:
                logits[i] = fixed.step(state, np.array([token]))
    assert [[t for t in g if t != fixed.special.eot] for g in got] == [e[:60] for e in expected]

    # A dropped state frees its buffers for the next start.
    graph_ids = {state.slot.graph_id for _, state in started}
    del started, logits, state
    gc.collect()
    _, again = fixed.start(fixed.encode(mels[0]), prompt)
    assert again.slot.graph_id in graph_ids


def test_too_many_live_states_take_over_the_oldest(runtimes, speech_clips):
    fixed = runtimes.fixed
    enc = fixed.encode(whisper_features(load_audio_16k(speech_clips[CLIPS[0]].wav))[None])
    prompt = np.array([[fixed.special.sot]])
    states = [fixed.start(enc, prompt)[1] for _ in range(MAX_SLOTS_PER_BATCH + 1)]
    with pytest.raises(ValueError, match="taken over"):
        fixed.step(states[0], np.array([fixed.special.no_timestamps]))
    assert fixed.step(states[-1], np.array([fixed.special.no_timestamps])).shape == (1, fixed.n_vocab)


def test_long_prompt_prefill_matches_replay_and_concatenation(runtimes, speech_clips):
    """A <|startofprev|> prompt of earlier text, prefilled in one run, fed token by token, and run
    through the concatenating decoder: the same next-token logits (batch of 2) and the same decode."""
    s = runtimes.fixed.special
    mel = whisper_features(load_audio_16k(speech_clips["en_ls_1089-134691-0001"].wav))[None]
    earlier = [679, 10719, 612, 561, 307, 20798, 329, 8073, 11, 1210, 2419, 290, 34397]  # tiny.en ids of earlier text
    prompt = [s.sot_prev, *earlier, s.sot, s.no_timestamps]
    logits, decodes = [], []
    for rt in (runtimes.fixed, runtimes.replay, runtimes.concat):
        batch_logits, state = rt.start(rt.encode(np.concatenate([mel, mel])), np.array([prompt, prompt]))
        assert state.length == len(prompt)
        logits.append(batch_logits)
        decodes.append(_greedy(rt, *rt.start(rt.encode(mel), np.array([prompt]))))
    np.testing.assert_allclose(logits[0], logits[2], atol=1e-3)
    np.testing.assert_allclose(logits[1], logits[2], atol=1e-3)
    np.testing.assert_allclose(logits[0][0], logits[0][1], atol=1e-5)
    assert decodes[0] == decodes[1] == decodes[2] and len(decodes[2]) > 5
