"""Decoding with a forced prefix (a stream's committed words, ``decode(..., prefixes=...)``): the
window's text is made to begin with the given tokens, timestamps included, and decoding goes on
from there with Whisper's rules seeing them as sampled.

References: CTranslate2 given the same prefix after the start tokens (the oracle, on the
concatenating decoder); for the fixed-cache decoder (CUDA's, run here in fp32 on the CPU), each
row decoded alone by the concatenating decoder. And the property that makes the prefix safe to
use: a prefix the model would have chosen anyway changes nothing."""

from __future__ import annotations

import pytest
from graph_fixtures import (  # noqa: F401 - fixtures
    fixed_cache_runtimes,
    load_cpu_decoder,
    onnx_cache_dir,
    tiny_files,
    tiny_tok,
)
from mel_helper import clip_features

from captioner.models.ct2_oracle import Ct2Decoder
from captioner.models.decoding import DecodingOptions, _usable_prefixes, decode

pytestmark = pytest.mark.slow

CLIPS = ("en_jfk_inaugural_excerpt", "en_ls_1089-134686-0000", "en_ljspeech_LJ001-0001", "en_ami_ES2011a_hs0_40-46s")
STREAMING = DecodingOptions(temperatures=(0.0,), sample_len=128)
"""The engine's streaming options (engine/whisper.py): timestamps on, greedy."""


@pytest.fixture(scope="module")
def tok(tiny_tok):  # noqa: F811
    return tiny_tok


@pytest.fixture(scope="module")
def windows(speech_clips):
    return clip_features(speech_clips, CLIPS)


@pytest.fixture(scope="module")
def cpu(onnx_cache_dir):  # noqa: F811
    return load_cpu_decoder("tiny.en", onnx_cache_dir)


@pytest.fixture(scope="module")
def free(cpu, windows):
    """Each window decoded with no prefix (the concatenating decoder, alone)."""
    return [cpu.decode(windows[b:b + 1], STREAMING)[0] for b in range(len(CLIPS))]


def _foreign(tok, free_tokens) -> list[int]:
    """A prefix the model would not write: its first timestamp, then other words."""
    return [free_tokens[0], *tok.encode(" And then the people")]


def test_a_prefix_the_model_would_choose_changes_nothing(cpu, tok, windows, free):
    for b, window in enumerate(free):
        # A few tokens, half of them and all: over the four recordings, one length each.
        for k in ((3, len(window.tokens)) if b == 0 else (len(window.tokens) // (b + 1),)):
            got = cpu.decode(windows[b:b + 1], STREAMING, prefixes=[list(window.tokens[:k])])[0]
            assert got.tokens == window.tokens, (CLIPS[b], k)
            assert got.no_speech_prob == pytest.approx(window.no_speech_prob, abs=1e-6)
            # Only the sampled tokens count in the mean log-probability.
            if k < len(window.tokens):
                assert got.avg_logprob != window.avg_logprob


def test_prefixes_give_what_ctranslate2_gives(cpu, tok, windows, free, tiny_files):  # noqa: F811
    oracle = Ct2Decoder(tiny_files, tok, intra_threads=1)
    prompt = tok.encode(" Earlier that day, the committee met.")
    for b, window in enumerate(free[:3]):
        for prefix in (list(window.tokens[:4]), _foreign(tok, window.tokens)):
            ours = cpu.decode(windows[b:b + 1], STREAMING, prefixes=[prefix], previous_tokens=[prompt])[0]
            theirs = oracle.decode(windows[b:b + 1], STREAMING, prefixes=[prefix], previous_tokens=[prompt])[0]
            assert ours.tokens == theirs.tokens, (CLIPS[b], tok.decode_with_timestamps(ours.tokens),
                                                  tok.decode_with_timestamps(theirs.tokens))
            assert list(ours.tokens[:len(prefix)]) == prefix


def test_host_and_device_rules_agree_after_a_prefix(cpu, tok, windows, free):
    prefixes = [_foreign(tok, w.tokens) for w in free[:2]]
    same = [prefixes[0], prefixes[0][:3]]  # two rows: cut to the shorter on this decoder
    for decode_on in ("host", "device"):
        out = cpu.decode(windows[:2], DecodingOptions(temperatures=(0.0,), sample_len=128, decode_on=decode_on),
                         prefixes=same)
        assert [list(w.tokens[:3]) for w in out] == [prefixes[0][:3]] * 2
        if decode_on == "host":
            host = [w.tokens for w in out]
    assert [w.tokens for w in out] == host


@pytest.fixture(scope="module")
def fixed(tiny_files, tmp_path_factory):  # noqa: F811
    return fixed_cache_runtimes(tiny_files, tmp_path_factory, "fused", tiny_files.alignment_heads)


@pytest.fixture(scope="module")
def ragged_case(fixed, tok, free, windows):
    """Four rows' prompts and prefixes (one none), and each row decoded alone by the concatenating
    decoder with the host rules: the reference of both fixed-cache runtimes and rule paths."""
    prompts = [tok.encode(" One two three."), [], tok.encode(" Earlier that day, the committee met."), tok.encode(" Yes.")]
    prefixes = [list(free[0].tokens[:6]), _foreign(tok, free[1].tokens), [], list(free[3].tokens[:2])]
    host = DecodingOptions(temperatures=(0.0,), sample_len=128, decode_on="host")
    alone = [decode(fixed.concat, tok, windows[b:b + 1], host, previous_tokens=[prompts[b]], prefixes=[prefixes[b]])[0]
             for b in range(len(CLIPS))]
    return prompts, prefixes, alone


@pytest.mark.parametrize("runtime", ["fixed", "replay"])
def test_ragged_prefixes_in_one_prefill_give_each_rows_own_tokens(fixed, tok, windows, ragged_case, runtime):
    """Four windows in one ragged batch (padded to a bucket), each with its own prompt and
    prefix, one of them none: every row gets the tokens and no-speech probability it gets alone
    on the concatenating decoder, with the rules on the host or as array code. ``replay`` has no
    prefill graph: prompts go one step a token."""
    rt = getattr(fixed, runtime)
    prompts, prefixes, alone = ragged_case
    for decode_on in ("host", "device"):
        options = DecodingOptions(temperatures=(0.0,), sample_len=128, decode_on=decode_on)
        batch = decode(rt, tok, windows, options, previous_tokens=prompts, prefixes=prefixes)
        for b, got in enumerate(batch):
            assert got.tokens == alone[b].tokens, (runtime, decode_on, CLIPS[b])
            assert got.no_speech_prob == pytest.approx(alone[b].no_speech_prob, abs=1e-4)
            assert list(got.tokens[:len(prefixes[b])]) == prefixes[b]


def test_which_prefixes_one_pass_can_force():
    rows = [[1, 2, 3], [4], []]
    assert _usable_prefixes(rows, 3, ragged=True, known=True) == rows
    assert _usable_prefixes(rows, 3, ragged=True, known=False) == [[], [], []]  # a language to detect first
    assert _usable_prefixes([[1, 2, 3], [4, 5]], 2, ragged=False, known=False) == [[1, 2], [4, 5]]
    assert _usable_prefixes(None, 2, ragged=False, known=True) == [[], []]
    with pytest.raises(ValueError, match="one entry per window"):
        _usable_prefixes([[1]], 2, ragged=True, known=True)


def test_a_prefix_holds_text_and_timestamps_only(cpu, tok, windows):
    with pytest.raises(ValueError, match="text and timestamp tokens only"):
        cpu.decode(windows[:1], STREAMING, prefixes=[[tok.special.sot]])
