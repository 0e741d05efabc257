"""WhisperRuntime on the CPU: provider reporting, cache reuse, batching, and the encoder checked
against a float64 NumPy forward."""

from __future__ import annotations

import math

import numpy as np
import pytest
from graph_fixtures import base_files, onnx_cache_dir, private_cache, tiny_files  # noqa: F401 - fixtures
from mel_helper import load_audio_16k, whisper_features

from captioner.errors import UserError
from captioner.models import onnx_export, session
from captioner.models.onnx_graphs import build_encoder
from captioner.models.runtime import load_runtime


def test_cpu_provider_is_reported(private_cache):
    rt = load_runtime("tiny.en", device="cpu")
    assert rt.provider == "CPUExecutionProvider" == rt.encoder.session.get_providers()[0]
    assert rt.device_name == "cpu" and rt.precision == "fp32" and rt.provider_note == ""
    assert (rt.n_mels, rt.n_vocab, rt.n_text_ctx, rt.is_multilingual) == (80, 51864, 448, False)
    assert rt.tokenizer_path.name == "tokenizer.json"


def test_requested_cuda_never_falls_back_to_the_cpu():
    # A GPU asked for by name either runs the model or is refused with one line saying why;
    # "auto" is the only request that may end on the CPU.
    try:
        choice = session.choose_provider("cuda")
    except UserError as error:
        assert "cuda:0" in str(error) and "\n" not in str(error)
    else:
        assert choice.provider == session.CUDA and choice.device_id == 0 and choice.note == ""
    with pytest.raises(UserError, match="cuda:63"):
        session.choose_provider("cuda:63")


def test_auto_picks_a_working_provider():
    choice = session.choose_provider("auto")
    assert choice.provider in (session.CUDA, session.CPU)
    with pytest.raises(Exception, match="unknown device"):
        session.choose_provider("tpu")


def test_cache_is_reused_not_rebuilt(private_cache, tiny_files):
    first = onnx_export.ensure_onnx(tiny_files, "fp32")
    mtimes = {p.name: p.stat().st_mtime_ns for p in first.folder.iterdir()}
    messages = []
    second = onnx_export.ensure_onnx(tiny_files, "fp32", lambda m, f: messages.append((m, f)))
    assert second.folder == first.folder and not second.built
    assert messages == [("tiny.en: ONNX graphs cached", 1.0)]
    assert {p.name: p.stat().st_mtime_ns for p in second.folder.iterdir()} == mtimes
    assert first.folder.name.endswith(f"-v{onnx_export.CONVERTER_VERSION}-fp32")
    assert first.folder.parent == private_cache / "onnx"


def test_interrupted_build_leaves_no_half_cache(tmp_path, monkeypatch, tiny_files):
    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(tmp_path))

    def interrupt(message, fraction):
        if fraction >= 0.5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        onnx_export.ensure_onnx(tiny_files, "fp16", interrupt)
    assert list((tmp_path / "onnx").iterdir()) == []
    progress = []
    built = onnx_export.ensure_onnx(tiny_files, "fp16", lambda m, f: progress.append(f))
    assert built.built and progress[0] == 0.0 and progress[-1] == 1.0 and progress == sorted(progress)
    assert sorted(p.name for p in (tmp_path / "onnx").iterdir()) == [built.folder.name]


def test_model_hash_tells_models_apart(tiny_files, base_files):
    h = onnx_export.model_hash(tiny_files)
    assert h == onnx_export.model_hash(tiny_files) != onnx_export.model_hash(base_files)


def _clip_features(speech_clips, clip_id, n_mels=80):
    return whisper_features(load_audio_16k(speech_clips[clip_id].wav), n_mels)


def test_batch_rows_match_single_runs(private_cache, speech_clips):
    rt = load_runtime("tiny.en", device="cpu")
    mels = np.stack([_clip_features(speech_clips, "en_ls_1089-134686-0001"), _clip_features(speech_clips, "en_ljspeech_LJ001-0001")])
    prompt = np.array([[rt.special.sot, rt.special.no_timestamps]] * 2)
    before = rt.graph_runs()
    logits_b, state_b = rt.start(rt.encode(mels), prompt)
    nxt = logits_b.argmax(-1)
    step_b = rt.step(state_b, nxt)
    assert state_b.length == 3
    for row in range(2):
        logits_1, state_1 = rt.start(rt.encode(mels[row : row + 1]), prompt[row : row + 1])
        np.testing.assert_allclose(logits_1[0], logits_b[row], atol=2e-3)
        np.testing.assert_allclose(rt.step(state_1, nxt[row : row + 1])[0], step_b[row], atol=2e-3)
    # Every graph run is counted and timed (benchmarks read how often each graph ran): three
    # encodings and cross K/V, a prompt and a step for each of the three states.
    runs = {name: (n - before[name][0], s - before[name][1]) for name, (n, s) in rt.graph_runs().items()}
    assert {name: n for name, (n, _) in runs.items()} == {"encoder": 3, "cross_kv": 3, "decoder": 6, "gather_rows": 0}
    assert all(s > 0 for n, s in runs.values() if n)
    with pytest.raises(ValueError):
        rt.encode(np.zeros((1, 80, 2999), np.float32))
    with pytest.raises(ValueError):
        rt.step(state_b, np.array([1, 2, 3]))


def _gelu(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _layer_norm(x, g, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * g + b


def _numpy_encoder_first_layer(w, mel):
    """Whisper's encoder up to the end of layer 0 in float64, straight from the CTranslate2 variables."""
    f = lambda name: w.array(name, np.float64)  # noqa: E731
    x = np.pad(mel.astype(np.float64), ((0, 0), (1, 1)))
    c1 = f("encoder/conv1/weight")
    x = _gelu(sum(c1[:, :, k] @ x[:, k : k + 3000] for k in range(3)) + f("encoder/conv1/bias")[:, None])
    x = np.pad(x, ((0, 0), (1, 1)))
    c2 = f("encoder/conv2/weight")
    x = _gelu(sum(c2[:, :, k] @ x[:, k : k + 3000 : 2] for k in range(3)) + f("encoder/conv2/bias")[:, None])
    x = x.T + f("encoder/position_encodings/encodings")  # [1500, d]
    d, heads = x.shape[1], int(w.scalar("encoder/num_heads"))
    p = "encoder/layer_0"
    y = _layer_norm(x, f(f"{p}/self_attention/layer_norm/gamma"), f(f"{p}/self_attention/layer_norm/beta"))
    qkv = y @ f(f"{p}/self_attention/linear_0/weight").T + f(f"{p}/self_attention/linear_0/bias")
    q, k, v = (qkv[:, i * d : (i + 1) * d].reshape(1500, heads, -1).transpose(1, 0, 2) for i in range(3))
    s = q @ k.transpose(0, 2, 1) / math.sqrt(d // heads)
    s = np.exp(s - s.max(-1, keepdims=True))
    ctx = ((s / s.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(1500, d)
    x = x + ctx @ f(f"{p}/self_attention/linear_1/weight").T + f(f"{p}/self_attention/linear_1/bias")
    y = _layer_norm(x, f(f"{p}/ffn/layer_norm/gamma"), f(f"{p}/ffn/layer_norm/beta"))
    y = _gelu(y @ f(f"{p}/ffn/linear_0/weight").T + f(f"{p}/ffn/linear_0/bias"))
    return x + y @ f(f"{p}/ffn/linear_1/weight").T + f(f"{p}/ffn/linear_1/bias")


def test_encoder_first_layer_matches_float64_numpy(tiny_files, speech_clips, tmp_path):
    w = tiny_files.open_weights()
    try:
        path = tmp_path / "enc1.onnx"
        path.write_bytes(build_encoder(w, tiny_files.dims, np.float32, n_layers=1).SerializeToString())
        mel = _clip_features(speech_clips, "en_ls_1089-134686-0001")
        ours = session.OrtModel(path, session.ProviderChoice(session.CPU, None, "cpu")).run({"mel": mel[None]})["encoder_out"].numpy()[0]
        ref = _numpy_encoder_first_layer(w, mel)
    finally:
        w.close()
    scale = np.abs(ref).max()
    assert np.abs(ours - ref).max() < 1e-4 * scale
    assert np.corrcoef(ours.ravel(), ref.ravel())[0, 1] > 0.999999
