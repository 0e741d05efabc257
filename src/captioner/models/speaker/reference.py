"""The voice encoder in NumPy, written out: the specification the ONNX graph is tested against.

PyTorch's LSTM, per layer and time step, with the gates stacked ``i, f, g, o``::

    z = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh
    i, f, o = sigmoid(z_i), sigmoid(z_f), sigmoid(z_o);  g = tanh(z_g)
    c_t = f * c_{t-1} + i * g;  h_t = o * tanh(c_t)

The embedding is ``relu(W h_T + b)`` of the last layer's final hidden state, scaled to unit
length. Computed in float64 (the reference's rounding is not the graph's).
"""

from __future__ import annotations

import numpy as np

from captioner.models.speaker.weights import HIDDEN, LAYERS, SpeakerWeights


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for large |x|


def zero_state(batch: int) -> tuple[np.ndarray, np.ndarray]:
    """``(h, c)``, each ``[LAYERS, batch, HIDDEN]`` float64 zeros: a partial's start."""
    return np.zeros((LAYERS, batch, HIDDEN)), np.zeros((LAYERS, batch, HIDDEN))


def run_lstm(weights: SpeakerWeights, mel: np.ndarray, state=None) -> tuple[np.ndarray, np.ndarray]:
    """The LSTM over ``mel`` ``[frames, batch, 40]`` (linear mel power) from ``state`` (``(h, c)``,
    zeros when ``None``): the state after the last frame."""
    x = np.asarray(mel, dtype=np.float64)
    if x.ndim != 3:
        raise ValueError(f"mel must be [frames, batch, bands], got shape {x.shape}")
    h, c = zero_state(x.shape[1]) if state is None else (np.array(state[0], np.float64), np.array(state[1], np.float64))
    for k, layer in enumerate(weights.layers):
        w_ih, w_hh = layer.w_ih.astype(np.float64), layer.w_hh.astype(np.float64)
        bias = layer.b_ih.astype(np.float64) + layer.b_hh.astype(np.float64)
        inputs = x @ w_ih.T + bias  # every step's input projection at once: [frames, batch, 4 H]
        h_k, c_k = h[k], c[k]
        outputs = np.empty(x.shape[:2] + (HIDDEN,))
        for t in range(x.shape[0]):
            z = inputs[t] + h_k @ w_hh.T
            i, f, g, o = np.split(z, 4, axis=-1)
            c_k = _sigmoid(f) * c_k + _sigmoid(i) * np.tanh(g)
            h_k = _sigmoid(o) * np.tanh(c_k)
            outputs[t] = h_k
        h[k], c[k] = h_k, c_k
        x = outputs
    return h, c


def embedding_of(weights: SpeakerWeights, h_last: np.ndarray) -> np.ndarray:
    """``[batch, 256]`` unit embeddings from the last layer's hidden states ``[batch, 256]``."""
    raw = np.maximum(np.asarray(h_last, np.float64) @ weights.linear_w.astype(np.float64).T
                     + weights.linear_b.astype(np.float64), 0.0)
    norm = np.linalg.norm(raw, axis=-1, keepdims=True)
    return raw / np.maximum(norm, 1e-12)


def embed_partials(weights: SpeakerWeights, mel: np.ndarray) -> np.ndarray:
    """Embeddings ``[batch, 256]`` of partial utterances ``mel`` ``[batch, frames, 40]``, each from
    a zero state (what resemblyzer's ``VoiceEncoder.forward`` computes)."""
    mel = np.asarray(mel, np.float64)
    h, _ = run_lstm(weights, mel.transpose(1, 0, 2))
    return embedding_of(weights, h[-1])
