"""The voice encoder as one ONNX graph, written with ``onnx.helper``: a step of any number of
frames for any number of rows (partial utterances of any streams), its LSTM state in and out.

Inputs:

* ``log_mel`` [frames, rows, 40] float32: ``log10`` of the 40 mel bands' power, as the feature
  rings hold them (:mod:`captioner.gpu.features`);
* ``gain_log10`` [rows] float32: ``log10`` of the power gain each row's frames get first (the
  level resemblyzer brings a recording to, :data:`~.weights.TARGET_DBFS`); the network then
  sees ``10 ** (log_mel + gain_log10)``, linear power, as it was trained on;
* ``lengths`` [rows] int32: how many of the frames are a row's own (the rest are padding it
  does not see: rows of one batch advance by different numbers of frames);
* ``h_in``, ``c_in`` [3, rows, 256] float32: each row's state before these frames.

Outputs: ``h_out``, ``c_out`` (the state after each row's own frames; a row with none keeps its
state) and ``embedding`` [rows, 256]: ``relu(W h + b)`` of the last layer's state, scaled to unit
length: the embedding of everything the row has seen since its state was zero.

Each layer is ONNX's ``LSTM`` operator (gates ``i, o, f, c``; PyTorch stacks them ``i, f, g, o``,
so the weights are reordered here), which ONNX Runtime runs as one kernel per layer on the CPU
and through cuDNN on CUDA. Made in memory (a few milliseconds): nothing to cache on disk.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from captioner.models.speaker.weights import (
    EMBEDDING,
    HIDDEN,
    LAYERS,
    N_BANDS,
    SpeakerWeights,
)

OPSET = 17
IR_VERSION = 8  # what ONNX Runtime >= 1.14 reads; opset 17 needs IR >= 8
EPSILON = 1e-12

INPUTS = ("log_mel", "gain_log10", "lengths", "h_in", "c_in")
OUTPUTS = ("h_out", "c_out", "embedding")


def _onnx_gate_order(stacked: np.ndarray) -> np.ndarray:
    """PyTorch's ``i, f, g, o`` blocks (first axis) as ONNX's ``i, o, f, c``."""
    i, f, g, o = np.split(stacked, 4, axis=0)
    return np.concatenate([i, o, f, g], axis=0)


def build_graph(weights: SpeakerWeights):
    """The encoder step graph (an ``onnx.ModelProto``)."""
    inits = []

    def const(name: str, value) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    nodes = []
    node = lambda op, ins, outs, **attrs: nodes.append(helper.make_node(op, ins, outs, **attrs))  # noqa: E731

    # Linear mel power: exp(ln 10 * (log_mel + gain)).
    const("ln10", np.array(np.log(10.0), np.float32))
    const("axes_0_2", np.array([0, 2], np.int64))
    node("Unsqueeze", ["gain_log10", "axes_0_2"], ["gain_b"])
    node("Add", ["log_mel", "gain_b"], ["log_power"])
    node("Mul", ["log_power", "ln10"], ["ln_power"])
    node("Exp", ["ln_power"], ["x0"])

    const("split_layers", np.full(LAYERS, 1, np.int64))
    node("Split", ["h_in", "split_layers"], [f"h_in_{k}" for k in range(LAYERS)], axis=0)
    node("Split", ["c_in", "split_layers"], [f"c_in_{k}" for k in range(LAYERS)], axis=0)
    const("axis_1", np.array([1], np.int64))
    x = "x0"
    for k, layer in enumerate(weights.layers):
        w = const(f"W_{k}", _onnx_gate_order(layer.w_ih)[None].astype(np.float32))
        r = const(f"R_{k}", _onnx_gate_order(layer.w_hh)[None].astype(np.float32))
        b = const(f"B_{k}", np.concatenate([_onnx_gate_order(layer.b_ih), _onnx_gate_order(layer.b_hh)])[None]
                  .astype(np.float32))
        node("LSTM", [x, w, r, b, "lengths", f"h_in_{k}", f"c_in_{k}"], [f"y_{k}", f"yh_{k}", f"yc_{k}"],
             hidden_size=HIDDEN, direction="forward")
        if k + 1 < LAYERS:
            node("Squeeze", [f"y_{k}", "axis_1"], [f"x{k + 1}"])  # [frames, 1, rows, H] -> [frames, rows, H]
            x = f"x{k + 1}"
    node("Concat", [f"yh_{k}" for k in range(LAYERS)], ["h_new"], axis=0)
    node("Concat", [f"yc_{k}" for k in range(LAYERS)], ["c_new"], axis=0)
    # A row given no frames keeps its state (the LSTM operator's output for it is not defined to).
    const("zero_i32", np.array(0, np.int32))
    node("Greater", ["lengths", "zero_i32"], ["has_frames"])
    const("axes_0_2b", np.array([0, 2], np.int64))
    node("Unsqueeze", ["has_frames", "axes_0_2b"], ["has_frames_b"])
    node("Where", ["has_frames_b", "h_new", "h_in"], ["h_out"])
    node("Where", ["has_frames_b", "c_new", "c_in"], ["c_out"])

    const("last", np.array([LAYERS - 1], np.int64))
    node("Gather", ["h_out", "last"], ["h_last3"], axis=0)  # [1, rows, H]
    const("axis_0", np.array([0], np.int64))
    node("Squeeze", ["h_last3", "axis_0"], ["h_last"])
    const("linear_w", weights.linear_w.astype(np.float32))
    const("linear_b", weights.linear_b.astype(np.float32))
    node("Gemm", ["h_last", "linear_w", "linear_b"], ["projected"], transB=1)
    node("Relu", ["projected"], ["raw"])
    node("ReduceL2", ["raw"], ["norm"], axes=[-1], keepdims=1)  # axes an attribute up to opset 17
    const("epsilon", np.array(EPSILON, np.float32))
    node("Max", ["norm", "epsilon"], ["norm_safe"])
    node("Div", ["raw", "norm_safe"], ["embedding"])

    f32, i32 = TensorProto.FLOAT, TensorProto.INT32
    inputs = [
        helper.make_tensor_value_info("log_mel", f32, ["frames", "rows", N_BANDS]),
        helper.make_tensor_value_info("gain_log10", f32, ["rows"]),
        helper.make_tensor_value_info("lengths", i32, ["rows"]),
        helper.make_tensor_value_info("h_in", f32, [LAYERS, "rows", HIDDEN]),
        helper.make_tensor_value_info("c_in", f32, [LAYERS, "rows", HIDDEN]),
    ]
    outputs = [
        helper.make_tensor_value_info("h_out", f32, [LAYERS, "rows", HIDDEN]),
        helper.make_tensor_value_info("c_out", f32, [LAYERS, "rows", HIDDEN]),
        helper.make_tensor_value_info("embedding", f32, ["rows", EMBEDDING]),
    ]
    graph = helper.make_graph(nodes, "speaker_encoder_step", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="captioner",
                              doc_string=f"resemblyzer voice encoder step ({weights.source or 'weights'})")
    model.ir_version = IR_VERSION
    return model
