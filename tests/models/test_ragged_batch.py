"""Ragged batches on the fixed-cache decoder (the CUDA graphs' decoder, run here on the CPU in
fp32): rows with prompts of different lengths decode in one pass at their own positions, the
batch padded up to a bucket size, and every row gets the tokens it gets decoded alone by the
concatenating decoder (exact against CTranslate2, test_oracle.py)."""

from __future__ import annotations

import numpy as np
import pytest
from graph_fixtures import fixed_cache_runtimes, tiny_files  # noqa: F401 - fixture
from mel_helper import load_audio_16k, whisper_features

from captioner.models.decoding import DecodingOptions, decode
from captioner.models.runtime import bucket_size
from captioner.models.tokenizer import WhisperTokenizer

pytestmark = pytest.mark.slow

CLIPS = ("en_ls_1089-134686-0001", "en_ljspeech_LJ001-0001", "en_ls_7902-96591-0000", "en_jfk_inaugural_excerpt",
         "en_ami_ES2011a_hs0_40-46s")
PROMPT = " Earlier that day, the committee had met in the old hall to discuss the budget for next year."
# Compaction of finished rows is a device-decoding matter: asked for by name (the default, "auto",
# decodes batches under 16 rows on the host).
OPTIONS = DecodingOptions(temperatures=(0.0,), sample_len=48, decode_on="device")


@pytest.fixture(scope="module", params=["matmul", "fused"])
def runtimes(request, tiny_files, tmp_path_factory):  # noqa: F811
    return fixed_cache_runtimes(tiny_files, tmp_path_factory, request.param, tiny_files.alignment_heads)


@pytest.fixture(scope="module")
def tok(tiny_files) -> WhisperTokenizer:  # noqa: F811
    return WhisperTokenizer(tiny_files.tokenizer_path, tiny_files.config_path, n_vocab=tiny_files.dims.n_vocab)


@pytest.fixture(scope="module")
def windows(speech_clips):
    return np.stack([whisper_features(load_audio_16k(speech_clips[c].wav)) for c in CLIPS])


def _prompts(tok, n: int) -> list[list[int]]:
    words = tok.encode(PROMPT)
    return [words[: (0, 3, 7, 12, 20)[i % 5]] for i in range(n)]


@pytest.fixture(scope="module")
def alone(tok, windows):
    """``alone(concat, n)``: the tokens of the first ``n`` windows, each decoded alone by the
    concatenating decoder with its prompt of ``_prompts`` (the reference every test compares
    with). Each window is decoded once for the module: the concatenating runtime is the same
    fp32 graphs whichever fixed-cache variant it came with, and a row's prompt does not depend
    on ``n``."""
    memo: dict[int, tuple[int, ...]] = {}

    def tokens(concat, n: int) -> list[tuple[int, ...]]:
        prompts = _prompts(tok, n)
        for b in range(n):
            if b not in memo:
                memo[b] = decode(concat, tok, windows[b:b + 1], OPTIONS, previous_tokens=[prompts[b]])[0].tokens
        return [memo[b] for b in range(n)]

    return tokens


def test_bucket_sizes():
    assert [bucket_size(b) for b in (1, 2, 3, 5, 9, 17, 25, 33, 65, 200, 257, 300)] == \
        [1, 2, 4, 8, 16, 24, 32, 48, 96, 256, 320, 320]


def test_ragged_prompts_decode_in_one_pass_with_each_rows_tokens(runtimes, tok, windows, alone):
    """Five windows with prompts of 0 to 20 text tokens: one pass (one encoder run, one start)
    in a batch padded to 8 rows, on the device rules and on the host rules alike."""
    prompts = _prompts(tok, len(windows))
    want = alone(runtimes.concat, len(windows))
    assert any(len(w) > 10 for w in want)
    rt = runtimes.fixed
    for decode_on in ("device", "host"):
        starts = rt._starts
        got = decode(rt, tok, windows, DecodingOptions(temperatures=(0.0,), sample_len=48, decode_on=decode_on),
                     previous_tokens=prompts)
        assert rt._starts == starts + 1, "rows of different prompt lengths should share one pass"
        for clip, w, g in zip(CLIPS, want, got):
            assert g.tokens == w, f"{decode_on} {clip}: {tok.decode(list(g.tokens))!r} != {tok.decode(list(w))!r}"
    buffers = {key[:2] for key in rt._slots}  # (batch, logits on a device array); the key then names the context
    assert (8, False) in buffers and (5, False) not in buffers


def _ort_bytes(value) -> int:
    itemsize = {"tensor(float)": 4, "tensor(float16)": 2, "tensor(int64)": 8}[value.data_type()]
    return int(np.prod(value.shape())) * itemsize


def test_the_buffers_bytes_are_the_slots_and_encoder_buffers(runtimes, tok, windows):
    """``buffer_bytes`` (the engine status's ``decoder_slot_bytes`` and ``encoder_buffer_bytes``,
    what a served GPU's memory is made of) counts every buffer each slot bound, by its own shape,
    and each encoder buffer: worked out here again from the bound values themselves."""
    rt = runtimes.fixed
    decode(rt, tok, windows[:3], DecodingOptions(temperatures=(0.0,), sample_len=16, decode_on="host"))
    slots = [slot for pool in rt._slots.values() for slot in pool]
    assert slots
    by_shape = sum(_ort_bytes(v) for slot in slots
                   for v in (slot.tokens, slot.offset, slot.logits, *slot.buffers.values(),
                             *((slot.attention,) if slot.attention is not None else ())))
    encoder = sum(_ort_bytes(buffer.value) for buffer in rt._encoder_buffers.values())
    counted = rt.buffer_bytes()
    assert counted == {"decoder_slots": float(len(slots)), "decoder_slot_bytes": float(by_shape),
                       "encoder_buffer_bytes": float(encoder)}
    # tiny.en's cross K/V alone is 4 layers x 2 x 1,500 x 384 fp32 values a row: 18.4 MB.
    assert counted["decoder_slot_bytes"] >= sum(slot.batch for slot in slots) * 4 * 2 * 1500 * 384 * 4


def test_finished_rows_leave_the_batch(runtimes, tok, windows, alone):
    """Greedy passes on the device move the rows still decoding into a smaller bucket as rows
    finish (caches and cross K/V copied by row): the tokens stay each row's own."""
    prompts = _prompts(tok, len(windows))
    want = alone(runtimes.concat, len(windows))
    for rt in (runtimes.fixed, runtimes.replay):
        before, runs = rt.compactions, rt.graph_runs()
        got = decode(rt, tok, windows, OPTIONS, previous_tokens=prompts)
        assert rt.compactions > before, "five rows of different lengths should shrink 8 -> 4 -> 2 -> 1"
        assert [g.tokens for g in got] == want
        # Each compaction is one run of a row-gathering graph; one prefill per pass where there is one.
        after = rt.graph_runs()
        assert after["gather_rows"][0] - runs.get("gather_rows", (0, 0.0))[0] == rt.compactions - before
        if rt.prefill_model is not None:
            assert after["decoder_prefill"][0] - runs["decoder_prefill"][0] == after["encoder"][0] - runs["encoder"][0]
        kept = rt.compactions
        same = decode(rt, tok, windows, DecodingOptions(temperatures=(0.0,), sample_len=48, drop_finished=False, decode_on="device"),
                      previous_tokens=prompts)
        assert rt.compactions == kept
        assert [g.tokens for g in same] == want


def test_batch_sizes_of_one_bucket_share_its_graph(runtimes, tok, windows, alone):
    rt = runtimes.fixed
    prompts = _prompts(tok, 4)
    decode(rt, tok, windows[:4], OPTIONS, previous_tokens=prompts)  # bucket 4
    graphs = rt._n_graphs
    got = decode(rt, tok, windows[:3], OPTIONS, previous_tokens=prompts[:3])  # padded to 4
    assert rt._n_graphs == graphs
    assert [g.tokens for g in got] == alone(runtimes.concat, 3)


def test_ragged_prompts_fed_step_by_step(runtimes, tok, windows, alone):
    """Without the prefill graph each row's prompt is fed one captured step per token, rows
    that have ended re-feeding their last token: the same tokens."""
    assert runtimes.replay.prefill_model is None
    prompts = _prompts(tok, 3)
    got = decode(runtimes.replay, tok, windows[:3], OPTIONS, previous_tokens=prompts)
    assert [g.tokens for g in got] == alone(runtimes.concat, 3)


def test_ragged_rows_keep_their_alignment_attention(runtimes, tok, windows):
    """The alignment heads' attention of each row's own last prompt token (issue 14's output)."""
    rt = runtimes.fixed
    sot = tok.special.sot
    long_prompt = [tok.special.sot_prev, *tok.encode(PROMPT)[:9], sot]
    enc = rt.encode(windows[:2])
    _, _, attention = rt.start(enc, [[sot], long_prompt], attention=True)
    for row, prompt in enumerate(([sot], long_prompt)):
        _, _, alone = rt.start(rt.encode(windows[row:row + 1]), [prompt], attention=True)
        np.testing.assert_allclose(attention[row], alone[0], atol=1e-5)


def test_encoder_states_overwritten_by_a_later_encode_are_refused(runtimes, windows):
    rt = runtimes.fixed
    first = rt.encode(windows[:2])
    rt.encode(windows[2:4])
    with pytest.raises(ValueError, match="overwritten"):
        rt.start(first, np.array([[50257], [50257]]))
