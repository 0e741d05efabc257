"""The tensors of a PyTorch checkpoint in the legacy format, read without PyTorch.

``torch.save`` before PyTorch 1.6 (and with ``_use_new_zipfile_serialization=False`` since)
writes one file of consecutive pickles: a magic number, the protocol version (1001), the saving
system's sizes, the object itself, and the sorted keys of its storages; then every storage's raw
bytes in that order, each after its element count as a little-endian int64. Inside the object,
a tensor is a call of ``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)``
and a storage a persistent id ``("storage", <torch.FloatStorage>, key, location, numel[, view])``:
several tensors may be views of one storage (an LSTM's weights flattened for cuDNN).

The unpickler here resolves only those names (and ``collections.OrderedDict``): anything else
in the file is refused, so reading a checkpoint never runs code it names. Tensors come back as
NumPy arrays (copies, C order), wherever they were saved (``cuda:0`` included).
"""

from __future__ import annotations

import collections
import io
import pickle
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from captioner.errors import UserError

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001

_STORAGE_DTYPES = {
    "FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
    "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16,
    "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_,
}


@dataclass(frozen=True)
class _StorageType:
    name: str

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(_STORAGE_DTYPES[self.name])


@dataclass
class _Storage:
    key: str
    dtype: np.dtype
    numel: int
    data: np.ndarray | None = None


@dataclass(frozen=True)
class _TensorRef:
    """A tensor named in the pickle, made an array once its storage's bytes are read."""

    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]

    def array(self) -> np.ndarray:
        data = self.storage.data
        if data is None:
            raise UserError(f"checkpoint storage {self.storage.key} has no data")
        end = self.offset + sum((n - 1) * s for n, s in zip(self.size, self.stride)) + 1 if all(self.size) else self.offset
        if self.offset < 0 or end > data.shape[0]:
            raise UserError(f"a tensor reaches past its storage {self.storage.key} ({end} > {data.shape[0]})")
        item = data.itemsize
        view = np.lib.stride_tricks.as_strided(data[self.offset:], shape=self.size,
                                               strides=tuple(s * item for s in self.stride), writeable=False)
        return np.ascontiguousarray(view)


def _rebuild_tensor_v2(storage, storage_offset, size, stride, *_rest):
    return _TensorRef(storage, int(storage_offset), tuple(int(n) for n in size), tuple(int(s) for s in stride))


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, storages: dict[str, _Storage]):
        super().__init__(file)
        self.storages = storages

    def find_class(self, module: str, name: str):
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor_v2
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        raise pickle.UnpicklingError(f"{module}.{name} is not something a checkpoint of tensors holds")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage" and isinstance(pid[1], _StorageType)):
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r:.60}")
        _, storage_type, key, _location, numel = pid[:5]
        if len(pid) > 5 and pid[5] is not None:
            raise pickle.UnpicklingError("storage views (PyTorch before 0.4) are not supported")
        storage = self.storages.get(key)
        if storage is None:
            storage = self.storages[key] = _Storage(str(key), storage_type.dtype, int(numel))
        return storage


def _materialise(value):
    if isinstance(value, _TensorRef):
        return value.array()
    if isinstance(value, dict):
        out = type(value)() if isinstance(value, collections.OrderedDict) else {}
        for k, v in value.items():
            out[k] = _materialise(v)
        return out
    if isinstance(value, list):
        return [_materialise(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_materialise(v) for v in value)
    return value


def load_legacy_checkpoint(path: str | Path):
    """The object saved in ``path`` (a legacy-format ``torch.save`` file), its tensors as NumPy
    arrays. Raises :class:`~captioner.errors.UserError` for anything else (a zip-format
    checkpoint, a truncated file, a pickle that names other code)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read the checkpoint {path}: {exc.strerror or exc}") from None
    if raw[:2] == b"PK":
        raise UserError(f"{path.name} is a zip-format PyTorch checkpoint; only the legacy format is read here")
    f = io.BytesIO(raw)
    try:
        magic = pickle.load(f)
        version = pickle.load(f)
        sys_info = pickle.load(f)
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError):
        magic = None
    if magic != MAGIC_NUMBER or version != PROTOCOL_VERSION:
        raise UserError(f"{path.name} is not a legacy PyTorch checkpoint")
    if not isinstance(sys_info, dict) or not sys_info.get("little_endian", False):
        raise UserError(f"{path.name} was saved big-endian; only little-endian checkpoints are read")
    storages: dict[str, _Storage] = {}
    try:
        obj = _Unpickler(f, storages).load()
        keys = pickle.load(f)
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise UserError(f"{path.name} is not a readable PyTorch checkpoint: {exc}") from None
    at = f.tell()
    for key in keys:
        storage = storages.get(key)
        if storage is None:
            raise UserError(f"{path.name}: storage {key} is listed but no tensor uses it")
        if at + 8 > len(raw):
            raise UserError(f"{path.name} is truncated (storage {key})")
        (numel,) = struct.unpack_from("<q", raw, at)
        n_bytes = numel * storage.dtype.itemsize
        if numel != storage.numel or at + 8 + n_bytes > len(raw):
            raise UserError(f"{path.name}: storage {key} holds {numel} elements, {storage.numel} expected, or is cut")
        storage.data = np.frombuffer(raw, dtype=storage.dtype.newbyteorder("<"), count=numel, offset=at + 8)
        at += 8 + n_bytes
    return _materialise(obj)
