"""Whisper as three ONNX graphs, written with ``onnx.helper`` from the CTranslate2 weights.

* ``encoder``: mel [B, n_mels, 3000] float32 -> encoder states [B, 1500, d] (model precision).
* ``cross_kv``: encoder states -> per decoder layer the cross-attention keys [B, H, dh, 1500] and
  values [B, H, 1500, dh], computed once per window instead of once per token.
* ``decoder``: tokens [B, T] + the self-attention cache of every layer (keys [B, H, dh, P], values
  [B, H, P, dh]) + cross K/V -> logits [B, n_vocab] float32 of the last position and the grown cache
  (P + T). T > 1 prefills a prompt (causal mask); T == 1 is one step. The position offset is the
  cache length P, read off the cache's shape, so it can never disagree with the cache.

Alignment heads (optional, every decoder graph): given the model's ``alignment_heads`` (pairs of
decoder layer and head from its ``config.json``, the heads whose cross-attention follows the
audio), a decoder graph also outputs ``alignment_attn`` [B, A, T, 1500] float32: the
cross-attention weights of those A heads (in the order of ``sorted(alignment_heads)``) for each
new position over the encoder frames (20 ms each). Streaming policies read where a token
"looks" in the audio from it, and word times come from it by DTW (as Whisper's word timestamps).
The fixed-cache prefill outputs only its last position (T = 1), so step and prefill share one
output buffer.

Shorter audio contexts (as whisper.cpp's ``audio_ctx``): built with ``dims.with_audio_ctx(n)``,
the encoder takes mel [B, n_mels, 2n] and adds only the first n positional embeddings, and the
cross K/V graph gives [.., n, ..]; the decoder graphs built with ``audio_frames="frames"`` take
cross K/V (and output alignment weights) of any length, so one decoder serves every short
context while the 30 s graphs stay exactly as they are. Positions are still 20 ms each from the
window's start, so timestamps and attention frames keep their meaning.

Cache layout, and why it grows by concatenation rather than living in a fixed-capacity buffer:
standard ONNX has no in-place update, so a fixed [.., 448, ..] cache would be rewritten (Scatter
into a new output) at every step anyway, and attention over it would need a mask and a full 448
columns of work from the first token. A concatenated cache costs one copy of P entries per step
(tiny.en at P=448: 1.3 MB per layer-step pair, little for a GPU), attention works on only the
P real columns, and ORT's BFC arena reuses the freed blocks so there are no cudaMalloc calls in
the loop. Keys are stored pre-transposed ([.., dh, P]) so Q.K^T is one plain MatMul.

Numerics: all linear layers are ``Gemm(x, W, b, transB=1)`` on 2-D [B*T, d] activations, using the
stored [out, in] weights as they are. The 1/sqrt(head_dim) query scale (1/8 for every Whisper, a
power of two, so exact) is folded into the query weights. LayerNormalization (opset 17) computes its
statistics in float32 (stash_type=1) even for float16 inputs, and ORT's Softmax kernels accumulate in
float32, so the float16 graphs keep float32 where accuracy needs it; logits leave as float32.
GELU is the exact erf form, as in Whisper and CTranslate2 (ORT fuses it into one kernel).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from captioner.models.ct2_reader import Ct2Model
from captioner.models.registry import WhisperDims

OPSET = 17
IR_VERSION = 8  # what ONNX Runtime >= 1.14 reads; opset 17 needs IR >= 8


class _Graph:
    """Collects nodes and initializers; names every intermediate value uniquely."""

    def __init__(self, weights: Ct2Model, float_dtype: np.dtype, fused_ops: bool | None = None):
        """``fused_ops`` (default: for fp16, the CUDA graphs): GELU as ONNX Runtime's one Gelu
        kernel, and the encoder's convolutions as one matrix product each (see :meth:`conv3`)."""
        self.weights = weights
        self.dtype = np.dtype(float_dtype)
        self.onnx_float = helper.np_dtype_to_tensor_dtype(self.dtype)
        self.fused_ops = self.dtype == np.float16 if fused_ops is None else bool(fused_ops)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: dict[str, onnx.TensorProto] = {}
        self._n = 0

    def fresh(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, hint: str | None = None, **attrs) -> str | list[str]:
        outs = [self.fresh(hint or op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.fresh("n_" + op_type), **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, value: np.ndarray, hint: str = "c") -> str:
        name = self.fresh(hint)
        self.inits[name] = numpy_helper.from_array(np.asarray(value), name)
        return name

    def ints(self, values: list[int], hint: str = "shape") -> str:
        return self.const(np.asarray(values, dtype=np.int64), hint)

    def weight(self, ct2_name: str, scale: float = 1.0) -> str:
        """A model variable as an initializer in the graph's float type (shared when asked twice)."""
        real = self.weights.resolve(ct2_name)  # aliases (tied projection) share one initializer
        key = real if scale == 1.0 else f"{real}*{scale}"
        if key not in self.inits:
            a = self.weights.array(real, np.float32)
            if scale != 1.0:
                a = a * np.float32(scale)
            self.inits[key] = numpy_helper.from_array(np.ascontiguousarray(a.astype(self.dtype)), key)
        return key

    # building blocks --------------------------------------------------------------------------

    def layer_norm(self, x: str, prefix: str) -> str:
        return self.op(
            "LayerNormalization", [x, self.weight(f"{prefix}/gamma"), self.weight(f"{prefix}/beta")],
            axis=-1, epsilon=1e-5, stash_type=1, hint="ln",
        )

    def linear(self, x: str, prefix: str, scale: float = 1.0, rows: slice | None = None) -> str:
        """y = x W^T + b on 2-D x. ``rows`` takes a slice of a fused weight (e.g. Q of QKV)."""
        if rows is None:
            w, b = self.weight(f"{prefix}/weight", scale), self.weight(f"{prefix}/bias", scale)
        else:
            w = self._sliced(f"{prefix}/weight", rows, scale)
            b = self._sliced(f"{prefix}/bias", rows, scale)
        return self.op("Gemm", [x, w, b], transB=1, hint="lin")

    def _sliced(self, ct2_name: str, rows: slice, scale: float) -> str:
        key = f"{ct2_name}[{rows.start}:{rows.stop}]*{scale}"
        if key not in self.inits:
            a = self.weights.array(ct2_name, np.float32)[rows] * np.float32(scale)
            self.inits[key] = numpy_helper.from_array(np.ascontiguousarray(a.astype(self.dtype)), key)
        return key

    def gelu(self, x: str) -> str:
        if self.fused_ops:
            # ONNX Runtime's GeluFusion did not take the fp16 form below (its 1/sqrt 2 rounds in
            # fp16), and the unfused Erf and Mul were a large share of the encoder's time
            # (benchmarks/results/capacity/HISTORY.md, "kernels that read the rings").
            return self.op("Gelu", [x], domain="com.microsoft", hint="gelu")
        # 0.5 x (1 + erf(x / sqrt 2)).
        half = self.const(np.asarray(0.5, self.dtype), "half")
        one = self.const(np.asarray(1.0, self.dtype), "one")
        inv_sqrt2 = self.const(np.asarray(1 / math.sqrt(2), self.dtype), "isq2")
        e = self.op("Erf", [self.op("Mul", [x, inv_sqrt2])])
        return self.op("Mul", [self.op("Mul", [x, half]), self.op("Add", [e, one])], hint="gelu")

    def conv3(self, x_btc: str, prefix: str, stride: int, t_out: int) -> str:
        """A kernel-3, padding-1 convolution over time on time-major ``x_btc`` [B, T, C_in] as one
        matrix product: the three taps of every output frame side by side, [B * T_out, 3 C_in],
        times the weights [C_out, 3 C_in] (tap-major), plus the bias; [B, T_out, C_out] out, time
        major, as the encoder goes on. cuDNN's 1-D convolution ran far below the GPU's GEMM rate
        (benchmarks/results/capacity/HISTORY.md, "kernels that read the rings"); a GEMM of this size
        runs many times faster."""
        w = self.weights.array(f"{prefix}/weight", np.float32)  # [C_out, C_in, 3]
        c_out, c_in, k = w.shape
        assert k == 3, f"{prefix}: a kernel of {k}, not 3"
        key = f"{prefix}/weight[taps]"
        if key not in self.inits:
            taps = np.ascontiguousarray(w.transpose(0, 2, 1).reshape(c_out, 3 * c_in).astype(self.dtype))
            self.inits[key] = numpy_helper.from_array(taps, key)
        padded = self.op("Pad", [x_btc, self.ints([0, 1, 0, 0, 1, 0], "pads")], hint="pad")  # [B, T + 2, C_in]
        span = stride * (t_out - 1) + 1
        taps = [self.op("Slice", [padded, self.ints([j], "s0"), self.ints([j + span], "s1"), self.ints([1], "ax"),
                                  self.ints([stride], "st")], hint="tap") for j in range(3)]
        stacked = self.op("Reshape", [self.op("Concat", taps, axis=2), self.ints([-1, 3 * c_in], "n3c")])
        y = self.op("Gemm", [stacked, key, self.weight(f"{prefix}/bias")], transB=1, hint="conv")
        return self.op("Reshape", [y, self.ints([-1, t_out, c_out], "btc")])

    def ffn(self, x2d: str, prefix: str) -> str:
        h = self.layer_norm(x2d, f"{prefix}/ffn/layer_norm")
        h = self.gelu(self.linear(h, f"{prefix}/ffn/linear_0"))
        return self.op("Add", [x2d, self.linear(h, f"{prefix}/ffn/linear_1")], hint="res")

    def heads(self, x2d: str, shape_bthd: str, perm: list[int]) -> str:
        """[B*T, H*dh] -> [B, T, H, dh] -> transposed by ``perm``."""
        return self.op("Transpose", [self.op("Reshape", [x2d, shape_bthd])], perm=perm)

    def merge_heads(self, x_bhtd: str, shape_n_d: str) -> str:
        return self.op("Reshape", [self.op("Transpose", [x_bhtd], perm=[0, 2, 1, 3]), shape_n_d])

    def attend(self, q_bhtd: str, k_bhdp: str, v_bhpd: str, mask: str | None = None) -> str:
        return self.attend_probs(q_bhtd, k_bhdp, v_bhpd, mask)[0]

    def attend_probs(self, q_bhtd: str, k_bhdp: str, v_bhpd: str, mask: str | None = None) -> tuple[str, str]:
        """The attention's context and its weights [B, H, T, P] (what alignment heads read)."""
        scores = self.op("MatMul", [q_bhtd, k_bhdp], hint="scores")
        if mask is not None:
            scores = self.op("Add", [scores, mask])
        probs = self.op("Softmax", [scores], axis=-1, hint="probs")
        return self.op("MatMul", [probs, v_bhpd], hint="ctx"), probs

    def alignment_output(self, per_layer: list[str], n_heads: int, n_frames: int | str, last_only: bool = False,
                         last_index: str | None = None) -> onnx.ValueInfoProto:
        """Concatenate the selected heads' weights ([B, a_l, T, S] per layer) into the float32
        output ``alignment_attn`` [B, A, T, S] (``last_only``: the last position, T = 1; or, with
        ``last_index`` [B], each row's own last position)."""
        attn = per_layer[0] if len(per_layer) == 1 else self.op("Concat", per_layer, axis=1, hint="align")
        if last_only and last_index is not None:
            if isinstance(n_frames, str):  # frames known at run time only: read off the weights
                frames = self.op("Slice", [self.op("Shape", [attn]), self.ints([3]), self.ints([4])])
                target = self.op("Concat", [self.ints([1, n_heads, 1]), frames], axis=0)
            else:
                target = self.ints([1, n_heads, 1, n_frames])
            index = self.op("Expand", [self.op("Reshape", [last_index, self.ints([-1, 1, 1, 1])]), target])
            attn = self.op("GatherElements", [attn, index], axis=2, hint="align_last")
        elif last_only:
            attn = self.op("Slice", [attn, self.ints([-1]), self.ints([np.iinfo(np.int64).max]), self.ints([2])], hint="align_last")
        if self.dtype != np.float32:
            attn = self.op("Cast", [attn], to=TensorProto.FLOAT)
        self.nodes.append(helper.make_node("Identity", [attn], ["alignment_attn"]))
        return helper.make_tensor_value_info("alignment_attn", TensorProto.FLOAT, ["batch", n_heads, 1 if last_only else "new", n_frames])

    def model(self, name: str, inputs, outputs, doc: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, initializer=list(self.inits.values()))
        opsets = [helper.make_opsetid("", OPSET)]
        if any(n.domain == "com.microsoft" for n in self.nodes):
            opsets.append(helper.make_opsetid("com.microsoft", 1))
        m = helper.make_model(graph, opset_imports=opsets, producer_name="captioner", doc_string=doc)
        m.ir_version = IR_VERSION
        return m


def _scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


def _heads_by_layer(alignment_heads, n_layers: int, n_heads: int) -> dict[int, list[int]]:
    """Layer -> its alignment heads, each checked against the model's shape."""
    by_layer: dict[int, list[int]] = {}
    for layer, head in sorted((int(a), int(b)) for a, b in alignment_heads):
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise ValueError(f"alignment head ({layer}, {head}) is outside the decoder's {n_layers} layers x {n_heads} heads")
        by_layer.setdefault(layer, []).append(head)
    return by_layer


def build_encoder(
    weights: Ct2Model, dims: WhisperDims, float_dtype, progress: Callable[[float], None] = lambda f: None,
    n_layers: int | None = None, fused_attention: bool = False, fused_ops: bool | None = None,
) -> onnx.ModelProto:
    """``n_layers`` < all builds a truncated encoder with no final LayerNorm (tests compare it
    with a float64 NumPy forward). ``fused_attention`` uses ONNX Runtime's MultiHeadAttention
    contrib op (flash / memory-efficient attention on CUDA: the [B, H, 1500, 1500] scores are
    never written to memory) instead of MatMul-Softmax-MatMul. ``fused_ops``: see ``_Graph``."""
    g = _Graph(weights, float_dtype, fused_ops)
    layers = dims.n_audio_layer if n_layers is None else n_layers
    d, h = dims.n_audio_state, dims.n_audio_head
    dh = d // h
    mel = helper.make_tensor_value_info("mel", TensorProto.FLOAT, ["batch", dims.n_mels, 2 * dims.n_audio_ctx])
    x = "mel" if g.dtype == np.float32 else g.op("Cast", ["mel"], to=g.onnx_float)
    if g.fused_ops:
        x = g.op("Transpose", [x], perm=[0, 2, 1])  # [B, frames, n_mels]: time major from here on
        x = g.gelu(g.conv3(x, "encoder/conv1", 1, 2 * dims.n_audio_ctx))
        x = g.gelu(g.conv3(x, "encoder/conv2", 2, dims.n_audio_ctx))
    else:
        x = g.gelu(g.op("Conv", [x, g.weight("encoder/conv1/weight"), g.weight("encoder/conv1/bias")], pads=[1, 1], kernel_shape=[3]))
        x = g.gelu(g.op("Conv", [x, g.weight("encoder/conv2/weight"), g.weight("encoder/conv2/bias")], pads=[1, 1], strides=[2], kernel_shape=[3]))
        x = g.op("Transpose", [x], perm=[0, 2, 1])
    x = g.op("Add", [x, _audio_positions(g, dims.n_audio_ctx)])
    shape_bthd = None if fused_attention else g.ints([-1, dims.n_audio_ctx, h, dh])
    shape_n_d = g.ints([-1, d])
    x = g.op("Reshape", [x, shape_n_d])
    for i in range(layers):
        p = f"encoder/layer_{i}"
        y = g.layer_norm(x, f"{p}/self_attention/layer_norm")
        qkv = f"{p}/self_attention/linear_0"
        if fused_attention:
            shape_btd = g.ints([-1, dims.n_audio_ctx, d])
            q, k, v = (g.op("Reshape", [g.linear(y, qkv, _scale(dh) if j == 0 else 1.0, slice(j * d, (j + 1) * d)), shape_btd]) for j in range(3))
            ctx = g.op("MultiHeadAttention", [q, k, v], domain="com.microsoft", num_heads=h, scale=1.0, hint="mha")
            ctx = g.op("Reshape", [ctx, shape_n_d])
        else:
            q = g.heads(g.linear(y, qkv, _scale(dh), slice(0, d)), shape_bthd, [0, 2, 1, 3])
            k = g.heads(g.linear(y, qkv, 1.0, slice(d, 2 * d)), shape_bthd, [0, 2, 3, 1])
            v = g.heads(g.linear(y, qkv, 1.0, slice(2 * d, 3 * d)), shape_bthd, [0, 2, 1, 3])
            ctx = g.merge_heads(g.attend(q, k, v), shape_n_d)
        x = g.op("Add", [x, g.linear(ctx, f"{p}/self_attention/linear_1")], hint="res")
        x = g.ffn(x, p)
        progress((i + 1) / layers)
    if layers == dims.n_audio_layer:
        x = g.layer_norm(x, "encoder/layer_norm")
    g.nodes.append(helper.make_node("Reshape", [x, g.ints([-1, dims.n_audio_ctx, d])], ["encoder_out"]))
    out = helper.make_tensor_value_info("encoder_out", g.onnx_float, ["batch", dims.n_audio_ctx, d])
    return g.model("whisper_encoder", [mel], [out], "Whisper encoder: log-mel -> encoder states")


def _audio_positions(g: _Graph, n_audio_ctx: int) -> str:
    """The encoder's positional embeddings for ``n_audio_ctx`` positions: all of them (the
    30 s graph, exactly as before), or the first ``n_audio_ctx`` for a shorter context."""
    name = "encoder/position_encodings/encodings"
    stored = g.weights.variable(name).shape[0]
    if n_audio_ctx == stored:
        return g.weight(name)
    if not 0 < n_audio_ctx < stored:
        raise ValueError(f"audio context of {n_audio_ctx} positions: the model has {stored}")
    return g._sliced(name, slice(0, n_audio_ctx), 1.0)


def build_cross_kv(weights: Ct2Model, dims: WhisperDims, float_dtype, fused_attention: bool = False) -> onnx.ModelProto:
    """Keys come out [B, H, dh, 1500] for MatMul attention, or [B, H, 1500, dh] (the layout
    MultiHeadAttention takes) with ``fused_attention``."""
    g = _Graph(weights, float_dtype)
    h, dh, s = dims.n_text_head, dims.n_text_state // dims.n_text_head, dims.n_audio_ctx
    k_perm, k_dims = ([0, 2, 1, 3], ["batch", h, s, dh]) if fused_attention else ([0, 2, 3, 1], ["batch", h, dh, s])
    d, dt, h = dims.n_audio_state, dims.n_text_state, dims.n_text_head
    dh = dt // h
    enc = helper.make_tensor_value_info("encoder_out", g.onnx_float, ["batch", dims.n_audio_ctx, d])
    x = g.op("Reshape", ["encoder_out", g.ints([-1, d])])
    shape_bthd = g.ints([-1, dims.n_audio_ctx, h, dh])
    outputs = []
    for i in range(dims.n_text_layer):
        p = f"decoder/layer_{i}/attention/linear_1"
        k = g.heads(g.linear(x, p, 1.0, slice(0, dt)), shape_bthd, k_perm)
        v = g.heads(g.linear(x, p, 1.0, slice(dt, 2 * dt)), shape_bthd, [0, 2, 1, 3])
        g.nodes.append(helper.make_node("Identity", [k], [f"cross_k_{i}"]))
        g.nodes.append(helper.make_node("Identity", [v], [f"cross_v_{i}"]))
        outputs += [
            helper.make_tensor_value_info(f"cross_k_{i}", g.onnx_float, k_dims),
            helper.make_tensor_value_info(f"cross_v_{i}", g.onnx_float, ["batch", h, dims.n_audio_ctx, dh]),
        ]
    return g.model("whisper_cross_kv", [enc], outputs, "Whisper cross-attention keys/values of every decoder layer")


def build_decoder(weights: Ct2Model, dims: WhisperDims, float_dtype, alignment_heads=(),
                  audio_frames: int | str | None = None) -> onnx.ModelProto:
    """``alignment_heads``: (layer, head) pairs whose cross-attention weights are output too.
    ``audio_frames``: the cross K/V length the graph declares (default ``dims.n_audio_ctx``; a
    name such as ``"frames"`` makes it symbolic, for the shorter audio contexts)."""
    g = _Graph(weights, float_dtype)
    align = _heads_by_layer(alignment_heads, dims.n_text_layer, dims.n_text_head)
    align_attn: list[str] = []
    dt, h = dims.n_text_state, dims.n_text_head
    dh = dt // h
    s = dims.n_audio_ctx if audio_frames is None else audio_frames
    inputs = [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch", "new"])]
    for i in range(dims.n_text_layer):
        inputs += [
            helper.make_tensor_value_info(f"past_k_{i}", g.onnx_float, ["batch", h, dh, "past"]),
            helper.make_tensor_value_info(f"past_v_{i}", g.onnx_float, ["batch", h, "past", dh]),
        ]
    for i in range(dims.n_text_layer):
        inputs += [
            helper.make_tensor_value_info(f"cross_k_{i}", g.onnx_float, ["batch", h, dh, s]),
            helper.make_tensor_value_info(f"cross_v_{i}", g.onnx_float, ["batch", h, s, dh]),
        ]

    # Positions P .. P+T-1, where P is the cache length.
    zero, one, two = g.ints([0], "i0"), g.ints([1], "i1"), g.ints([2], "i2")
    bt = g.op("Shape", ["tokens"], hint="bt")
    t_len = g.op("Gather", [bt, one], axis=0, hint="t")  # [1]
    p_len = g.op("Gather", [g.op("Shape", ["past_v_0"]), two], axis=0, hint="p")  # [1]
    p_scalar = g.op("Squeeze", [p_len, zero])
    end = g.op("Add", [p_len, t_len])
    end_scalar = g.op("Squeeze", [end, zero])
    one_scalar = g.const(np.asarray(1, np.int64), "one_s")
    positions = g.op("Range", [p_scalar, end_scalar, one_scalar], hint="pos")  # [T]
    x = g.op("Add", [
        g.op("Gather", [g.weight("decoder/embeddings/weight"), "tokens"], axis=0),  # [B, T, d]
        g.op("Gather", [g.weight("decoder/position_encodings/encodings"), positions], axis=0),  # [T, d]
    ])
    shape_n_d = g.ints([-1, dt])
    shape_bthd = g.op("Concat", [bt, g.ints([h, dh])], axis=0)
    x = g.op("Reshape", [x, shape_n_d])

    # Causal mask [T, P+T]: column j is hidden from row t when j > P + t. All zeros when T == 1.
    cols = g.op("Range", [g.const(np.asarray(0, np.int64), "zero_s"), end_scalar, one_scalar])
    rows = g.op("Unsqueeze", [positions, one])  # [T, 1]
    hidden = g.op("Greater", [g.op("Unsqueeze", [cols, zero]), rows])
    mask = g.op("Where", [hidden, g.const(np.asarray(np.finfo(g.dtype).min, g.dtype), "neg"), g.const(np.asarray(0, g.dtype), "zero_f")], hint="mask")

    outputs = []
    for i in range(dims.n_text_layer):
        p = f"decoder/layer_{i}"
        y = g.layer_norm(x, f"{p}/self_attention/layer_norm")
        qkv = f"{p}/self_attention/linear_0"
        q = g.heads(g.linear(y, qkv, _scale(dh), slice(0, dt)), shape_bthd, [0, 2, 1, 3])
        k_new = g.heads(g.linear(y, qkv, 1.0, slice(dt, 2 * dt)), shape_bthd, [0, 2, 3, 1])
        v_new = g.heads(g.linear(y, qkv, 1.0, slice(2 * dt, 3 * dt)), shape_bthd, [0, 2, 1, 3])
        g.nodes.append(helper.make_node("Concat", [f"past_k_{i}", k_new], [f"present_k_{i}"], axis=3))
        g.nodes.append(helper.make_node("Concat", [f"past_v_{i}", v_new], [f"present_v_{i}"], axis=2))
        outputs += [
            helper.make_tensor_value_info(f"present_k_{i}", g.onnx_float, ["batch", h, dh, "total"]),
            helper.make_tensor_value_info(f"present_v_{i}", g.onnx_float, ["batch", h, "total", dh]),
        ]
        ctx = g.merge_heads(g.attend(q, f"present_k_{i}", f"present_v_{i}", mask), shape_n_d)
        x = g.op("Add", [x, g.linear(ctx, f"{p}/self_attention/linear_1")], hint="res")

        y = g.layer_norm(x, f"{p}/attention/layer_norm")
        q = g.heads(g.linear(y, f"{p}/attention/linear_0", _scale(dh)), shape_bthd, [0, 2, 1, 3])
        ctx, probs = g.attend_probs(q, f"cross_k_{i}", f"cross_v_{i}")
        if i in align:
            align_attn.append(g.op("Gather", [probs, g.ints(align[i], "heads")], axis=1))
        ctx = g.merge_heads(ctx, shape_n_d)
        x = g.op("Add", [x, g.linear(ctx, f"{p}/attention/linear_2")], hint="res")
        x = g.ffn(x, p)

    if align_attn:
        outputs.append(g.alignment_output(align_attn, sum(map(len, align.values())), s))
    x = g.layer_norm(x, "decoder/layer_norm")
    # Only the last position's logits are needed (prefill and step alike): project one row per item.
    last = g.op("Gather", [g.op("Reshape", [x, g.op("Concat", [bt, g.ints([dt])], axis=0)]), g.const(np.asarray(-1, np.int64), "last")], axis=1)
    logits = g.op("Gemm", [last, g.weight("decoder/projection/weight")], transB=1, hint="logits")
    if g.dtype != np.float32:
        logits = g.op("Cast", [logits], to=TensorProto.FLOAT)
    g.nodes.append(helper.make_node("Identity", [logits], ["logits"]))
    outputs.insert(0, helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", dims.n_vocab]))
    return g.model("whisper_decoder", inputs, outputs, "Whisper decoder step/prefill with a concatenated self-attention cache")


def build_decoder_step(weights: Ct2Model, dims: WhisperDims, float_dtype, fused_attention: bool = False,
                       alignment_heads=(), audio_frames: int | str | None = None,
                       fused_ops: bool | None = None) -> onnx.ModelProto:
    """One decoder step over a fixed-capacity cache, for CUDA graph capture.

    Every shape is static for a given batch (no Shape/Range nodes, which ONNX Runtime would run on
    the CPU and which would forbid capture): tokens [B, 1], ``offset`` [B] (each row's position
    for this token, a device-resident input updated in place: rows of one batch may be at
    different positions, e.g. after prompts of different lengths), caches ``cache_k_i`` [B, H, dh, n_text_ctx]
    and ``cache_v_i`` [B, H, n_text_ctx, dh]. The new key/value is written at ``offset`` by a
    ScatterElements into ``new_cache_*``; the runtime binds each ``new_cache_*`` output to the
    very buffer of its ``cache_*`` input, so the update happens in place: ONNX Runtime's kernel
    skips its input copy when input and output are one buffer, and writes only the B new columns
    (graph version 7 used an elementwise Where, which read and rewrote all 448 columns). Columns after a row's
    ``offset`` are masked out of its attention ([B, 1, 1, n_text_ctx] bias), so stale values from
    an earlier window or a longer neighbour's prompt never count; buffers start zeroed.

    ``fused_attention``: both attentions are ONNX Runtime's MultiHeadAttention contrib op over
    [B, H, positions, dh] keys and values (cache keys then share the values' layout, and cross keys
    come from ``build_cross_kv(fused_attention=True)``), a few kernels instead of about ten each.
    The alignment heads' weights are then computed beside the fused op, for those heads only.
    ``audio_frames`` as for :func:`build_decoder`; ``fused_ops``: see ``_Graph``.
    """
    return _fixed_cache_decoder(weights, dims, float_dtype, fused_attention, prefill=False, alignment_heads=alignment_heads,
                                audio_frames=audio_frames, fused_ops=fused_ops)


def build_decoder_prefill(weights: Ct2Model, dims: WhisperDims, float_dtype, fused_attention: bool = False,
                          alignment_heads=(), audio_frames: int | str | None = None,
                          fused_ops: bool | None = None, align_last_query: bool = True) -> onnx.ModelProto:
    """The step graph's twin for a whole prompt: tokens [B, T] at positions offset .. offset+T-1,
    written into the same fixed cache in place (a ScatterElements of the T new columns, as the
    step writes its one), causal mask, and the logits of
    each row's position ``last[b]`` ([B] int64): prompts of different lengths are right-padded to
    T, the padding's keys and values land in columns the row's next steps mask out and then
    overwrite. ``probe`` ([B] int64) names a second position per row whose logits come out too
    (``probe_logits``): the ``<|startoftranscript|>`` of a row whose prompt goes on with forced
    tokens (its no-speech probability and language are read there). Its shapes depend on T, so it
    is run normally, not captured. ``align_last_query=False`` builds converter version 10's form
    of the fused graph's alignment weights (every prompt column weighed, the last one kept), for
    benchmarks and tests that set the two side by side."""
    return _fixed_cache_decoder(weights, dims, float_dtype, fused_attention, prefill=True, alignment_heads=alignment_heads,
                                audio_frames=audio_frames, fused_ops=fused_ops, align_last_query=align_last_query)


def _fixed_cache_decoder(weights: Ct2Model, dims: WhisperDims, float_dtype, fused: bool, prefill: bool,
                         alignment_heads=(), audio_frames: int | str | None = None,
                         fused_ops: bool | None = None, align_last_query: bool = True) -> onnx.ModelProto:
    g = _Graph(weights, float_dtype, fused_ops)
    last_query = prefill and fused and align_last_query
    align = _heads_by_layer(alignment_heads, dims.n_text_layer, dims.n_text_head)
    align_attn: list[str] = []
    dt, h = dims.n_text_state, dims.n_text_head
    dh = dt // h
    s, cap = (dims.n_audio_ctx if audio_frames is None else audio_frames), dims.n_text_ctx
    inputs = [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch", "new" if prefill else 1])]
    if prefill:  # every row from `offset`; row b's prompt ends at column last[b] (shorter ones padded)
        inputs += [helper.make_tensor_value_info("offset", TensorProto.INT64, [1]),
                   helper.make_tensor_value_info("last", TensorProto.INT64, ["batch"]),
                   helper.make_tensor_value_info("probe", TensorProto.INT64, ["batch"])]
    else:  # each row at its own position
        inputs.append(helper.make_tensor_value_info("offset", TensorProto.INT64, ["batch"]))
    k_cache_dims = ["batch", h, cap, dh] if fused else ["batch", h, dh, cap]
    for i in range(dims.n_text_layer):
        inputs += [
            helper.make_tensor_value_info(f"cache_k_{i}", g.onnx_float, k_cache_dims),
            helper.make_tensor_value_info(f"cache_v_{i}", g.onnx_float, ["batch", h, cap, dh]),
        ]
    for i in range(dims.n_text_layer):
        inputs += [
            helper.make_tensor_value_info(f"cross_k_{i}", g.onnx_float, ["batch", h, s, dh] if fused else ["batch", h, dh, s]),
            helper.make_tensor_value_info(f"cross_v_{i}", g.onnx_float, ["batch", h, s, dh]),
        ]
    cols = np.arange(cap, dtype=np.int64)
    neg = g.const(np.asarray(np.finfo(g.dtype).min, g.dtype), "neg")
    zero_f = g.const(np.asarray(0, g.dtype), "zero_f")
    shape_n_d = g.ints([-1, dt])
    if prefill:
        bt = g.op("Shape", ["tokens"], hint="bt")
        t_scalar = g.op("Squeeze", [g.op("Gather", [bt, g.ints([1], "i1")], axis=0), g.ints([0], "i0")])
        positions = g.op("Add", [g.op("Range", [g.const(np.asarray(0, np.int64), "z"), t_scalar, g.const(np.asarray(1, np.int64), "o")]), "offset"])  # [T]
        token_pos = positions
        shape_bthd = g.op("Concat", [bt, g.ints([h, dh])], axis=0)
        shape_btd = g.op("Concat", [bt, g.ints([dt])], axis=0)
        rows = g.op("Unsqueeze", [positions, g.ints([1], "i1b")])  # [T, 1]
        bias = g.op("Where", [g.op("Greater", [g.const(cols.reshape(1, cap), "cols_row"), rows]), neg, zero_f], hint="mask")  # [T, C]
        if fused:
            bias = g.op("Unsqueeze", [bias, g.ints([0, 1], "i01")])  # [1, 1, T, C]
    else:
        token_pos = g.op("Unsqueeze", ["offset", g.ints([1], "i1")])  # [B, 1]: one position per row
        row_pos = g.op("Reshape", ["offset", g.ints([-1, 1, 1, 1], "b111")])  # [B, 1, 1, 1]
        shape_bthd = g.ints([-1, 1, h, dh])
        shape_btd = g.ints([-1, 1, dt])
        # [B, 1, 1, C]: each row sees its own columns up to its position.
        bias = g.op("Where", [g.op("Greater", [g.const(cols.reshape(1, 1, 1, cap), "cols"), row_pos]), neg, zero_f], hint="mask")
    x = g.op("Add", [
        g.op("Gather", [g.weight("decoder/embeddings/weight"), "tokens"], axis=0),  # [B, T, d]
        g.op("Gather", [g.weight("decoder/position_encodings/encodings"), token_pos], axis=0),  # [T, d]
    ])
    x = g.op("Reshape", [x, shape_n_d])

    def write_at(new: str, cache: str, out: str, axis: int) -> None:
        """The new keys or values into their columns of each row's cache, along ``axis`` (2, or
        3 for keys laid out [B, H, dh, C]), in place (see the step graph's docstring): the step's
        one column per row at ``offset[b]`` ([B, H, 1, dh] or [B, H, dh, 1]), the prefill's T
        columns ``offset .. offset + T - 1`` ([B, H, T, dh] or [B, H, dh, T])."""
        if prefill:
            # Every row's T columns: the positions broadcast to the new tensor's shape. (Version
            # 8 multiplied by a one-hot [T, C] matrix and rewrote the whole cache with a Where:
            # the prefill's largest cost, grown with forced prefixes; docs/capacity.md.)
            where = g.op("Reshape", [positions, g.ints([1, 1, -1, 1] if axis == 2 else [1, 1, 1, -1], f"pos_axis{axis}")])
            index = g.op("Expand", [where, g.op("Shape", [new])], hint="cols")
        else:
            shape = [1, h, 1, dh] if axis == 2 else [1, h, dh, 1]  # broadcast with [B, 1, 1, 1]: no Shape node (CPU)
            index = g.op("Expand", [row_pos, g.ints(shape, "col_shape")], hint="col")
        g.nodes.append(helper.make_node("ScatterElements", [cache, index, new], [out], axis=axis))

    def mha(q2d: str, k: str, v: str, attn_bias: str = "") -> str:
        # Query scale already folded into the weights, hence scale=1.
        q3 = g.op("Reshape", [q2d, shape_btd])
        ctx = g.op("MultiHeadAttention", [q3, k, v, "", "", attn_bias], domain="com.microsoft", num_heads=h, scale=1.0, hint="mha")
        return g.op("Reshape", [ctx, shape_n_d])

    outputs = []
    for i in range(dims.n_text_layer):
        p = f"decoder/layer_{i}"
        y = g.layer_norm(x, f"{p}/self_attention/layer_norm")
        qkv = f"{p}/self_attention/linear_0"
        q2d = g.linear(y, qkv, _scale(dh), slice(0, dt))
        k_new = g.heads(g.linear(y, qkv, 1.0, slice(dt, 2 * dt)), shape_bthd, [0, 2, 1, 3] if fused else [0, 2, 3, 1])
        v_new = g.heads(g.linear(y, qkv, 1.0, slice(2 * dt, 3 * dt)), shape_bthd, [0, 2, 1, 3])
        # The new columns written in place: the cache is bound as input and output, and
        # ScatterElements then skips its copy, where Where read and rewrote the whole cache
        # (a large share of a step's memory traffic; benchmarks/results/capacity/HISTORY.md, "Warm at
        # start").
        write_at(k_new, f"cache_k_{i}", f"new_cache_k_{i}", 2 if fused else 3)
        write_at(v_new, f"cache_v_{i}", f"new_cache_v_{i}", 2)
        outputs += [
            helper.make_tensor_value_info(f"new_cache_k_{i}", g.onnx_float, k_cache_dims),
            helper.make_tensor_value_info(f"new_cache_v_{i}", g.onnx_float, ["batch", h, cap, dh]),
        ]
        if fused:
            ctx = mha(q2d, f"new_cache_k_{i}", f"new_cache_v_{i}", bias)
        else:
            q = g.heads(q2d, shape_bthd, [0, 2, 1, 3])
            ctx = g.merge_heads(g.attend(q, f"new_cache_k_{i}", f"new_cache_v_{i}", bias), shape_n_d)
        x = g.op("Add", [x, g.linear(ctx, f"{p}/self_attention/linear_1")], hint="res")

        y = g.layer_norm(x, f"{p}/attention/layer_norm")
        q2d = g.linear(y, f"{p}/attention/linear_0", _scale(dh))
        if fused:
            ctx = mha(q2d, f"cross_k_{i}", f"cross_v_{i}")
            if i in align:  # the fused op keeps its weights to itself: the chosen heads again, plainly
                heads = g.ints(align[i], "heads")
                q = g.op("Gather", [g.heads(q2d, shape_bthd, [0, 2, 1, 3]), heads], axis=1)  # [B, a, T, dh]
                if last_query:
                    # Only each row's last position is output: its query alone, [B, a, 1, dh].
                    # (Version 10 weighed every prompt column against every audio position and
                    # then kept one: a slower prefill; benchmarks/results/capacity/HISTORY.md,
                    # "The prefill's alignment weights".)
                    at_last = g.op("Expand", [g.op("Reshape", ["last", g.ints([-1, 1, 1, 1], "b111_last")]),
                                              g.ints([1, len(align[i]), 1, dh], f"a1dh_{i}")])
                    q = g.op("GatherElements", [q, at_last], axis=2, hint="q_last")
                k = g.op("Transpose", [g.op("Gather", [f"cross_k_{i}", heads], axis=1)], perm=[0, 1, 3, 2])  # [B, a, dh, S]
                align_attn.append(g.op("Softmax", [g.op("MatMul", [q, k])], axis=-1, hint="probs"))
        else:
            q = g.heads(q2d, shape_bthd, [0, 2, 1, 3])
            ctx, probs = g.attend_probs(q, f"cross_k_{i}", f"cross_v_{i}")
            if i in align:
                align_attn.append(g.op("Gather", [probs, g.ints(align[i], "heads")], axis=1))
            ctx = g.merge_heads(ctx, shape_n_d)
        x = g.op("Add", [x, g.linear(ctx, f"{p}/attention/linear_2")], hint="res")
        x = g.ffn(x, p)

    if align_attn:
        # With last_query the weights are at each row's last position already (T = 1).
        outputs.append(g.alignment_output(align_attn, sum(map(len, align.values())), s, last_only=prefill,
                                          last_index="last" if prefill and not last_query else None))
    x = g.layer_norm(x, "decoder/layer_norm")

    def project(hidden: str, out: str) -> None:
        logits = g.op("Gemm", [hidden, g.weight("decoder/projection/weight")], transB=1, hint="logits")
        if g.dtype != np.float32:
            logits = g.op("Cast", [logits], to=TensorProto.FLOAT)
        g.nodes.append(helper.make_node("Identity", [logits], [out]))

    if prefill:  # logits of each row's last prompt position, and of its `probe` position
        rows_btd = g.op("Reshape", [x, shape_btd])

        def at(index_name: str) -> str:
            index = g.op("Expand", [g.op("Reshape", [index_name, g.ints([-1, 1, 1], "b11")]), g.ints([1, 1, dt], "11d")])  # [B, 1, d]
            return g.op("Reshape", [g.op("GatherElements", [rows_btd, index], axis=1), shape_n_d])

        project(at("last"), "logits")
        project(at("probe"), "probe_logits")
        outputs.insert(1, helper.make_tensor_value_info("probe_logits", TensorProto.FLOAT, ["batch", dims.n_vocab]))
    else:
        project(x, "logits")
    outputs.insert(0, helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", dims.n_vocab]))
    name, what = ("whisper_decoder_prefill", "prompt prefill") if prefill else ("whisper_decoder_step", "step")
    return g.model(name, inputs, outputs, f"Whisper decoder {what} over a fixed-capacity, in-place cache")


def build_gather_rows(tensors: dict[str, tuple[int, list[int]]]) -> onnx.ModelProto:
    """Copy chosen batch rows of several tensors at once: for each ``name`` -> (ONNX element type,
    dims after the batch), input ``name`` [R, ...] and ``rows`` [r] int64 give output
    ``gathered_<name>`` [r, ...]. The runtime moves the rows still decoding (their caches and
    cross K/V) into a smaller bucket's buffers with it, so finished rows stop costing steps."""
    inputs = [helper.make_tensor_value_info("rows", TensorProto.INT64, ["r"])]
    outputs, nodes = [], []
    for name, (element, dims) in tensors.items():
        inputs.append(helper.make_tensor_value_info(name, element, ["batch", *dims]))
        outputs.append(helper.make_tensor_value_info(f"gathered_{name}", element, ["r", *dims]))
        nodes.append(helper.make_node("Gather", [name, "rows"], [f"gathered_{name}"], axis=0, name=f"gather_{name}"))
    graph = helper.make_graph(nodes, "whisper_gather_rows", inputs, outputs)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="captioner",
                          doc_string="batch rows of the decoder's buffers, gathered into a smaller batch")
    m.ir_version = IR_VERSION
    return m
