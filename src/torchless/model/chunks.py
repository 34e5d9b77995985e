"""A tensor's bytes: contiguous, row-major, little-endian, in blocks of bounded size, whatever
its strides, byte order or storage (mapped, deflated, remote). The writers, the inert encoder,
``detached`` and ``to_torch`` all read a tensor's bytes here."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from torchless.model.tensor import Storage, Tensor

__all__ = ["CHUNK_BYTES", "INFLATE_CHUNK_BYTES", "chunks", "detached", "is_plain", "raw_view",
           "swap_unit"]

#: Largest block a strided or byte-swapped tensor is copied in.
CHUNK_BYTES = 16 << 20
#: Largest block a compressed (deflated) storage is inflated in while it is read.
INFLATE_CHUNK_BYTES = 4 << 20


def swap_unit(t: Tensor) -> int:
    """Size of the parts a byte swap reverses: half the item for complex types."""
    return t.dtype.itemsize // 2 if t.dtype.name.startswith("complex") else t.dtype.itemsize


def raw_view(t: Tensor) -> np.ndarray[Any, Any]:
    """The tensor's elements as unsigned ints in the storage's byte order, any strides.

    Shape is ``t.shape + (parts,)`` where ``parts`` is 2 for complex types, else 1."""
    import numpy as np

    unit = swap_unit(t)
    parts = t.dtype.itemsize // unit
    order = ">" if t.storage.byteorder == "big" and unit > 1 else "<"
    npdt = np.dtype(f"{order}u{unit}")
    shape = (*t.shape, parts)
    if t.numel == 0:
        return np.empty(shape, dtype=npdt)
    itemsize = t.dtype.itemsize
    strides = (*(s * itemsize for s in t.stride), unit)
    view: np.ndarray[Any, Any] = np.ndarray(shape, dtype=npdt, buffer=t.storage.buffer(),
                                            offset=t.storage_offset * itemsize,
                                            strides=strides)
    return view


def chunks(t: Tensor, spill_dir: str | None = None) -> Iterator[bytes | memoryview]:
    """The tensor's bytes, contiguous row-major little-endian, in blocks of bounded size.

    A compressed (or remote) storage is streamed when the tensor is all of it, contiguous
    and little-endian; otherwise it is inflated once into a temporary file in ``spill_dir``
    and read through a map (:meth:`Storage.spill`), so memory stays bounded either way and
    views sharing the storage do not inflate it again each."""
    if t.storage.streams:
        if is_plain(t) and t.nbytes == t.storage.nbytes:
            yield from t.storage.iter_bytes(0, t.nbytes, INFLATE_CHUNK_BYTES)
            return
        t.storage.spill(spill_dir)
    if t.numel == 0:
        return
    import numpy as np

    view = raw_view(_without_ones(t))
    swap = view.dtype.byteorder == ">"
    for block in _blocks(view):
        if not block.size:
            continue
        out = np.ascontiguousarray(block)
        if swap:
            out = out.astype(out.dtype.newbyteorder("<"))
        yield out.data.cast("B")


def _without_ones(t: Tensor) -> Tensor:
    """The same elements in the same order without the dimensions of size 1, whose strides
    never move: a 64-dimension tensor (``Limits.max_ndim``) then fits :func:`raw_view`'s
    extra axis under NumPy's 64, whatever those strides say."""
    if 1 not in t.shape:
        return t
    keep = [i for i, n in enumerate(t.shape) if n != 1]
    return Tensor(t.storage, t.dtype, tuple(t.shape[i] for i in keep),
                  tuple(t.stride[i] for i in keep), t.storage_offset)


def _blocks(a: np.ndarray[Any, Any]) -> Iterator[np.ndarray[Any, Any]]:
    if a.nbytes <= CHUNK_BYTES or a.ndim == 1:
        yield a
        return
    row = a.nbytes // a.shape[0]
    step = max(1, CHUNK_BYTES // max(row, 1))
    for i in range(0, a.shape[0], step):
        sub = a[i:i + step]
        if sub.nbytes <= CHUNK_BYTES:
            yield sub
        else:
            yield from _blocks(a[i])


def is_plain(t: Tensor) -> bool:
    """Contiguous and little-endian: the tensor's bytes are one range of its storage."""
    return t.is_contiguous() and (t.storage.byteorder == "little" or swap_unit(t) == 1)


def detached(t: Tensor) -> Tensor:
    """The same tensor over a private copy of its bytes (contiguous, native order): it
    stays readable after its checkpoint is closed."""
    data = b"".join(bytes(c) for c in chunks(t))
    storage = Storage(t.storage.key, t.dtype, len(data), lambda: data,
                      location=t.storage.location)
    stride = tuple(math.prod(t.shape[i + 1:]) for i in range(len(t.shape)))
    return Tensor(storage, t.dtype, t.shape, stride, 0, requires_grad=t.requires_grad,
                  is_parameter=t.is_parameter, is_storage=t.is_storage, attrs=t.attrs)
