"""The CTranslate2 model.bin reader on the packaged models and on damaged copies of them."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from graph_fixtures import base_files, tiny_files  # noqa: F401 - fixtures

from captioner.errors import UserError
from captioner.models.ct2_reader import read_model
from captioner.models.registry import SPEC_NAME, SPEC_REVISION, expected_variables


def test_tiny_header_and_table(tiny_files):
    m = read_model(tiny_files.model_paths)
    try:
        assert (m.binary_version, m.spec_name, m.spec_revision) == (6, SPEC_NAME, SPEC_REVISION)
        assert m.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
        assert m.variable("decoder/projection/weight") is m.variable("decoder/embeddings/weight")
        # Every variable the graphs use is there with the shape WhisperSpec gives it.
        for name, shape in expected_variables(tiny_files.dims).items():
            assert m.variable(name).shape == shape, name
        assert m.scalar("encoder/num_heads") == 6 and m.scalar("decoder/num_heads") == 6
        # The sinusoidal encoder positions start with sin(0)=0 / cos(0)=1 halves, as Whisper's do.
        pos = m.array("encoder/position_encodings/encodings", np.float32)
        assert np.allclose(pos[0, :192], 0.0) and np.allclose(pos[0, 192:], 1.0)
        # Variables tile the file exactly: each ends where the next header begins.
        ends = sorted((v.offset_bytes, v.offset_bytes + v.n_bytes) for v in m.variables.values())
        assert all(a[1] < b[0] for a, b in zip(ends, ends[1:]))
        assert ends[-1][1] < m.size_bytes
    finally:
        m.close()


def test_split_base_reads_across_the_part_boundary(base_files, tmp_path):
    """The two parts read as one file, including the variable cut in half by the split."""
    part1, part2 = base_files.model_paths
    joined = tmp_path / "model.bin"
    joined.write_bytes(part1.read_bytes() + part2.read_bytes())
    split, whole = read_model([part1, part2]), read_model(joined)
    try:
        boundary = part1.stat().st_size
        straddling = [v for v in split.variables.values() if v.offset_bytes < boundary < v.offset_bytes + v.n_bytes]
        assert len(straddling) == 1
        assert split.variables.keys() == whole.variables.keys() and split.aliases == whole.aliases
        for name in (straddling[0].name, "decoder/embeddings/weight", "encoder/conv1/weight", "encoder/layer_5/ffn/linear_1/bias"):
            assert np.array_equal(split.array(name), whole.array(name)), name
    finally:
        split.close()
        whole.close()


def _damaged(tmp_path, data: bytes, name: str = "model.bin"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_first_part_of_base_alone_is_refused(base_files):
    with pytest.raises(UserError, match="truncated"):
        read_model(base_files.model_paths[0])


@pytest.mark.parametrize("keep_bytes", [0, 3, 9, 40, 300, 1_000_000, -20, -1])
def test_truncated_tiny_is_refused(tiny_files, tmp_path, keep_bytes):
    data = tiny_files.model_paths[0].read_bytes()
    cut = data[:keep_bytes] if keep_bytes >= 0 else data[:keep_bytes]
    with pytest.raises(UserError) as e:
        read_model(_damaged(tmp_path, cut))
    message = str(e.value)
    assert "\n" not in message and ("truncated" in message or "empty" in message or "not a CTranslate2" in message)


def _header(tiny_path) -> tuple[bytes, int]:
    """The first bytes of tiny.en and the offset of its first variable's dtype byte."""
    data = tiny_path.read_bytes()
    name_len = struct.unpack_from("<H", data, 4)[0]
    pos = 4 + 2 + name_len + 4 + 4  # version, spec name, revision, n_variables
    var_name_len = struct.unpack_from("<H", data, pos)[0]
    pos += 2 + var_name_len
    rank = data[pos]
    return data, pos + 1 + 4 * rank


def test_malformed_files_are_refused(tiny_files, tmp_path):
    data, dtype_at = _header(tiny_files.model_paths[0])
    cases = {
        "version": struct.pack("<I", 5) + data[4:],
        "dtype": data[:dtype_at] + bytes([9]) + data[dtype_at + 1 :],
        "n_bytes": data[: dtype_at + 1] + struct.pack("<I", 3) + data[dtype_at + 5 :],
        "trailing": data + b"\0\0\0\0",
        "text": b"this is not a model file at all, just text\n" * 10,
    }
    for label, blob in cases.items():
        with pytest.raises(UserError) as e:
            read_model(_damaged(tmp_path, blob, f"{label}.bin"))
        assert "\n" not in str(e.value), label


def test_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="cannot read"):
        read_model(tmp_path / "nope.bin")
