"""The alignment heads' cross-attention as an extra decoder output (issue 14): the concatenating
decoder (the CPU's) and the fixed-cache step and prefill (CUDA's graphs, plain and fused
attention, run here on the CPU) give the same weights; they are distributions over the encoder
frames that follow the speech; and graphs built without heads still work as before."""

from __future__ import annotations

import numpy as np
import pytest
from graph_fixtures import fixed_cache_folders, reference_runtime, tiny_files, tiny_tok  # noqa: F401 - fixture
from mel_helper import clip_features, load_audio_16k, whisper_features

from captioner.models import onnx_export, onnx_graphs, session
from captioner.models.alignment import AttentionRecorder
from captioner.models.decoding import DecodingOptions, decode
from captioner.models.runtime import WhisperRuntime
from captioner.models.tokenizer import WhisperTokenizer

CLIP = "en_ljspeech_LJ001-0001"
FRAMES_PER_S = 50  # encoder frames: 20 ms each
CPU = session.ProviderChoice(session.CPU, None, "cpu")


@pytest.fixture(scope="module")
def concat(tiny_files, tmp_path_factory):
    return reference_runtime(tiny_files, tmp_path_factory)


@pytest.fixture(scope="module", params=["matmul", "fused"])
def fixed(request, tiny_files, tmp_path_factory):
    # The graphs test_ragged_batch decodes with (alignment heads, prefill), built once a session.
    _, folder = fixed_cache_folders(tiny_files, tmp_path_factory, request.param, tiny_files.alignment_heads)
    return WhisperRuntime(tiny_files, CPU, onnx_export.OnnxFiles(folder, "fp32", built=True), fixed_cache=True)


def _greedy_with_attention(rt, mel, limit=60):
    s = rt.special
    logits, state, attn = rt.start(rt.encode(mel), np.array([[s.sot, s.no_timestamps]]), attention=True)
    tokens, rows = [], []
    while len(tokens) < limit:
        row = logits[0].copy()
        row[list(rt.suppress_ids)] = -np.inf
        token = int(row.argmax())
        rows.append(attn[0])
        if token == s.eot:
            break
        tokens.append(token)
        logits, attn = rt.step(state, np.array([token]), attention=True)
    return tokens, np.stack(rows)


def test_config_lists_the_heads(tiny_files, concat):
    # tiny.en's config.json ships 8 (layer, head) pairs; the runtime reads them sorted.
    assert len(tiny_files.alignment_heads) == 8
    assert concat.has_alignment and concat.alignment_heads == tuple(sorted(tiny_files.alignment_heads))


def test_fixed_cache_attention_matches_the_concatenating_decoder(concat, fixed, speech_clips):
    audio = load_audio_16k(speech_clips[CLIP].wav)
    mel = whisper_features(audio)[None]
    tokens_c, attn_c = _greedy_with_attention(concat, mel)
    tokens_f, attn_f = _greedy_with_attention(fixed, mel)
    assert tokens_f == tokens_c and len(tokens_c) > 10
    assert attn_c.shape == (len(tokens_c) + 1, 8, 1500)
    np.testing.assert_allclose(attn_f, attn_c, atol=2e-4)
    np.testing.assert_allclose(attn_c.sum(axis=-1), 1.0, atol=1e-4)
    # The heads follow the speech: the attended frame moves forward through the clip and stays
    # inside its audio (the rest of the window is padding) until the sentence is over: the final
    # full stop and the end token look past the audio, into the padding.
    frames = np.median(attn_c, axis=1).argmax(axis=-1)
    audio_frames = len(audio) / 16_000 * FRAMES_PER_S
    assert frames[:-2].max() <= audio_frames + 25
    assert frames[-1] > audio_frames + 25
    frames = frames[:-2]
    assert frames[-1] > 0.7 * audio_frames
    assert np.mean(np.diff(frames) >= 0) > 0.8


def test_decode_through_the_recorder_keeps_one_row_per_token(concat, speech_clips):
    mels = np.concatenate([whisper_features(load_audio_16k(speech_clips[c].wav))[None]
                           for c in (CLIP, "en_ls_1089-134686-0001")])
    tok = WhisperTokenizer(concat.files.tokenizer_path, concat.files.config_path, n_vocab=concat.n_vocab)
    options = DecodingOptions(temperatures=(0.0,))
    recorder = AttentionRecorder(concat)
    recorded = decode(recorder, tok, mels, options)
    plain = decode(concat, tok, mels, options)
    assert [w.tokens for w in recorded] == [w.tokens for w in plain]  # recording changes nothing
    n_choices = max(len(w.tokens) + (not w.hit_length_limit) for w in recorded)
    for b, w in enumerate(recorded):
        rows = recorder.token_rows(b, len(w.tokens), not w.hit_length_limit, n_choices)
        assert rows.shape == (len(w.tokens) + 1, 8, 1500)
        # The same rows as a one-row greedy run with the same prompt and rules.
        assert np.isfinite(rows).all() and np.allclose(rows.sum(-1), 1.0, atol=1e-4)
    # A runtime without the output cannot be recorded.
    with pytest.raises(ValueError, match="no alignment"):
        AttentionRecorder(object())


def test_windows_decoded_in_passes_of_their_own_keep_their_own_rows(concat, speech_clips):
    # Prompts of different lengths are decoded in separate passes (this runtime takes no ragged
    # prompts): each window's rows are those of the pass that decoded it, as when decoded alone.
    mels = np.concatenate([whisper_features(load_audio_16k(speech_clips[c].wav))[None]
                           for c in (CLIP, "en_ls_1089-134686-0001")])
    tok = WhisperTokenizer(concat.files.tokenizer_path, concat.files.config_path, n_vocab=concat.n_vocab)
    options = DecodingOptions(temperatures=(0.0,))
    prompts = [tok.encode(" Printing."), tok.encode(" He hoped there would be stew for dinner.")]
    assert len(prompts[0]) != len(prompts[1])
    recorder = AttentionRecorder(concat)
    together = decode(recorder, tok, mels, options, previous_tokens=prompts)
    assert recorder.pass_of(0) != recorder.pass_of(1)
    for b, w in enumerate(together):
        alone = AttentionRecorder(concat)
        [single] = decode(alone, tok, mels[b:b + 1], options, previous_tokens=prompts[b:b + 1])
        assert single.tokens == w.tokens
        n = len(w.tokens) + (not w.hit_length_limit)
        rows = recorder.token_rows(b, len(w.tokens), not w.hit_length_limit, n)
        np.testing.assert_allclose(rows, alone.token_rows(0, len(w.tokens), not w.hit_length_limit, n), atol=1e-5)
    # A row the recording does not hold is refused, not read from another window.
    with pytest.raises(ValueError):
        recorder.token_rows(2, 1, True, 2)


def test_graphs_without_heads_have_no_output(tiny_files, concat):
    weights = tiny_files.open_weights()
    try:
        plain = onnx_graphs.build_decoder_step(weights, tiny_files.dims, np.float32)
    finally:
        weights.close()
    assert "alignment_attn" not in [o.name for o in plain.graph.output]
    with pytest.raises(ValueError, match="outside"):
        onnx_graphs._heads_by_layer([(9, 0)], tiny_files.dims.n_text_layer, tiny_files.dims.n_text_head)


def test_fused_prefill_weighs_each_rows_own_last_token(tiny_files, tiny_tok, tmp_path_factory, speech_clips):
    # The fused prefill weighs only each row's last query against the audio (converter version
    # 11); the plain graph weighs every prompt column and keeps the last one. Ragged prompts, so
    # that each row's last column is its own: the same weights, row by row.
    runtimes = {}
    for variant in ("matmul", "fused"):
        _, folder = fixed_cache_folders(tiny_files, tmp_path_factory, variant, tiny_files.alignment_heads)
        runtimes[variant] = WhisperRuntime(tiny_files, CPU, onnx_export.OnnxFiles(folder, "fp32", built=True),
                                           fixed_cache=True)
    s = tiny_files.special
    mel = clip_features(speech_clips, [CLIP, "en_ls_1089-134686-0000"])
    prompts = [[s.sot_prev, *tiny_tok.encode(" The quick brown fox jumps over the lazy dog."), s.sot, s.no_timestamps],
               [s.sot, s.no_timestamps]]
    out = {}
    for variant, rt in runtimes.items():
        logits, _, attn = rt.start(rt.encode(mel), prompts, attention=True)
        out[variant] = (np.asarray(logits), np.asarray(attn))
    assert out["fused"][1].shape == (2, 8, 1500)
    np.testing.assert_allclose(out["fused"][1], out["matmul"][1], atol=2e-4)
    np.testing.assert_allclose(out["fused"][0], out["matmul"][0], atol=2e-3, rtol=1e-3)
    # Each row's weights are its own: the two prompts' last tokens look at different audio.
    assert np.abs(out["fused"][1][0] - out["fused"][1][1]).max() > 1e-2


def test_prefill_forms_give_the_same_outputs(tiny_files):
    # Converter version 10's fused prefill (every prompt column weighed, the last one kept) and
    # version 11's (each row's last query alone), fed the same ragged batch: the same outputs.
    import onnxruntime as ort

    weights = tiny_files.open_weights()
    try:
        forms = {last: onnx_graphs.build_decoder_prefill(weights, tiny_files.dims, np.float32, fused_attention=True,
                                                         alignment_heads=tiny_files.alignment_heads,
                                                         align_last_query=last)
                 for last in (False, True)}
    finally:
        weights.close()
    sessions = {last: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
                for last, m in forms.items()}
    rng = np.random.default_rng(3)
    batch, width = 3, 12
    feeds = {"tokens": rng.integers(0, 50000, size=(batch, width)).astype(np.int64),
             "offset": np.zeros(1, np.int64), "last": np.array([11, 4, 0], np.int64),
             "probe": np.array([2, 1, 0], np.int64)}
    for arg in sessions[True].get_inputs():
        if arg.name not in feeds:
            shape = [batch if not isinstance(d, int) else d for d in arg.shape]
            feeds[arg.name] = (0.5 * rng.standard_normal(shape)).astype(np.float32)
    names = [o.name for o in sessions[True].get_outputs()]
    old, new = (dict(zip(names, sessions[last].run(names, feeds))) for last in (False, True))
    assert new["alignment_attn"].shape == (batch, 8, 1, 1500)
    for name in ("alignment_attn", "logits", "probe_logits"):
        np.testing.assert_allclose(new[name], old[name], atol=1e-5, rtol=1e-5, err_msg=name)
    # Each row's weights come from its own last column.
    assert np.abs(new["alignment_attn"][0] - new["alignment_attn"][1]).max() > 1e-3
