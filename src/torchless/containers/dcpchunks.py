"""A DCP tensor put together from its chunks: coverage checked once, bytes assembled only
when asked, and streamed in bounded blocks when converting.

Each global tensor of a DCP checkpoint is saved as chunks (``offsets``, ``sizes`` per
dimension), each a tensor of its own in some shard file. The chunks must tile the tensor
exactly: an element no chunk holds would read as whatever ``torch.empty`` left there, and an
element two chunks hold depends on the order they are read; both are refused by name.

The assembled tensor is contiguous, row-major, little-endian. One chunk that covers the
whole tensor (a single process's save) is a view of the shard file, no copy. Otherwise
:func:`stream` yields the tensor's bytes in order, slab by slab of leading rows, copying
from each chunk only the rows of the slab: memory stays bounded by the block size whatever
the tensor's size, and pages of the shard files are handed back as they are consumed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchless.containers.dcpmeta import Chunk, TensorMeta
from torchless.io.source import Source
from torchless.model.chunks import is_plain, raw_view, swap_unit
from torchless.model.tensor import Storage, Tensor

__all__ = ["Piece", "assembled", "coverage"]

#: Largest grid of distinct chunk boundaries checked cell by cell (else pair by pair).
_MAX_GRID_CELLS = 1 << 22
#: Bytes of a shard file's map consumed before their pages are handed back.
_RELEASE_BYTES = 4 << 20


@dataclass
class Piece:
    """One chunk with its values (a tensor of shape ``chunk.sizes``) and the file its bytes
    lie in (whose pages are handed back as they are consumed)."""

    chunk: Chunk
    tensor: Tensor
    source: Source | None = None


def coverage(meta: TensorMeta) -> tuple[int, bool]:
    """(elements no chunk holds, whether two chunks share an element)."""
    size, chunks = meta.size, [c for c in meta.chunks if c.numel]
    total = math.prod(size)
    if not size:
        return (0 if chunks else 1), len(chunks) > 1
    bounds = [sorted({0, n, *(c.offsets[d] for c in chunks),
                      *(c.offsets[d] + c.sizes[d] for c in chunks)})
              for d, n in enumerate(size)]
    cells = math.prod(len(b) - 1 for b in bounds)
    if cells > _MAX_GRID_CELLS:
        overlap = any(_intersects(a, b) for i, a in enumerate(chunks) for b in chunks[i + 1:])
        return max(0, total - sum(c.numel for c in chunks)) if not overlap else 0, overlap
    count = np.zeros([len(b) - 1 for b in bounds], dtype=np.int64)
    for c in chunks:
        box = tuple(slice(bounds[d].index(c.offsets[d]),
                          bounds[d].index(c.offsets[d] + c.sizes[d])) for d in range(len(size)))
        count[box] += 1
    volume: np.ndarray[Any, Any] = np.ones(count.shape, dtype=np.int64)
    for d, b in enumerate(bounds):
        shape = [1] * len(size)
        shape[d] = len(b) - 1
        volume = volume * np.diff(np.array(b, dtype=np.int64)).reshape(shape)
    missing = int(volume[count == 0].sum())
    return missing, bool((count > 1).any())


def _intersects(a: Chunk, b: Chunk) -> bool:
    return all(ao < bo + bs and bo < ao + as_
               for ao, as_, bo, bs in zip(a.offsets, a.sizes, b.offsets, b.sizes, strict=True))


def assembled(fqn: str, meta: TensorMeta, pieces: list[Piece], block: int = 4 << 20
              ) -> Tensor:
    """The global tensor (contiguous, little-endian) over a storage that views the single
    chunk covering it, or assembles the chunks when first read; converting streams it."""
    pieces = [p for p in pieces if p.chunk.numel]
    itemsize = meta.dtype.itemsize
    nbytes = math.prod(meta.size) * itemsize

    def load() -> memoryview | bytes:
        if len(pieces) == 1 and is_plain(pieces[0].tensor):
            t = pieces[0].tensor
            start = t.storage_offset * itemsize
            return memoryview(t.storage.buffer()).cast("B")[start:start + nbytes]
        out = bytearray(nbytes)
        pos = 0
        for b in stream(meta, pieces, block):
            out[pos:pos + len(b)] = b
            pos += len(b)
        return memoryview(out).toreadonly()

    storage = Storage(fqn, meta.dtype, nbytes, load,
                      stream=lambda n: stream(meta, pieces, max(n, block)))
    stride = tuple(math.prod(meta.size[i + 1:]) for i in range(len(meta.size)))
    return Tensor(storage, meta.dtype, meta.size, stride, 0)


class _Releaser:
    """Hands back the pages of a piece's storage (bytes from its start) once a run of them
    has been consumed; nothing for a storage that is not a plain range of its file."""

    def __init__(self, piece: Piece) -> None:
        self.source = piece.source
        self.done = 0
        self.base: int | None = None
        storage = piece.tensor.storage
        if self.source is not None and self.source.size and not storage.streams \
                and is_plain(piece.tensor):
            buf = storage.buffer()
            if isinstance(buf, memoryview) and buf.nbytes:
                where = _address(buf) - _address(self.source.buffer)
                if 0 <= where and where + buf.nbytes <= self.source.size:
                    self.base = where

    def upto(self, end: int, final: bool = False) -> None:
        if self.base is None or self.source is None:
            return
        if end - self.done >= _RELEASE_BYTES or (final and end > self.done):
            self.source.release(self.base + self.done, end - self.done)
            self.done = end


def _address(buf: memoryview) -> int:
    return int(np.frombuffer(buf, dtype=np.uint8).ctypes.data)


def _row_split(meta: TensorMeta, pieces: list[Piece]) -> bool:
    """Every chunk spans every dimension but the first, and is one plain byte range."""
    return all(c.offsets[1:] == (0,) * (len(meta.size) - 1) and c.sizes[1:] == meta.size[1:]
               for c in (p.chunk for p in pieces)) and all(is_plain(p.tensor) for p in pieces)


def stream(meta: TensorMeta, pieces: list[Piece], block: int) -> Iterator[memoryview | bytes]:
    """The tensor's bytes in order, in blocks of about ``block`` bytes (a block holds at
    least one row of the first dimension)."""
    if not math.prod(meta.size):
        return
    itemsize = meta.dtype.itemsize
    if not meta.size or _row_split(meta, pieces):
        for p in sorted(pieces, key=lambda p: p.chunk.offsets):
            t, rel = p.tensor, _Releaser(p)
            start, n = t.storage_offset * itemsize, t.nbytes
            view = memoryview(t.storage.buffer()).cast("B")
            for i in range(0, n, block):
                yield view[start + i:start + min(n, i + block)]
                rel.upto(start + min(n, i + block), final=i + block >= n)
        return
    yield from _slabs(meta, pieces, block)


def _slabs(meta: TensorMeta, pieces: list[Piece], block: int) -> Iterator[memoryview]:
    first = pieces[0].tensor
    unit = swap_unit(first)
    parts = meta.dtype.itemsize // unit
    row_bytes = math.prod(meta.size[1:]) * meta.dtype.itemsize
    step = max(1, block // max(1, row_bytes))
    views: dict[int, Any] = {}
    releasers = {i: _Releaser(p) for i, p in enumerate(pieces)}
    for r0 in range(0, meta.size[0], step):
        r1 = min(meta.size[0], r0 + step)
        out = np.empty((r1 - r0, *meta.size[1:], parts), dtype=f"<u{unit}")
        for i, p in enumerate(pieces):
            o, s = p.chunk.offsets, p.chunk.sizes
            lo, hi = max(r0, o[0]), min(r1, o[0] + s[0])
            if lo >= hi:
                continue
            if i not in views:
                views[i] = raw_view(p.tensor)
            region = (slice(lo - r0, hi - r0),
                      *(slice(a, a + n) for a, n in zip(o[1:], s[1:], strict=True)))
            out[region] = views[i][lo - o[0]:hi - o[0]]
            if is_plain(p.tensor):
                t = p.tensor
                piece_row = math.prod(s[1:]) * meta.dtype.itemsize
                releasers[i].upto(t.storage_offset * meta.dtype.itemsize
                                  + (hi - o[0]) * piece_row, final=hi == o[0] + s[0])
        yield out.data.cast("B")
