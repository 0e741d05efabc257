"""cuDNN's attention is turned off for the prompt prefill's sessions only (session.CUDNN_ATTENTION_ENV).

On the H200 the prefill took 10.7-14 ms a run inside the engine with cuDNN's attention and
2.4-3.1 ms without, while the decoder step is faster with it (docs/capacity.md). The switch is an
environment variable ONNX Runtime reads while a session makes its kernels, so these tests check
what the environment says at that moment, through a real (CPU) session."""

from __future__ import annotations

import os

import onnxruntime
import pytest
from graph_fixtures import fixed_cache_runtimes, tiny_files  # noqa: F401 - fixture
from onnx import TensorProto, helper

from captioner.models import session
from captioner.models.session import CUDNN_ATTENTION_ENV


def identity_graph() -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8).SerializeToString()


@pytest.fixture
def seen_at_creation(monkeypatch):
    """The switch's value each time a session is made (the session itself runs on the CPU)."""
    monkeypatch.delenv(CUDNN_ATTENTION_ENV, raising=False)
    seen: list[str | None] = []
    real = onnxruntime.InferenceSession

    def recording(source, options=None, providers=None, **kwargs):
        seen.append(os.environ.get(CUDNN_ATTENTION_ENV))
        return real(source, options, providers=[session.CPU])
    monkeypatch.setattr(onnxruntime, "InferenceSession", recording)
    return seen


CUDA_CHOICE = session.ProviderChoice(session.CUDA, 0, "cuda:0")


def test_a_cuda_session_without_cudnn_attention_is_made_with_the_switch_off(seen_at_creation):
    with pytest.warns(RuntimeWarning, match="CUDA provider dropped"):  # the stand-in session is a CPU one
        session.OrtModel("prefill.onnx", CUDA_CHOICE, model_bytes=identity_graph(), cudnn_attention=False)
    assert seen_at_creation == ["0"]
    assert CUDNN_ATTENTION_ENV not in os.environ  # only while that session was made


def test_other_sessions_keep_onnx_runtimes_choice(seen_at_creation):
    with pytest.warns(RuntimeWarning, match="CUDA provider dropped"):
        session.OrtModel("step.onnx", CUDA_CHOICE, model_bytes=identity_graph())
    session.OrtModel("cpu.onnx", session.ProviderChoice(session.CPU, None, "cpu"), model_bytes=identity_graph(),
                     cudnn_attention=False)  # the CPU provider has no cuDNN: nothing to switch
    assert seen_at_creation == [None, None]


def test_a_setting_in_the_environment_holds_for_every_session(seen_at_creation, monkeypatch):
    monkeypatch.setenv(CUDNN_ATTENTION_ENV, "1")
    with pytest.warns(RuntimeWarning, match="CUDA provider dropped"):
        session.OrtModel("prefill.onnx", CUDA_CHOICE, model_bytes=identity_graph(), cudnn_attention=False)
    assert seen_at_creation == ["1"] and os.environ[CUDNN_ATTENTION_ENV] == "1"


def test_the_runtime_opens_its_prefill_without_cudnn_attention(tiny_files, tmp_path_factory, monkeypatch):  # noqa: F811
    opened: dict[str, bool] = {}
    init = session.OrtModel.__init__

    def spying(self, path, *args, cudnn_attention: bool = True, **kwargs):
        opened[os.path.basename(str(path))] = cudnn_attention
        init(self, path, *args, cudnn_attention=cudnn_attention, **kwargs)
    monkeypatch.setattr(session.OrtModel, "__init__", spying)
    fixed_cache_runtimes(tiny_files, tmp_path_factory, "fused")
    assert opened["decoder_prefill.onnx"] is False
    assert opened["decoder_step.onnx"] is True and opened["encoder.onnx"] is True
