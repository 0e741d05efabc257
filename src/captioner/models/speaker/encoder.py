"""The voice encoder's step graph in an ONNX Runtime session: many rows, state in and out.

A row is one partial utterance being heard (of any stream); the caller keeps every row's LSTM
state between calls (``h``, ``c``: [3, rows, 256]) and passes the rows that have new frames.
On the CPU the arrays are NumPy; on CUDA (``xp`` CuPy) they stay on the device: inputs are bound
by pointer and the outputs written into device arrays, so a batch of streams costs one run and no
copy to the host but the embeddings the caller asks for.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from captioner.models.session import CUDA, OrtModel, ProviderChoice, choose_provider
from captioner.models.speaker.graph import build_graph
from captioner.models.speaker.weights import (
    EMBEDDING,
    HIDDEN,
    LAYERS,
    SpeakerWeights,
    load_weights,
)

GRAPH_NAME = "speaker_encoder.onnx"  # names the in-memory graph in messages


class SpeakerEncoder:
    """Called by one thread (the engine's). ``device``: as every command's ``--device``, or a
    :class:`~captioner.models.session.ProviderChoice` already made; ``intra_threads``: ONNX
    Runtime's CPU threads (``None``: its default)."""

    def __init__(self, device: str | ProviderChoice | None = "cpu", weights: SpeakerWeights | None = None,
                 intra_threads: int | None = None) -> None:
        self.weights = weights or load_weights()
        choice = device if isinstance(device, ProviderChoice) else choose_provider(device)
        graph = build_graph(self.weights).SerializeToString()
        self.model = OrtModel(Path(GRAPH_NAME), choice, intra_threads=intra_threads, model_bytes=graph)
        self.runs = 0

    @property
    def provider(self) -> str:
        return self.model.provider

    @property
    def on_device(self) -> bool:
        return self.model.provider == CUDA

    @staticmethod
    def zero_state(rows: int, xp=np):
        """``(h, c)`` of ``rows`` rows that have heard nothing, float32 in ``xp``."""
        return xp.zeros((LAYERS, rows, HIDDEN), xp.float32), xp.zeros((LAYERS, rows, HIDDEN), xp.float32)

    def step(self, log_mel, gain_log10, lengths, h, c, xp=np):
        """Advance each row ``r`` by its first ``lengths[r]`` frames of ``log_mel``
        ``[frames, rows, 40]`` (``log10`` mel power), each raised by ``gain_log10[r]`` first,
        from state ``(h[:, r], c[:, r])``. Returns ``(h, c, embedding)``: the new state and each
        row's embedding of all it has heard ([rows, 256], unit length), arrays of ``xp``."""
        rows = int(lengths.shape[0])
        inputs = {
            "log_mel": xp.ascontiguousarray(log_mel, dtype=xp.float32),
            "gain_log10": xp.ascontiguousarray(gain_log10, dtype=xp.float32),
            "lengths": np.ascontiguousarray(lengths, dtype=np.int32) if xp is np else xp.ascontiguousarray(lengths, dtype=xp.int32),
            "h_in": xp.ascontiguousarray(h, dtype=xp.float32),
            "c_in": xp.ascontiguousarray(c, dtype=xp.float32),
        }
        if inputs["log_mel"].shape[1:] != (rows, 40) or inputs["h_in"].shape != (LAYERS, rows, HIDDEN):
            raise ValueError(f"log_mel must be [frames, {rows}, 40] and the state [3, {rows}, 256], got "
                             f"{tuple(inputs['log_mel'].shape)} and {tuple(inputs['h_in'].shape)}")
        self.runs += 1
        if self.on_device and xp is not np:
            binding = self.model.binding()
            binding.bind_all(inputs)
            h_out, c_out = xp.empty_like(inputs["h_in"]), xp.empty_like(inputs["c_in"])
            embedding = xp.empty((rows, EMBEDDING), xp.float32)
            for name, value in (("h_out", h_out), ("c_out", c_out), ("embedding", embedding)):
                binding.bind_output_array(name, value)
            binding.run_bound()
            return h_out, c_out, embedding
        host = {k: (v.get() if hasattr(v, "get") else v) for k, v in inputs.items()}
        out = self.model.run(host, host_outputs=("h_out", "c_out", "embedding"))
        if xp is np:
            return out["h_out"], out["c_out"], out["embedding"]
        return xp.asarray(out["h_out"]), xp.asarray(out["c_out"]), xp.asarray(out["embedding"])
