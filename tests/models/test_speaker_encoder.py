"""The voice encoder without PyTorch: the checkpoint reader, the NumPy network, the ONNX graph.

resemblyzer's own ``pretrained.pt`` is read (the package is installed without its
dependencies: scripts/setup.sh); the tests skip where it is not installed."""

from __future__ import annotations

import collections
import io
import pickle
import struct
import sys
import types

import numpy as np
import pytest

from captioner.errors import UserError
from captioner.models.speaker import reference as ref
from captioner.models.speaker.torch_checkpoint import (
    MAGIC_NUMBER,
    PROTOCOL_VERSION,
    load_legacy_checkpoint,
)
from captioner.models.speaker.weights import (
    EMBEDDING,
    HIDDEN,
    LAYERS,
    N_BANDS,
    checkpoint_path,
    load_weights,
)


@pytest.fixture(scope="module")
def weights():
    try:
        checkpoint_path()
    except UserError as exc:
        pytest.skip(str(exc))
    return load_weights()


@pytest.fixture(scope="module")
def encoder(weights):
    from captioner.models.speaker.encoder import SpeakerEncoder

    return SpeakerEncoder("cpu", weights)


def _partials(batch: int, frames: int) -> np.ndarray:
    """Deterministic mel power ``[batch, frames, 40]``: no random generator whose stream could
    change between NumPy versions (the PyTorch figures below were made from exactly these)."""
    b, t, k = np.meshgrid(np.arange(batch), np.arange(frames), np.arange(N_BANDS), indexing="ij")
    return 10.0 ** (-2.0 + np.sin(0.1 * (t + 1) * (k + 1) + b))


def test_checkpoint_reader_gives_every_tensor_of_its_shape(weights):
    assert len(weights.layers) == LAYERS
    for k, layer in enumerate(weights.layers):
        assert layer.w_ih.shape == (4 * HIDDEN, N_BANDS if k == 0 else HIDDEN)
        assert layer.w_hh.shape == (4 * HIDDEN, HIDDEN) and layer.b_ih.shape == layer.b_hh.shape == (4 * HIDDEN,)
        assert all(a.dtype == np.float32 and np.isfinite(a).all() for a in (layer.w_ih, layer.w_hh, layer.b_ih))
    assert weights.linear_w.shape == (EMBEDDING, HIDDEN) and weights.linear_b.shape == (EMBEDDING,)
    # The LSTM's tensors are views of one storage (flattened for cuDNN): each its own part of it.
    assert not np.array_equal(weights.layers[0].b_ih, weights.layers[0].b_hh)
    checkpoint = load_legacy_checkpoint(checkpoint_path())
    assert checkpoint["step"] > 0 and checkpoint["model_state"]["similarity_weight"].shape == (1,)


def test_graph_matches_the_numpy_network_row_by_row(weights, encoder):
    # Rows of different lengths in one batch (a row with none keeps its state), each raised by
    # its own gain, from a state of its own.
    mel = _partials(4, 40)
    log_mel = np.log10(mel).transpose(1, 0, 2).astype(np.float32)  # [frames, rows, 40]
    gain = np.array([0.0, 0.7, -0.4, 1.2], np.float32)
    lengths = np.array([40, 25, 0, 7], np.int32)
    h0, c0 = ref.run_lstm(weights, mel[:, :9].transpose(1, 0, 2))  # some state to start from
    h, c, embedding = encoder.step(log_mel, gain, lengths, h0.astype(np.float32), c0.astype(np.float32))
    for r in range(4):
        n = lengths[r]
        x = 10.0 ** (log_mel[:n, r:r + 1].astype(np.float64) + np.float64(gain[r]))
        want_h, want_c = ref.run_lstm(weights, x, (h0[:, r:r + 1], c0[:, r:r + 1])) if n else (h0[:, r:r + 1], c0[:, r:r + 1])
        np.testing.assert_allclose(h[:, r], want_h[:, 0], atol=2e-5)
        np.testing.assert_allclose(c[:, r], want_c[:, 0], atol=2e-5)
        assert float(embedding[r] @ ref.embedding_of(weights, want_h[-1])[0]) > 1 - 1e-6


def test_state_carried_across_steps_equals_one_pass(encoder):
    log_mel = np.log10(_partials(3, 160)).transpose(1, 0, 2).astype(np.float32)
    gain = np.zeros(3, np.float32)
    h, c = encoder.zero_state(3)
    one_h, one_c, one_embedding = encoder.step(log_mel, gain, np.full(3, 160, np.int32), h, c)
    for start, stop in ((0, 1), (1, 11), (11, 90), (90, 97), (97, 160)):  # 10 ms, 100 ms, ... as a stream pushes
        h, c, embedding = encoder.step(log_mel[start:stop], gain, np.full(3, stop - start, np.int32), h, c)
    np.testing.assert_allclose(h, one_h, atol=1e-6)
    np.testing.assert_allclose(c, one_c, atol=1e-6)
    np.testing.assert_allclose(embedding, one_embedding, atol=1e-6)


def _legacy_file(path, obj: bytes, storages=()) -> None:
    """A checkpoint laid out as torch.save's legacy format: magic, version, system info, the
    object's pickle, the storage keys, then each storage's element count and bytes."""
    with open(path, "wb") as f:
        for value in (MAGIC_NUMBER, PROTOCOL_VERSION, {"protocol_version": 1001, "little_endian": True}):
            pickle.dump(value, f, protocol=2)
        f.write(obj)
        pickle.dump([key for key, _ in storages], f, protocol=2)
        for _, data in storages:
            f.write(struct.pack("<q", data.size) + data.tobytes())


def test_reader_refuses_code_a_zip_and_a_cut_file(tmp_path):
    evil = tmp_path / "evil.pt"
    _legacy_file(evil, b"cos\nsystem\n(S'echo pwned'\ntR.")  # os.system("echo pwned") as a pickle
    with pytest.raises(UserError, match="not a readable PyTorch checkpoint.*os.system"):
        load_legacy_checkpoint(evil)
    zipped = tmp_path / "new.pt"
    zipped.write_bytes(b"PK\x03\x04" + bytes(60))
    with pytest.raises(UserError, match="zip-format"):
        load_legacy_checkpoint(zipped)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="not a legacy PyTorch checkpoint"):
        load_legacy_checkpoint(junk)


def test_reader_rebuilds_strided_views_of_one_storage(tmp_path, monkeypatch):
    # The pickle torch.save writes, made here with stand-ins for torch's names (in sys.modules
    # only while this test runs): two tensors over one FloatStorage of 6 elements, a [2, 2] view
    # from element 1 with strides (3, 1) and its transpose.
    torch_module, utils_module = types.ModuleType("torch"), types.ModuleType("torch._utils")

    class FloatStorage:
        pass

    def _rebuild_tensor_v2(*args):
        raise AssertionError("only pickled here, never called")

    FloatStorage.__module__, FloatStorage.__qualname__ = "torch", "FloatStorage"
    _rebuild_tensor_v2.__module__, _rebuild_tensor_v2.__qualname__ = "torch._utils", "_rebuild_tensor_v2"
    torch_module.FloatStorage, utils_module._rebuild_tensor_v2 = FloatStorage, _rebuild_tensor_v2
    monkeypatch.setitem(sys.modules, "torch", torch_module)
    monkeypatch.setitem(sys.modules, "torch._utils", utils_module)

    class Tensor:
        def __init__(self, offset, size, stride):
            self.args = (STORAGE, offset, size, stride, False, collections.OrderedDict())

        def __reduce__(self):
            return _rebuild_tensor_v2, self.args

    STORAGE = object()

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            return ("storage", FloatStorage, "0", "cuda:0", 6, None) if obj is STORAGE else None

    body = io.BytesIO()
    Pickler(body, protocol=2).dump({"a": Tensor(1, (2, 2), (3, 1)), "b": Tensor(1, (2, 2), (1, 3))})
    path = tmp_path / "views.pt"
    _legacy_file(path, body.getvalue(), [("0", np.arange(6, dtype=np.float32))])
    got = load_legacy_checkpoint(path)
    np.testing.assert_array_equal(got["a"], [[1, 2], [4, 5]])
    np.testing.assert_array_equal(got["b"], [[1, 4], [2, 5]])
    cut = tmp_path / "cut.pt"
    cut.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(UserError, match="storage 0"):
        load_legacy_checkpoint(cut)
