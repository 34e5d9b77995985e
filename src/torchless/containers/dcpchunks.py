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

import bisect
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from torchless.containers.dcpmeta import Chunk, TensorMeta
from torchless.errors import TruncatedInputError, UnsupportedError
from torchless.io.source import Source
from torchless.model.chunks import is_plain, raw_view, swap_unit
from torchless.model.tensor import Storage, Tensor

__all__ = ["Piece", "assembled", "coverage"]

#: Largest grid of distinct chunk boundaries checked cell by cell (else pair by pair).
_MAX_GRID_CELLS = 1 << 22
#: Most chunks of one tensor checked pair by pair (when their grid is larger).
_MAX_PAIRWISE = 4096
#: Bytes of a shard file's map consumed before their pages are handed back (chunks that
#: are not one plain range of their file are read through the map).
_RELEASE_BYTES = 4 << 20


@dataclass
class Piece:
    """One chunk with its values (a tensor of shape ``chunk.sizes``) and the file its bytes
    lie in (whose pages are handed back as they are consumed)."""

    chunk: Chunk
    tensor: Tensor
    source: Source | None = None
    #: a descriptor of that file, to read a plain range without touching the map
    fd: int | None = None


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
        if len(chunks) > _MAX_PAIRWISE:
            raise UnsupportedError(
                f"{len(chunks)} chunks on a grid of {cells} cells: too many to check that "
                "they tile the tensor", hint="no DCP save splits a tensor so finely; the "
                "metadata was made by hand or by another tool")
        overlap = any(_intersects(a, b) for i, a in enumerate(chunks) for b in chunks[i + 1:])
        return max(0, total - sum(c.numel for c in chunks)) if not overlap else 0, overlap
    import numpy as np

    count = np.zeros([len(b) - 1 for b in bounds], dtype=np.int64)
    for c in chunks:
        box = tuple(slice(bisect.bisect_left(bounds[d], c.offsets[d]),
                          bisect.bisect_left(bounds[d], c.offsets[d] + c.sizes[d]))
                    for d in range(len(size)))
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


def assembled(fqn: str, meta: TensorMeta, pieces: list[Piece], block: int = 1 << 20
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
                      stream=lambda n: stream(meta, pieces, min(n, block)))
    stride = tuple(math.prod(meta.size[i + 1:]) for i in range(len(meta.size)))
    return Tensor(storage, meta.dtype, meta.size, stride, 0)


class _Reader:
    """A piece's bytes read from its file with ``pread`` when they are one plain range of it
    (no map pages touched: the process's memory stays what the block buffers take);
    otherwise from the map, its pages handed back as they are consumed."""

    def __init__(self, piece: Piece) -> None:
        self.piece = piece
        self.base: int | None = None  # file offset of the tensor's first byte
        self.released = 0
        t, src = piece.tensor, piece.source
        if src is not None and src.size and not t.storage.streams and is_plain(t):
            buf = t.storage.buffer()  # a view of the map: no page is read
            at = src.offset_of(buf) if isinstance(buf, memoryview) else None
            if at is not None:
                self.base = at + t.storage_offset * t.dtype.itemsize

    @property
    def direct(self) -> bool:
        return self.base is not None and self.piece.fd is not None

    def read(self, start: int, into: memoryview) -> memoryview:
        """Bytes ``start:start + len(into)`` of the tensor, read into ``into``."""
        assert self.base is not None and self.piece.fd is not None
        if self.piece.source is not None:
            self.piece.source.view(0, 0)  # raises if the checkpoint is closed
        done, n = 0, len(into)
        while done < n:
            got = os.preadv(self.piece.fd, [into[done:]], self.base + start + done)
            if got <= 0:
                raise TruncatedInputError(f"the shard file ended {n - done} bytes early "
                                          "(changed while it was read?)")
            done += got
        return into

    def release(self, end: int, final: bool = False) -> None:
        """The map's pages of the tensor's bytes up to ``end`` are no longer needed (known
        only where the tensor is one plain range of the mapped file: :attr:`base`)."""
        src = self.piece.source
        if src is None or self.base is None:
            return
        if end - self.released >= _RELEASE_BYTES or (final and end > self.released):
            src.release(self.base + self.released, end - self.released)
            self.released = end


def _row_split(meta: TensorMeta, pieces: list[Piece]) -> bool:
    """Every chunk spans every dimension but the first, and is one plain byte range."""
    return all(c.offsets[1:] == (0,) * (len(meta.size) - 1) and c.sizes[1:] == meta.size[1:]
               for c in (p.chunk for p in pieces)) and all(is_plain(p.tensor) for p in pieces)


def stream(meta: TensorMeta, pieces: list[Piece], block: int) -> Iterator[memoryview | bytes]:
    """The tensor's bytes in order, in blocks of about ``block`` bytes (a block holds at
    least one row of the first dimension). A block is valid until the next is asked for
    (buffers are reused): consumers write or copy it at once."""
    if not math.prod(meta.size):
        return
    if not meta.size or _row_split(meta, pieces):
        buf = memoryview(bytearray(block))
        for p in sorted(pieces, key=lambda p: p.chunk.offsets):
            t, rd = p.tensor, _Reader(p)
            start, n = t.storage_offset * t.dtype.itemsize, t.nbytes
            view = None if rd.direct else memoryview(t.storage.buffer()).cast("B")
            for i in range(0, n, block):
                m = min(block, n - i)
                if view is None:
                    yield rd.read(i, buf[:m])
                else:
                    yield view[start + i:start + i + m]
                    rd.release(i + m, final=i + m == n)
        return
    yield from _slabs(meta, pieces, block)


def _slabs(meta: TensorMeta, pieces: list[Piece], block: int) -> Iterator[memoryview]:
    import numpy as np

    unit = swap_unit(pieces[0].tensor)
    parts = meta.dtype.itemsize // unit
    row_bytes = math.prod(meta.size[1:]) * meta.dtype.itemsize
    step = max(1, block // max(1, row_bytes))
    readers = [_Reader(p) for p in pieces]
    views: dict[int, Any] = {}
    scratch = bytearray()
    out = np.empty((step, *meta.size[1:], parts), dtype=f"<u{unit}")
    for r0 in range(0, meta.size[0], step):
        r1 = min(meta.size[0], r0 + step)
        for i, (p, rd) in enumerate(zip(pieces, readers, strict=True)):
            o, s = p.chunk.offsets, p.chunk.sizes
            lo, hi = max(r0, o[0]), min(r1, o[0] + s[0])
            if lo >= hi:
                continue
            region = (slice(lo - r0, hi - r0),
                      *(slice(a, a + n) for a, n in zip(o[1:], s[1:], strict=True)))
            piece_row = math.prod(s[1:]) * meta.dtype.itemsize
            first, count = (lo - o[0]) * piece_row, (hi - lo) * piece_row
            if rd.direct:
                if len(scratch) < count:
                    scratch = bytearray(count)
                raw = rd.read(first, memoryview(scratch)[:count])
                out[region] = np.frombuffer(raw, dtype=f"<u{unit}").reshape(
                    (hi - lo, *s[1:], parts))
            else:
                if i not in views:
                    views[i] = raw_view(p.tensor)
                out[region] = views[i][lo - o[0]:hi - o[0]]
                rd.release(first + count, final=hi == o[0] + s[0])
        yield out[:r1 - r0].data.cast("B")
