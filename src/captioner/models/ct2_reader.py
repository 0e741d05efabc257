"""Reader for CTranslate2 ``model.bin`` files (binary format version 6).

Layout, as written by ``ctranslate2.specs.model_spec.ModelSpec._serialize`` (little-endian):

    u32 binary_version            (6)
    str spec_name                 ("WhisperSpec")
    u32 spec_revision             (3 for WhisperSpec)
    u32 n_variables
    n_variables x {str name, u8 rank, rank x u32 dim, u8 dtype_id, u32 n_bytes, n_bytes data}
    u32 n_aliases
    n_aliases x {str alias, str target}

where ``str`` is ``u16 length-including-NUL, bytes, NUL``. A file may come as several parts that
join by plain concatenation (the ``base`` package ships ``model.bin.part1`` + ``.part2``); the
parts are memory-mapped and read as one address space, so no joined copy is ever written. Every
length is checked against the bytes actually present: a truncated or malformed file raises
:class:`~captioner.errors.UserError`, never an ``IndexError`` or a half-loaded model.
"""

from __future__ import annotations

import bisect
import mmap
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from captioner.errors import UserError

SUPPORTED_BINARY_VERSION = 6

# Order matches the DataType enum of CTranslate2 (include/ctranslate2/types.h):
# float32, int8, int16, int32, float16, bfloat16. bfloat16 has no NumPy dtype; it is kept as raw
# uint16 and widened on request.
_DTYPES: tuple[tuple[str, np.dtype], ...] = (
    ("float32", np.dtype("<f4")),
    ("int8", np.dtype("i1")),
    ("int16", np.dtype("<i2")),
    ("int32", np.dtype("<i4")),
    ("float16", np.dtype("<f2")),
    ("bfloat16", np.dtype("<u2")),
)

# A sanity bound, not a format rule: names in real specs are < 200 bytes, ranks <= 4.
_MAX_NAME_BYTES = 4096
_MAX_RANK = 8


class _Parts:
    """Several files read as one byte string (their concatenation), through memory maps."""

    def __init__(self, paths: Sequence[Path]):
        self.paths = [Path(p) for p in paths]
        self._files = []
        self._maps: list[mmap.mmap | bytes] = []
        self._starts: list[int] = []
        total = 0
        try:
            for p in self.paths:
                f = open(p, "rb")
                self._files.append(f)
                size = os.fstat(f.fileno()).st_size
                self._maps.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b"")
                self._starts.append(total)
                total += size
        except OSError as e:
            self.close()
            raise UserError(f"cannot read model file {e.filename}: {e.strerror}") from None
        self.size_bytes = total

    def close(self) -> None:
        for m in self._maps:
            if isinstance(m, mmap.mmap):
                try:
                    m.close()
                except BufferError:
                    # NumPy views still reference the map; it is freed when they are.
                    pass
        for f in self._files:
            f.close()
        self._maps, self._files = [], []

    def view(self, offset: int, n_bytes: int) -> memoryview | bytes:
        """Bytes [offset, offset + n_bytes): a zero-copy view when they lie in one part, a copy
        when they straddle two."""
        if offset < 0 or n_bytes < 0 or offset + n_bytes > self.size_bytes:
            raise _Truncated(offset + n_bytes)
        if n_bytes == 0:
            return b""
        i = bisect.bisect_right(self._starts, offset) - 1
        local = offset - self._starts[i]
        part = self._maps[i]
        if local + n_bytes <= len(part):
            return memoryview(part)[local : local + n_bytes]
        chunks = []
        remaining = n_bytes
        while remaining:
            part = self._maps[i]
            take = min(remaining, len(part) - local)
            chunks.append(bytes(memoryview(part)[local : local + take]))
            remaining -= take
            i, local = i + 1, 0
        return b"".join(chunks)


class _Truncated(Exception):
    def __init__(self, needed_bytes: int):
        self.needed_bytes = needed_bytes


@dataclass(frozen=True)
class Variable:
    name: str
    shape: tuple[int, ...]
    dtype: str  # CTranslate2's name: float32, float16, int8, ...
    offset_bytes: int
    n_bytes: int


@dataclass
class Ct2Model:
    """A parsed ``model.bin``: header, variable table, aliases. Arrays are read lazily."""

    paths: tuple[Path, ...]
    binary_version: int
    spec_name: str
    spec_revision: int
    variables: dict[str, Variable]
    aliases: dict[str, str]
    size_bytes: int
    _parts: _Parts = field(repr=False)

    def __contains__(self, name: str) -> bool:
        return self.resolve(name) in self.variables

    def resolve(self, name: str) -> str:
        """The stored variable a name refers to (following aliases)."""
        seen = set()
        while name in self.aliases and name not in self.variables:
            if name in seen:
                raise UserError(f"{self.paths[0]}: alias cycle at {name!r}; the model file is corrupt")
            seen.add(name)
            name = self.aliases[name]
        return name

    def names(self) -> list[str]:
        return sorted(set(self.variables) | set(self.aliases))

    def variable(self, name: str) -> Variable:
        real = self.resolve(name)
        try:
            return self.variables[real]
        except KeyError:
            raise UserError(f"{self.paths[0]}: variable {name!r} is missing; not a complete Whisper model") from None

    def array(self, name: str, dtype: np.dtype | str | None = None) -> np.ndarray:
        """The variable as a NumPy array (read-only view into the map when no conversion is
        asked for); ``dtype`` converts (bfloat16 is widened through float32)."""
        var = self.variable(name)
        np_dtype = dict(_DTYPES)[var.dtype]
        raw = self._parts.view(var.offset_bytes, var.n_bytes)
        a = np.frombuffer(raw, dtype=np_dtype).reshape(var.shape)
        if var.dtype == "bfloat16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        if dtype is not None:
            a = a.astype(dtype, copy=False)
        return a

    def scalar(self, name: str) -> int | float:
        return self.array(name).reshape(-1)[0].item()

    def close(self) -> None:
        self._parts.close()


def read_model(paths: Path | str | Sequence[Path | str]) -> Ct2Model:
    """Parse a ``model.bin`` (or its parts, in order). Raises UserError on anything malformed."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    paths = tuple(Path(p) for p in paths)
    if not paths:
        raise UserError("no model file given")
    label = str(paths[0]) if len(paths) == 1 else f"{paths[0]} (+{len(paths) - 1} more part(s))"
    parts = _Parts(paths)
    try:
        return _parse(parts, paths, label)
    except _Truncated as e:
        parts.close()
        raise UserError(
            f"{label}: model file is truncated (it ends at byte {parts.size_bytes}, its tables need "
            f"at least {e.needed_bytes}); it is incomplete or damaged"
        ) from None
    except (UserError, ValueError, UnicodeDecodeError) as e:
        parts.close()
        if isinstance(e, UserError):
            raise
        raise UserError(f"{label}: not a CTranslate2 model file ({e})") from None


class _Cursor:
    def __init__(self, parts: _Parts):
        self.parts = parts
        self.pos = 0

    def take(self, n: int) -> bytes | memoryview:
        v = self.parts.view(self.pos, n)
        self.pos += n
        return v

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return struct.unpack("<H", self.take(2))[0]

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def string(self) -> str:
        n = self.u16()
        if n == 0 or n > _MAX_NAME_BYTES:
            raise ValueError(f"bad string length {n} at byte {self.pos - 2}")
        raw = bytes(self.take(n))
        if raw[-1] != 0:
            raise ValueError(f"string at byte {self.pos - n} is not NUL-terminated")
        return raw[:-1].decode("utf-8")


def _parse(parts: _Parts, paths: tuple[Path, ...], label: str) -> Ct2Model:
    if parts.size_bytes == 0:
        raise UserError(f"{label}: model file is empty")
    cur = _Cursor(parts)
    version = cur.u32()
    if version != SUPPORTED_BINARY_VERSION:
        raise UserError(
            f"{label}: unsupported CTranslate2 binary version {version} (this reader knows version "
            f"{SUPPORTED_BINARY_VERSION}); re-convert the model with ctranslate2 >= 3"
        )
    spec_name = cur.string()
    revision = cur.u32()
    n_vars = cur.u32()
    variables: dict[str, Variable] = {}
    for _ in range(n_vars):
        name = cur.string()
        rank = cur.u8()
        if rank > _MAX_RANK:
            raise ValueError(f"variable {name!r} has rank {rank}")
        shape = tuple(cur.u32() for _ in range(rank))
        dtype_id = cur.u8()
        if dtype_id >= len(_DTYPES):
            raise ValueError(f"variable {name!r} has unknown dtype id {dtype_id}")
        dtype_name, np_dtype = _DTYPES[dtype_id]
        n_bytes = cur.u32()
        expected = int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize
        if n_bytes != expected:
            raise ValueError(f"variable {name!r} {shape} {dtype_name} declares {n_bytes} bytes, expected {expected}")
        if cur.pos + n_bytes > parts.size_bytes:
            raise UserError(
                f"{label}: model file is truncated: variable {name!r} needs bytes up to "
                f"{cur.pos + n_bytes} but the file has {parts.size_bytes}; it is incomplete or damaged"
            )
        if name in variables:
            raise ValueError(f"variable {name!r} appears twice")
        variables[name] = Variable(name, shape, dtype_name, cur.pos, n_bytes)
        cur.pos += n_bytes
    n_aliases = cur.u32()
    aliases: dict[str, str] = {}
    for _ in range(n_aliases):
        alias = cur.string()
        aliases[alias] = cur.string()
    if cur.pos != parts.size_bytes:
        raise ValueError(f"{parts.size_bytes - cur.pos} unexpected bytes after the alias table")
    for alias, target in aliases.items():
        if target not in variables and target not in aliases:
            raise ValueError(f"alias {alias!r} points to unknown variable {target!r}")
    return Ct2Model(paths, version, spec_name, revision, variables, aliases, parts.size_bytes, parts)
