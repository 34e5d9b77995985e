"""Storages and lazy tensors: geometry checked at creation, bytes viewed on demand."""

from __future__ import annotations

import functools
import math
import mmap
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from torchless.core.dtypes import DType, StorageType
from torchless.core.limits import Limits
from torchless.errors import (
    LimitError,
    StorageError,
    TensorGeometryError,
    UnsupportedError,
    type_phrase,
)

__all__ = ["DATALESS", "MissingStorage", "Storage", "Tensor", "TensorArray",
           "UnsupportedTensor", "make_tensor", "storage_record", "with_attrs"]

_INT64_MAX = (1 << 63) - 1


class Storage:
    """One storage record of a checkpoint: ``nbytes`` bytes that tensors view.

    ``loader`` returns the bytes (a memoryview of the file map for stored
    members, inflated bytes otherwise) and is called at most once.

    ``stream``, given for storages whose bytes are compressed in the file,
    yields the bytes in blocks of at most the size it is passed, without
    holding them all: :meth:`iter_bytes` uses it while the storage is not loaded.
    """

    __slots__ = ("_buffer", "_loader", "_stream", "_swapped", "byteorder", "dtype", "key",
                 "location", "nbytes")

    def __init__(
        self,
        key: str,
        dtype: DType,
        nbytes: int,
        loader: Callable[[], memoryview | bytes] | None,
        *,
        location: str = "cpu",
        byteorder: str = "little",
        stream: Callable[[int], Iterator[memoryview | bytes]] | None = None,
    ) -> None:
        self.key = key
        self.dtype = dtype
        self.nbytes = nbytes
        self.location = location
        self.byteorder = byteorder
        self._loader = loader
        self._stream = stream
        self._buffer: memoryview | bytes | None = None
        self._swapped: dict[int, bytes] | None = None  # made when first swapped

    def buffer(self) -> memoryview | bytes:
        if self._buffer is None:
            buf = self._load()
            got = memoryview(buf).nbytes
            if got != self.nbytes:  # never view past what is there
                raise StorageError(f"storage {self.key!r} holds {got} bytes, "
                                   f"{self.nbytes} declared")
            self._buffer = buf
        return self._buffer

    def _load(self) -> memoryview | bytes:
        """The bytes, read (:meth:`buffer` calls it once and checks their size); a subclass
        that knows where they lie reads them itself instead of holding a loader (None)."""
        if self._loader is None:  # pragma: no cover - such a subclass overrides this
            raise NotImplementedError("a storage without a loader reads its bytes itself")
        return self._loader()

    def file_offset(self, source: object) -> int | None:
        """Where the bytes :meth:`buffer` gives (once it has been called) lie in the file
        of ``source``, when the storage knows it (a stored archive member on that very
        source: :meth:`_offset_in`); None when it does not say. Cheaper than asking the
        buffer's address, once per tensor of a file of many."""
        if self._buffer is None:
            return None
        return self._offset_in(source)

    def _offset_in(self, source: object) -> int | None:
        """Where the bytes lie in ``source``'s file, or None (a loader does not say)."""
        return None

    @property
    def streams(self) -> bool:
        """True when :meth:`iter_bytes` reads the file block by block (compressed bytes,
        not loaded yet); False when it slices :meth:`buffer`."""
        return self._stream is not None and self._buffer is None

    def iter_bytes(self, begin: int, end: int, chunk: int) -> Iterator[memoryview | bytes]:
        """Bytes ``begin:end`` of the storage (its own byte order) in blocks of at most
        ``chunk`` bytes.

        A compressed storage that is not loaded is inflated block by block (the whole
        member, so that its size and CRC are checked) and is not kept: memory stays bounded
        by ``chunk`` whatever its size. Otherwise the blocks are slices of :meth:`buffer`."""
        if not 0 <= begin <= end <= self.nbytes:
            raise ValueError(f"byte range {begin}:{end} outside a storage of {self.nbytes}")
        if chunk < 1:
            raise ValueError("chunk must be positive")
        if self._stream is None or self._buffer is not None:
            view = memoryview(self.buffer()).cast("B")
            for i in range(begin, end, chunk):
                yield view[i:min(i + chunk, end)]
            return
        pos = 0
        for block in self._stream(chunk):
            n = len(block)
            lo, hi = max(begin, pos), min(end, pos + n)
            if lo < hi:
                yield block if (lo, hi) == (pos, pos + n) else memoryview(block)[lo - pos:hi - pos]
            pos += n

    def spill(self, directory: str | None = None, chunk: int = 1 << 24) -> None:
        """Inflate (or fetch) a streamed storage once into an unlinked temporary file in
        ``directory`` (the system's temporary directory if None) and view it through a map
        from then on: strided or byte-swapped tensors then read it at random without holding
        it in memory. Does nothing for a storage that does not stream."""
        if not self.streams:
            return
        if self.nbytes == 0:
            self._buffer = b""
            return
        import tempfile  # only when a storage spills: reading starts without it

        with tempfile.TemporaryFile(dir=directory, prefix=".torchless-") as f:
            for block in self.iter_bytes(0, self.nbytes, chunk):
                f.write(block)
            f.flush()
            self._buffer = memoryview(mmap.mmap(f.fileno(), self.nbytes, access=mmap.ACCESS_READ))

    def native_buffer(self, unit: int) -> memoryview | bytes:
        """The bytes in this machine's order for elements of ``unit`` bytes.

        A big-endian storage is swapped once, whole, and kept: views of it then keep their
        strides and share memory as they do in torch."""
        if self.byteorder == "little" or unit == 1:
            return self.buffer()
        if self._swapped is None:
            self._swapped = {}
        if unit not in self._swapped:
            import numpy as np

            raw = np.frombuffer(self.buffer(), dtype=f">u{unit}", count=self.nbytes // unit)
            self._swapped[unit] = raw.astype(f"<u{unit}").tobytes()
        return self._swapped[unit]

    def __repr__(self) -> str:
        return f"Storage(key={self.key!r}, dtype={self.dtype!r}, nbytes={self.nbytes})"


class Tensor:
    """A tensor of a checkpoint, read lazily.

    ``shape``, ``stride`` and ``storage_offset`` are in elements, as torch
    reports them. :meth:`numpy` returns a read-only array that views the file
    (zero-copy) with exactly those strides.

    ``attrs`` holds the Python attributes the file set on the tensor or parameter
    (``t.foo = 1`` before saving), or None. ``is_storage`` marks a storage the file holds
    as a value of its own (``t.untyped_storage()``, ``t.storage()``): it reads as the 1-D
    tensor of its bytes in its dtype, and torch loads it as a ``TypedStorage``.
    """

    __slots__ = ("attrs", "dtype", "is_parameter", "is_storage", "requires_grad", "shape",
                 "storage", "storage_offset", "stride")

    def __init__(
        self,
        storage: Storage,
        dtype: DType,
        shape: tuple[int, ...],
        stride: tuple[int, ...],
        storage_offset: int,
        *,
        requires_grad: bool = False,
        is_parameter: bool = False,
        is_storage: bool = False,
        attrs: dict[str, Any] | None = None,
    ) -> None:
        self.storage = storage
        self.dtype = dtype
        self.shape = shape
        self.stride = stride
        self.storage_offset = storage_offset
        self.requires_grad = requires_grad
        self.is_parameter = is_parameter
        self.is_storage = is_storage
        self.attrs = attrs

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's values laid out contiguously."""
        return self.numel * self.dtype.itemsize

    def is_contiguous(self) -> bool:
        if len(self.shape) == 1:  # most tensors of a file of many: the loop below, at once
            return self.stride[0] == 1 or self.shape[0] == 1
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.stride), strict=True):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    def with_flags(self, *, requires_grad: bool, is_parameter: bool,
                   attrs: dict[str, Any] | None = None) -> Tensor:
        return Tensor(self.storage, self.dtype, self.shape, self.stride, self.storage_offset,
                      requires_grad=requires_grad, is_parameter=is_parameter,
                      attrs=self.attrs if attrs is None else attrs)

    @classmethod
    def of_storage(cls, storage: Storage) -> Tensor:
        """A storage held as a value: the 1-D tensor of all its elements."""
        itemsize = storage.dtype.itemsize
        return cls(storage, storage.dtype, (storage.nbytes // itemsize,), (1,), 0,
                   is_storage=True)

    def numpy(self) -> np.ndarray[Any, Any]:
        """The values as a read-only ndarray (a view of the file where possible)."""
        import numpy as np

        npdt = self.dtype.numpy
        if npdt is None:
            raise UnsupportedError(
                f"dtype torch.{self.dtype.name} ({self.dtype.note}) has no NumPy equivalent",
                hint="read the tensor with torch (framework='pt', to_torch()) or leave it out "
                     "(convert --skip-unsupported)")
        itemsize = self.dtype.itemsize
        if self.numel == 0:
            try:
                arr = np.empty(self.shape, dtype=npdt)
            except ValueError as e:  # (0, 2**62, 4): NumPy bounds the other dims' product
                raise UnsupportedError(f"NumPy cannot hold this empty tensor of shape "
                                       f"{list(self.shape)}: {e}") from None
            arr.flags.writeable = False
            return arr
        unit = itemsize // 2 if self.dtype.name.startswith("complex") else itemsize
        buf = self.storage.native_buffer(unit)
        strides = tuple(s * itemsize for s in self.stride)
        if any(s > _INT64_MAX for s in strides):  # only on size-1 dims (make_tensor): unused
            strides = tuple(0 if n == 1 else s for n, s in zip(self.shape, strides,
                                                               strict=True))
        offset = self.storage_offset * itemsize
        try:
            view: np.ndarray[Any, Any] = np.ndarray(
                self.shape, dtype=npdt, buffer=buf, offset=offset, strides=strides)
        except ValueError as e:  # e.g. more dimensions than this NumPy allows (32 in 1.x)
            raise UnsupportedError(f"NumPy cannot view this tensor: {e}") from None
        return view

    def to_torch(self) -> Any:
        """A writable torch tensor (a ``torch.nn.Parameter`` if one was saved) with this
        tensor's dtype, shape, strides' values and ``requires_grad``; torch is imported
        (only) now."""
        from torchless.model.interop import to_torch
        from torchless.torch import _import_torch

        return to_torch(self, _import_torch("to_torch()"))

    def __dlpack__(self, **kwargs: Any) -> Any:
        """DLPack export of a private, writable copy of the values (where NumPy can export
        the dtype: not bfloat16 or float8): ``torch.from_dlpack(t)``, ``np.from_dlpack(t)``,
        ``jax.dlpack.from_dlpack(t)`` …

        Not the file's map itself: torch ignores DLPack's read-only flag, and a write into
        the read-only map would kill the process; JAX refuses read-only exports. The
        zero-copy view is :meth:`numpy`."""
        import numpy as np

        return np.array(self.numpy(), order="C").__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        device: tuple[int, int] = self.numpy().__dlpack_device__()
        return device

    def __repr__(self) -> str:
        kind = "Parameter" if self.is_parameter else "Tensor"
        return f"{kind}(dtype={self.dtype!r}, shape={list(self.shape)})"


def storage_record(storage_type: Any, key: Any, location: Any,
                   numel: Any) -> tuple[StorageType, str, str, int]:
    """Check the fields of a storage persistent id; int keys (old files) become str."""
    if not isinstance(storage_type, StorageType):
        raise StorageError(f"storage type is {type_phrase(storage_type)}")
    if isinstance(key, int) and not isinstance(key, bool):
        key = str(key)
    if type(key) is not str:
        raise StorageError(f"storage key is {type_phrase(key)}, not a str")
    if isinstance(location, bytes):
        location = location.decode("ascii", "replace")
    if type(location) is not str:
        raise StorageError(f"storage location is {type_phrase(location)}")
    if type(numel) is not int or numel < 0:
        raise StorageError(f"storage element count {numel!r} is not a non-negative int")
    return storage_type, key, location, numel


def _plain_dims(value: tuple[Any, ...]) -> bool:
    """Whether a tuple holds only ints in [0, 2**63) (what :func:`_dims` makes of it)."""
    for v in value:
        if type(v) is not int or v < 0 or v > _INT64_MAX:
            return False
    return True


def _dims(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)):
        raise TensorGeometryError(f"{what} is {type_phrase(value)}, not a sequence")
    out = []
    for v in value:
        if type(v) is not int:
            raise TensorGeometryError(f"{what} holds {type_phrase(v)}, not an int")
        if v < 0:
            raise TensorGeometryError(f"{what} holds a negative value {v}")
        if v > _INT64_MAX:  # torch keeps sizes and strides as int64: no file of it has this
            raise TensorGeometryError(f"{what} holds {v}, which overflows 64 bits")
        out.append(v)
    return tuple(out)


def make_tensor(
    storage: Any,
    storage_offset: Any,
    size: Any,
    stride: Any,
    dtype: DType,
    limits: Limits,
    *,
    requires_grad: bool = False,
) -> Tensor:
    """Check a tensor's geometry against its storage and build it."""
    if not isinstance(storage, Storage):
        raise TensorGeometryError(f"tensor storage is {type_phrase(storage)}, not a storage")
    if type(size) is tuple and type(stride) is tuple and len(size) == 1 == len(stride) and \
            type(storage_offset) is int and storage_offset >= 0 and limits.max_ndim >= 1:
        # one dimension (most tensors of a file of many): the checks below, when all pass
        n, s = size[0], stride[0]
        if type(n) is int and type(s) is int and n > 0 and 0 <= s <= _INT64_MAX:
            nbytes = n * dtype.itemsize
            last = storage_offset + (n - 1) * s
            if nbytes <= _INT64_MAX and nbytes <= limits.max_tensor_bytes and \
                    last <= _INT64_MAX and (last + 1) * dtype.itemsize <= storage.nbytes:
                return Tensor(storage, dtype, size, stride, storage_offset,
                              requires_grad=requires_grad)
    shape = size if type(size) is tuple and _plain_dims(size) else _dims(size, "size")
    strides = stride if type(stride) is tuple and _plain_dims(stride) else _dims(stride,
                                                                                 "stride")
    if len(shape) > limits.max_ndim:
        raise LimitError("max_ndim", limits.max_ndim, len(shape))
    if len(shape) != len(strides):
        raise TensorGeometryError(f"size has {len(shape)} dims but stride has {len(strides)}")
    if type(storage_offset) is not int or storage_offset < 0:
        raise TensorGeometryError(f"invalid storage offset {storage_offset!r}")
    itemsize = dtype.itemsize
    numel = 1
    last = storage_offset
    for n, s in zip(shape, strides):  # noqa: B905 - lengths are equal (checked above)
        numel *= n
        last += (n - 1) * s
    if numel * itemsize > _INT64_MAX:
        raise TensorGeometryError(f"size {list(shape)} overflows 64-bit byte counts")
    if numel * itemsize > limits.max_tensor_bytes:
        raise LimitError("max_tensor_bytes", limits.max_tensor_bytes, numel * itemsize)
    if numel == 0:
        # torch checks no bounds for an empty view (it reads nothing); only overflow matters
        if storage_offset * itemsize > _INT64_MAX:
            raise TensorGeometryError(f"storage offset {storage_offset} overflows 64 bits")
    else:
        if last > _INT64_MAX:
            raise TensorGeometryError("last element index overflows 64 bits")
        if (last + 1) * itemsize > storage.nbytes:
            raise TensorGeometryError(
                f"view size={list(shape)} stride={list(strides)} offset={storage_offset} "
                f"needs {(last + 1) * itemsize} bytes but its storage has {storage.nbytes}")
    return Tensor(storage, dtype, shape, strides, storage_offset, requires_grad=requires_grad)


@functools.cache
def _tensor_array() -> type:
    """The class, made the first time it is needed (NumPy is imported only then)."""
    import numpy as np

    class TensorArray(np.ndarray):
        """A tensor's values as an ndarray, carrying the Python attributes the file set on
        the tensor (``t.foo = 1`` before saving): what :func:`torchless.load` gives for
        such a tensor."""

    TensorArray.__module__ = __name__
    return TensorArray


if TYPE_CHECKING:
    class TensorArray(np.ndarray[Any, Any]):
        """A tensor's values as an ndarray with the tensor's Python attributes."""
else:
    def __getattr__(name: str) -> Any:
        if name == "TensorArray":
            return _tensor_array()
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def with_attrs(arr: np.ndarray[Any, Any], t: Tensor) -> np.ndarray[Any, Any]:
    """``arr`` (``t``'s values), as a :class:`TensorArray` with ``t``'s attributes if it
    has any."""
    if not t.attrs:
        return arr
    out: np.ndarray[Any, Any] = arr.view(_tensor_array())
    out.__dict__.update(t.attrs)
    return out


class MissingStorage:
    """What a persistent id yields in a plain pickle: a storage whose bytes are not in the file."""

    __slots__ = ("pid",)

    def __init__(self, pid: Any) -> None:
        self.pid = pid


class UnsupportedTensor:
    """Stands where the file holds a tensor torchless will not read (sparse, quantized …).

    Reading it, converting it or listing it among the tensors raises
    :class:`UnsupportedError` naming the tensor.
    """

    __slots__ = ("kind",)

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def error(self, name: str) -> UnsupportedError:
        return UnsupportedError(f"{self.kind} tensors are not supported", member=name)

    def __repr__(self) -> str:
        return f"UnsupportedTensor({self.kind})"


#: A tensor whose storage is not in the file (a plain pickle has no storage records).
DATALESS = UnsupportedTensor(
    "data-less (the pickle references a storage but this file holds no storage records)")
