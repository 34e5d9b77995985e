"""``safe_open``: the ``safetensors.safe_open`` interface over every file torchless reads, so
code written for safetensors reads a ``.bin``, ``.pt``, ``.ckpt``, an inert file, a
safetensors file or a sharded checkpoint's index unchanged.

The semantics are safetensors' own: ``keys()`` sorted, ``offset_keys()`` in storage order,
``get_tensor`` a private writable copy, ``get_slice(name)[...]`` the indexing safetensors
takes (for ``"pt"`` torch's: ints, slices, ``...``, None, lists, bool masks; for the others
its own slicer's: ints, slices of positive step, ``...``, ``[]``) that reads only the bytes
the slice covers (the tensor stays a view of the file map until indexed; a
storage compressed in a ZIP is inflated whole on first use),
``metadata()`` a ``str -> str`` dict or None. A name that is not in the file raises
:class:`SafeOpenError` (a ``KeyError`` and a :class:`CheckpointError`), where safetensors
raises its own ``SafetensorError``.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable
from types import TracebackType
from typing import Any

import numpy as np

from torchless.core.dtypes import DType
from torchless.core.limits import Limits
from torchless.errors import CheckpointError, UnsupportedError
from torchless.model.tensor import Tensor
from torchless.reader import checkpoint as _checkpoint
from torchless.reader import formats

#: (a private C-ordered array, the tensor's dtype) -> the framework's array
Convert = Callable[[np.ndarray[Any, Any], DType], Any]

__all__ = ["FRAMEWORKS", "SafeOpenError", "TensorSlice", "safe_open"]

#: The ``framework`` values and what they return (``flax`` is safetensors' name for JAX).
FRAMEWORKS = {"np": "numpy", "numpy": "numpy", "pt": "torch", "torch": "torch",
              "jax": "jax", "flax": "jax", "mlx": "mlx"}


class SafeOpenError(CheckpointError, KeyError):
    """No tensor of that name in the file (safetensors: ``SafetensorError``)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return CheckpointError.__str__(self)


class safe_open:
    """Open ``path`` for reading tensors by name, as ``safetensors.safe_open`` does.

    Args:
        path: any file :func:`torchless.open` reads (a torch checkpoint, a safetensors or
            inert file, a ``*.safetensors.index.json`` / ``*.bin.index.json`` with its
            shards, a registered directory layout) or a URL / file object.
        framework: ``"np"``, ``"pt"`` (torch, imported when a tensor is read), ``"jax"``
            (or ``"flax"``) or ``"mlx"``.
        device: ``"cpu"``, or for ``"pt"`` any torch device string.
        limits: as for :func:`torchless.open`.
        strict: as for :func:`torchless.open`.
        allow_globals: as for :func:`torchless.open`.
        verify_crc: as for :func:`torchless.open`.
    """

    def __init__(self, path: str | os.PathLike[str], framework: str, device: str = "cpu", *,
                 limits: Limits | None = None, strict: bool = False,
                 allow_globals: tuple[str, ...] = (), verify_crc: bool = False) -> None:
        if framework not in FRAMEWORKS:
            raise ValueError(f"framework {framework!r} is invalid (one of "
                             f"{', '.join(FRAMEWORKS)})")
        if device != "cpu" and FRAMEWORKS[framework] != "torch":
            raise ValueError(f"device {device!r}: only framework='pt' moves tensors off the "
                             "CPU")
        self.framework = FRAMEWORKS[framework]
        self.device = device
        self._convert = _converter(self.framework, device)
        self._ckpt = _checkpoint.open(path, limits=limits, strict=strict,
                                      allow_globals=allow_globals, verify_crc=verify_crc)
        self._meta: dict[str, str] | None = None
        if self._ckpt.format == "safetensors":  # the entries and metadata safetensors sees
            self._tensors, self._meta = formats.entry_tensors(
                self._ckpt._source, limits or Limits())  # the file the checkpoint maps
        else:
            self._tensors = dict(self._ckpt.tensors)

    def keys(self) -> list[str]:
        """Every tensor name, sorted (as safetensors sorts them)."""
        return sorted(self._names())

    def offset_keys(self) -> list[str]:
        """Every tensor name in the order the file stores them."""
        return list(self._names())

    def _names(self) -> list[str]:
        return [*self._tensors, *(n for n in self._ckpt.unsupported if n not in self._tensors)]

    def metadata(self) -> dict[str, str] | None:
        """A safetensors file's ``__metadata__`` as safetensors gives it (None if it has
        none); ``{"format": "pt"}`` for a torch checkpoint; an index's ``metadata`` with
        each value as a string."""
        info = self._ckpt.info
        if self._ckpt.format == "safetensors":
            return dict(self._meta) if self._meta else None
        if info.get("layout") == "index":
            return {str(k): str(v) for k, v in (info.get("metadata") or {}).items()}
        return {"format": "pt"}

    def _tensor(self, name: str) -> Tensor:
        t = self._tensors.get(name)
        if t is None:
            if name in self._ckpt.unsupported:
                raise UnsupportedError(f"{self._ckpt.unsupported[name]} tensors are not "
                                       "supported", path=self._ckpt.path, member=name)
            raise SafeOpenError(f"File does not contain tensor {name}", path=self._ckpt.path)
        return t

    def get_tensor(self, name: str) -> Any:
        """The tensor ``name``: a private, writable array of ``framework``."""
        t = self._tensor(name)
        try:
            return self._convert(np.array(t.numpy(), order="C"), t.dtype)
        except CheckpointError as e:
            raise e.add_context(path=self._ckpt.path, member=name) from None

    def get_tensors(self) -> dict[str, Any]:
        """Every tensor by name, in :meth:`offset_keys` order."""
        return {name: self.get_tensor(name) for name in self._tensors}

    def get_slice(self, name: str) -> TensorSlice:
        """The tensor ``name``, read only where it is indexed: ``get_slice(n)[0:2, :, 1]``."""
        return TensorSlice(self._tensor(name), self._convert, self.framework == "torch")

    def close(self) -> None:
        self._ckpt.close()

    def __enter__(self) -> safe_open:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<torchless.safe_open {self._ckpt.path!r} framework={self.framework}>"


class TensorSlice:
    """One tensor of an open file, indexed lazily (safetensors' ``PySafeSlice``)."""

    def __init__(self, tensor: Tensor, convert: Convert, torch: bool = False) -> None:
        self._tensor = tensor
        self._convert = convert
        self._torch = torch

    def get_shape(self) -> list[int]:
        return list(self._tensor.shape)

    def get_dtype(self) -> str:
        """The safetensors dtype name (``"F32"``, ``"BF16"`` …)."""
        dt = self._tensor.dtype
        return dt.safetensors or dt.name.upper()

    def __getitem__(self, index: Any) -> Any:
        key = _torch_index(index) if self._torch else _basic_index(index, self._tensor.shape)
        view = self._tensor.numpy()[key]  # a view of the map: no bytes read yet
        # only the pages the slice covers are read
        return self._convert(np.array(view, order="C"), self._tensor.dtype)


def _int(value: Any, where: str) -> int:
    """An index as safetensors takes it: an int, a bool (0 or 1) or any ``__index__``
    object (NumPy integers), never a NumPy bool."""
    if isinstance(value, np.bool_):
        raise TypeError(f"unsupported index {where}: expected slice, int, or ellipsis")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"unsupported index {where}: expected slice, int, or ellipsis, "
                        f"not {type(value).__name__}") from None


def _torch_index(index: Any) -> Any:
    """``index`` for ``framework="pt"``, where safetensors indexes as torch does: NumPy's
    indexing (ints, slices, ``...``, None, lists and bool masks) less what torch refuses (a
    step below 1, NumPy bools). Only the rows a list or a slice names are read."""
    items = index if isinstance(index, tuple) else (index,)
    for item in items:
        if isinstance(item, slice) and item.step is not None and _int(
                item.step, "of a slice step") < 1:
            raise ValueError("step must be greater than zero")
        if isinstance(item, np.bool_):
            raise IndexError("only integers, slices, ellipsis, None, lists and bool masks "
                             "are valid indices")
    return index


def _basic_index(index: Any, shape: tuple[int, ...]) -> tuple[Any, ...]:
    """``index`` as safetensors' ``get_slice(...)[index]`` takes it for the frameworks but
    torch (its own slicer), as a NumPy basic index
    of plain ints and slices: ints (negative from the end, out of range refused), slices
    with a step of 1 or more, one ``...``, and ``[]`` (no row). Like safetensors, None
    (a new axis), non-empty lists and arrays (gathers) are refused. Slice bounds are clipped
    to the dimension as Python clips them (safetensors 0.8 refuses negative bounds and
    bounds past the end, which a program written for it never passes)."""
    if isinstance(index, list):
        if index:
            raise TypeError("a slice takes no list of indices (safetensors: non-empty lists "
                            "are not implemented)")
        if not shape:
            raise IndexError("more indices than dimensions: the tensor is 0-d")
        return (slice(0, 0),)
    items = index if isinstance(index, tuple) else (index,)
    out: list[Any] = []
    for pos, item in enumerate(items):
        where = f"at position {pos}"
        if item is Ellipsis:
            if any(o is Ellipsis for o in out):
                raise IndexError("only one ellipsis (...) is allowed in a slice index")
            out.append(Ellipsis)
        elif isinstance(item, slice):
            step = 1 if item.step is None else _int(item.step, where)
            if step < 1:
                raise ValueError(f"slice step must be a positive integer, got {step}")
            out.append(slice(None if item.start is None else _int(item.start, where),
                             None if item.stop is None else _int(item.stop, where), step))
        else:
            out.append(_int(item, where))
    dims = [n for n in out if n is not Ellipsis]
    if len(dims) > len(shape):
        raise IndexError(f"more indices ({len(dims)}) than dimensions ({len(shape)})")
    axis = {}  # position in out -> the dimension it indexes
    before = out.index(Ellipsis) if any(o is Ellipsis for o in out) else len(out)
    for pos, _ in enumerate(out):
        if pos < before:
            axis[pos] = pos
        elif pos > before:
            axis[pos] = len(shape) - (len(out) - pos)
    for pos, item in enumerate(out):
        if isinstance(item, int) and not -shape[axis[pos]] <= item < shape[axis[pos]]:
            raise IndexError(f"index {item} is out of bounds for dimension {axis[pos]} of "
                             f"size {shape[axis[pos]]}")
    return tuple(out)


def _converter(framework: str, device: str) -> Convert:
    if framework == "numpy":
        return lambda a, dtype: a
    if framework == "torch":
        def to_torch(a: np.ndarray[Any, Any], dtype: DType) -> Any:
            from torchless.torch import from_array

            return from_array(a, dtype, device)
        return to_torch
    if framework == "jax":
        def to_jax(a: np.ndarray[Any, Any], dtype: DType) -> Any:
            import jax.numpy as jnp

            return jnp.asarray(a)
        return to_jax

    def to_mlx(a: np.ndarray[Any, Any], dtype: DType) -> Any:
        import mlx.core as mx

        if a.dtype.name == "bfloat16":  # MLX takes no ml_dtypes array: the bits, viewed
            return mx.array(a.view(np.uint16)).view(mx.bfloat16)
        return mx.array(a)
    return to_mlx
