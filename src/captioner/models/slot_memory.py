"""The fixed-cache decoder's device memory: a few regions shared by every batch size.

A decoding pass's self-attention cache and cross K/V (about 12 MB a row for tiny.en at the 30 s
context) live in fixed buffers, bound once to a captured CUDA graph per batch size. Held per
batch size, a server warmed up to 256-row batches kept every bucket's buffers at once: 871 rows,
10 GiB of them (docs/gpu-memory.md), though one engine thread decodes one pass at a time.
Here the buffers of every batch size are views into a region sized by the largest pass met,
and a region is held by one live decoder state at a time. The engine's passes follow each other,
so they all land in one region, with one slot (and one graph) per batch size as before. A pass
whose finished rows are dropped (compacted into a smaller batch size) stays in its region: the
rows kept are gathered into a scratch region, then back to the front of their own.

Only the thread that drives the runtime calls this.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_REGIONS = 4
"""Live decoder states that keep their own memory; one more takes over the least recently
started (its state raises if stepped again). The engine, one pass at a time, needs one."""
ALIGN_BYTES = 256
"""Each view starts on this boundary (what cudaMalloc gives a buffer of its own)."""


@dataclass(frozen=True)
class BufferView:
    """``shape`` of ``dtype`` at ``offset`` bytes into ``region``: bound to a graph by address."""

    region: Region
    offset: int
    shape: tuple[int, ...]
    dtype: Any

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize

    @property
    def ptr(self) -> int:
        return self.region.ptr + self.offset


@dataclass(eq=False)
class Region:
    """One device allocation (an OrtValue of bytes, so it is ONNX Runtime's memory like the rest)."""

    index: int
    value: Any = field(repr=False)
    nbytes: int
    device: tuple[str, int]
    generation: int = 0
    """Bumped at every start in this region: a state of an older generation has lost it."""
    owner: weakref.ref | None = field(default=None, repr=False)
    """The decoder state using the region now."""
    last_used: int = 0

    @property
    def ptr(self) -> int:
        return int(self.value.data_ptr())

    @property
    def free(self) -> bool:
        return self.owner is None or self.owner() is None


class Layout:
    """Views laid out one after another from the start of a region, each aligned."""

    def __init__(self) -> None:
        self.views: list[tuple[int, tuple[int, ...], Any]] = []
        self.nbytes = 0

    def add(self, shape: tuple[int, ...], dtype) -> int:
        """Reserve ``shape`` of ``dtype``; its index in :attr:`views`."""
        offset = -(-self.nbytes // ALIGN_BYTES) * ALIGN_BYTES
        self.views.append((offset, tuple(int(n) for n in shape), dtype))
        self.nbytes = offset + int(np.prod(shape)) * np.dtype(dtype).itemsize
        return len(self.views) - 1

    def place(self, region: Region) -> list[BufferView]:
        if self.nbytes > region.nbytes:
            raise ValueError(f"{self.nbytes} bytes do not fit a region of {region.nbytes}")
        return [BufferView(region, offset, shape, dtype) for offset, shape, dtype in self.views]


class RegionPool:
    """The regions of one runtime's decoder, at most :data:`MAX_REGIONS`.

    ``allocate(nbytes)`` makes a zeroed region on the decoder's device; ``on_retire(region)`` is
    told when a region is let go (the slots bound to it must go: their graphs hold its address).
    """

    def __init__(self, allocate: Callable[[int], Any], device: tuple[str, int],
                 on_retire: Callable[[Region], None]) -> None:
        self._allocate = allocate
        self._device = device
        self._on_retire = on_retire
        self.regions: list[Region] = []
        self._scratch: Region | None = None
        self._made = 0
        self._starts = 0

    @property
    def held(self) -> list[Region]:
        """Every region held now, the scratch region included."""
        return self.regions + ([self._scratch] if self._scratch is not None else [])

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.held)

    def scratch(self, nbytes: int) -> Region:
        """Where a compaction gathers the rows it keeps: one region, made larger when a larger
        compaction comes (nothing is bound to it between compactions)."""
        if self._scratch is None or self._scratch.nbytes < nbytes:
            self._scratch = None  # the old one goes first: both at once would be the peak
            self._scratch = self._new(nbytes)
        return self._scratch

    def acquire(self, nbytes: int) -> Region:
        """A region of at least ``nbytes`` for a new decoder state, in this order: a free one
        that is large enough; a free one made larger; a new one while under the limit; the
        least recently started one (taken over). A region is made as large as the largest one
        held, so that passes of every size keep landing in the same few (and their graphs)."""
        self._starts += 1
        free = [r for r in self.regions if r.free]
        fits = [r for r in free if r.nbytes >= nbytes]
        if fits:
            return self._use(min(fits, key=lambda r: (r.nbytes, r.last_used)))
        size = max([nbytes] + [r.nbytes for r in self.regions])
        if free:
            return self._use(self._replace(min(free, key=lambda r: r.last_used), size))
        if len(self.regions) < MAX_REGIONS:
            region = self._new(size)
            self.regions.append(region)
            return self._use(region)
        oldest = min(self.regions, key=lambda r: r.last_used)
        return self._use(oldest if oldest.nbytes >= nbytes else self._replace(oldest, size))

    def own(self, region: Region, state: Any) -> int:
        """``state`` holds ``region`` from now on; the generation it holds it in."""
        region.generation += 1
        region.owner = weakref.ref(state)
        return region.generation

    def release(self, region: Region) -> None:
        """The region's state is done with it (moved elsewhere): free for the next start."""
        region.owner = None
        region.generation += 1

    def _use(self, region: Region) -> Region:
        region.last_used = self._starts
        return region

    def _new(self, nbytes: int) -> Region:
        self._made += 1
        return Region(self._made, self._allocate(nbytes), nbytes, self._device)

    def _replace(self, old: Region, nbytes: int) -> Region:
        self._on_retire(old)
        old.generation += 1  # a state still holding it (taken over) raises if stepped
        region = self._new(nbytes)
        self.regions[self.regions.index(old)] = region
        return region
