"""The CUDA graphs' fused forms (``fused_ops``, on for fp16): GELU as ONNX Runtime's Gelu op and
the encoder's two convolutions as one matrix product each. Built here in fp32 beside the plain
graphs and run on the CPU: the same encoder states and decoder logits up to float32 rounding, on
real speech; the H200 runs the fp16 ones (tests/models/test_runtime_cuda.py, the GPU tests)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from graph_fixtures import tiny_files  # noqa: F401 - fixture
from mel_helper import load_audio_16k, whisper_features

from captioner.models import onnx_graphs

pytestmark = pytest.mark.slow

CLIPS = ("en_jfk_inaugural_excerpt", "en_ls_1089-134691-0000")


@pytest.fixture(scope="module")
def weights(tiny_files):  # noqa: F811
    w = tiny_files.open_weights()
    yield w
    w.close()


def _session(model: onnx.ModelProto):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _ops(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in model.graph.node}


@pytest.mark.parametrize("audio_ctx", [1500, 500])
def test_the_fused_encoder_gives_the_plain_ones_states(tiny_files, weights, speech_clips, audio_ctx):  # noqa: F811
    dims = tiny_files.dims if audio_ctx == 1500 else tiny_files.dims.with_audio_ctx(audio_ctx)
    plain = onnx_graphs.build_encoder(weights, dims, np.float32, fused_attention=True, fused_ops=False)
    fused = onnx_graphs.build_encoder(weights, dims, np.float32, fused_attention=True, fused_ops=True)
    assert "Conv" in _ops(plain) and "Erf" in _ops(plain)
    assert not {"Conv", "Erf"} & _ops(fused) and "Gelu" in _ops(fused)
    mel = np.stack([whisper_features(load_audio_16k(speech_clips[c].wav))[:, :2 * audio_ctx] for c in CLIPS])
    want = _session(plain).run(None, {"mel": mel})[0]
    got = _session(fused).run(None, {"mel": mel})[0]
    assert got.shape == (len(CLIPS), audio_ctx, dims.n_audio_state)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * float(np.abs(want).max()))


def test_the_fused_decoder_step_gives_the_plain_ones_logits(tiny_files, weights):  # noqa: F811
    """The step graph (its FFN's GELU fused): the same logits from the same cache and cross K/V."""
    dims = tiny_files.dims
    plain = onnx_graphs.build_decoder_step(weights, dims, np.float32, fused_attention=True, fused_ops=False)
    fused = onnx_graphs.build_decoder_step(weights, dims, np.float32, fused_attention=True, fused_ops=True)
    assert "Gelu" in _ops(fused) and "Erf" not in _ops(fused)
    rng = np.random.default_rng(0)
    feeds = {}
    for value in plain.graph.input:
        shape = [d.dim_value if d.dim_value else 2 for d in value.type.tensor_type.shape.dim]
        if value.name == "tokens":
            feeds[value.name] = rng.integers(0, 50000, shape).astype(np.int64)
        elif value.name == "offset":
            feeds[value.name] = np.array([3, 7], dtype=np.int64)
        else:
            feeds[value.name] = (0.5 * rng.standard_normal(shape)).astype(np.float32)
    want = _session(plain).run(["logits"], feeds)[0]
    got = _session(fused).run(["logits"], feeds)[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-3 * float(np.abs(want).max()))
