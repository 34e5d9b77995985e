"""A ``torch.load`` drop-in for programs that have torch: real torch tensors and Parameters,
read by torchless, so no pickle code ever runs.

``torchless.torch.load(f, map_location=None)`` takes what ``torch.load`` takes (a path or a
binary file object) and returns the object ``torch.load`` would, with storages shared as
torch shares them. Unlike ``torch.load(weights_only=True)`` it reads the checkpoints that carry
an ``argparse.Namespace``, NumPy values, OmegaConf or dataclass configs: what the rebuild rules
know is rebuilt, any other object is an inert :class:`torchless.Opaque` record.
:func:`patched` swaps ``torch.load`` for this function inside a ``with`` block (around a
library that calls ``torch.load`` itself).

This is the one module of the library that imports torch, and only when one of its functions
is called: ``import torchless`` (and ``import torchless.torch``) never does.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import IO, Any

from torchless.core.dtypes import DType
from torchless.core.limits import Limits
from torchless.errors import UnsupportedError
from torchless.model.interop import finish_tensor, record_to_torch

__all__ = ["from_array", "load", "patched"]

MapLocation = Any  # None, str, torch.device, dict[str, str] or callable(storage, location)


def _import_torch() -> Any:
    """torch, imported when a function of this module is called (the one place in
    torchless that imports it; tests/project/test_static_safety.py allows it here only)."""
    import torch  # noqa: TID251 - the drop-in returns torch objects; see the module docstring

    return torch


def load(f: str | os.PathLike[str] | IO[bytes], map_location: MapLocation = None,
         pickle_module: Any = None, *, weights_only: bool | None = None,
         mmap: bool | None = None, limits: Limits | None = None, strict: bool = False,
         allow_globals: tuple[str, ...] = (), verify_crc: bool = False,
         **pickle_load_args: Any) -> Any:
    """``torch.load`` without running pickle code.

    Args:
        f: a path, or a binary file object (read by ranges; ``seek`` and ``read``).
        map_location: as ``torch.load``: None (each storage where it was saved), a device
            string or ``torch.device``, a dict mapping saved locations to others, or a
            callable ``(storage, location)`` returning a storage or None. Each storage is
            restored once, by ``torch.serialization.default_restore_location``, so tensors
            that shared a storage still share it.
        pickle_module: must be None (torchless never unpickles).
        weights_only: accepted for compatibility and ignored: nothing in the file can run,
            whichever value is given; unknown classes come back as inert records instead
            of being refused.
        mmap: accepted and ignored: tensors are private, writable copies of the file's bytes.
        limits: as for :func:`torchless.open`.
        strict: as for :func:`torchless.open`.
        allow_globals: as for :func:`torchless.open`.
        verify_crc: as for :func:`torchless.open`.
        pickle_load_args: ``encoding`` (``"latin1"`` / ``"bytes"`` for Python 2 files) is
            accepted; torchless decodes Python 2 strings its own way.

    Raises:
        CheckpointError: anything wrong with the file (never a raw unpickling error).
        ValueError: a ``pickle_module`` or an unknown keyword.
    """
    if pickle_module is not None:
        raise ValueError("torchless.torch.load never unpickles: pickle_module must be None")
    unknown = set(pickle_load_args) - {"encoding"}
    if unknown:
        raise ValueError(f"unknown keyword(s) for load: {', '.join(sorted(unknown))}")
    del weights_only, mmap
    torch = _import_torch()
    from torchless.reader import checkpoint as _checkpoint
    from torchless.reader import formats

    if isinstance(f, (str, os.PathLike)) and formats.sniff(os.fspath(f)) == "safetensors":
        obj = _checkpoint.load(f, tensors="torch", limits=limits, strict=strict,
                               allow_globals=allow_globals, verify_crc=verify_crc)
        return _relocate(obj, torch, map_location)
    return _Loader(torch, map_location, limits or Limits()).load(f, strict, allow_globals,
                                                                  verify_crc)


@contextlib.contextmanager
def patched(**defaults: Any) -> Iterator[None]:
    """``torch.load`` is :func:`load` inside the block (keywords given here are passed to
    every call), and the original again after it, even on an exception.

    Code that imported the function itself before the block (``from torch import load``)
    keeps the original: patch before importing it, or call :func:`load` directly."""
    torch = _import_torch()
    original = torch.load

    def drop_in(f: Any, map_location: MapLocation = None, pickle_module: Any = None,
                **kwargs: Any) -> Any:
        return load(f, map_location, pickle_module, **{**defaults, **kwargs})

    torch.load = drop_in
    try:
        yield
    finally:
        torch.load = original


def from_array(a: Any, dtype: DType, device: str = "cpu") -> Any:
    """A torch tensor owning a copy of the C-ordered array ``a`` of torch dtype ``dtype``
    (any dtype: bfloat16 and float8 arrive as ml_dtypes arrays, read as bytes)."""
    torch = _import_torch()
    from torchless.model.interop import torch_dtypes

    tdtype = torch_dtypes(torch).get(dtype.name)
    if tdtype is None:
        raise UnsupportedError(f"this torch has no dtype {dtype.name}")
    raw = bytearray(a.tobytes())
    flat = (torch.frombuffer(raw, dtype=torch.uint8) if raw
            else torch.empty(0, dtype=torch.uint8))
    out = flat.view(tdtype).reshape(a.shape)
    return out if device == "cpu" else out.to(device)


class _Loader:
    """One load: torch storages made once per torchless storage, tensors viewing them."""

    def __init__(self, torch: Any, map_location: MapLocation, limits: Limits) -> None:
        from torchless.model.interop import torch_dtypes

        self.torch = torch
        self.map_location = map_location
        self.limits = limits
        self.dtypes = torch_dtypes(torch)
        self.storages: dict[int, Any] = {}
        self.leaves: dict[int, tuple[Any, Any]] = {}  # id -> (tensor, torch value), made once

    def load(self, f: Any, strict: bool, allow: tuple[str, ...], verify_crc: bool) -> Any:
        from torchless.errors import CheckpointError
        from torchless.model.graph import finish
        from torchless.model.walk import LEAVES
        from torchless.pickle.values import Global
        from torchless.reader import checkpoint as _checkpoint

        ckpt = _checkpoint.open(f, limits=self.limits, strict=strict, allow_globals=allow,
                                verify_crc=verify_crc)
        with ckpt:
            unreadable = [(n, k) for n, k in ckpt.unsupported.items() if n not in ckpt.records]
            if unreadable:
                name, kind = unreadable[0]
                raise UnsupportedError(f"{kind} tensors are not supported", path=ckpt.path,
                                       member=name,
                                       hint="torchless.open(FILE) reads the other tensors")
            try:
                return finish(ckpt.tree, self.limits, lambda o: None, self.leaf,
                              (*LEAVES, DType, Global))
            except CheckpointError as e:
                raise e.add_context(path=ckpt.path) from None

    def dtype(self, dtype: DType) -> Any:
        found = self.dtypes.get(dtype.name)
        if found is None:
            raise UnsupportedError(f"this torch has no dtype {dtype.name}")
        return found

    def storage(self, s: Any) -> Any:
        """The torch storage of ``s`` (bytes in this machine's order), restored to its
        location by the ``map_location`` rules, made once."""
        known = self.storages.get(id(s))
        if known is not None:
            return known[1]
        torch = self.torch
        unit = s.dtype.itemsize // 2 if s.dtype.name.startswith("complex") else s.dtype.itemsize
        raw = bytearray(s.native_buffer(unit)) if s.nbytes else bytearray()
        ust = (torch.frombuffer(raw, dtype=torch.uint8).untyped_storage() if raw
               else torch.UntypedStorage(0))
        ust = _restore(torch, ust, s.location, self.map_location)
        self.storages[id(s)] = (s, ust)  # the storage kept alive: ids stay unique
        return ust

    def leaf(self, t: Any) -> Any:
        """The torch value of ``t``, one per tensor: a tensor the file holds twice (the
        pickle's memo) is one object, as ``torch.load`` gives it."""
        known = self.leaves.get(id(t))
        if known is not None:
            return known[1]
        out = self._leaf(t)
        self.leaves[id(t)] = (t, out)  # the tensor kept alive: ids stay unique
        return out

    def _leaf(self, t: Any) -> Any:
        from torchless.model.kinds import TensorRecord
        from torchless.model.tensor import Tensor
        from torchless.pickle.values import Global
        from torchless.rules.policy import TORCH_CONSTANTS

        if isinstance(t, DType):  # a dtype saved as a value (a config's torch_dtype)
            return self.dtype(t)
        if isinstance(t, Global):  # layouts, memory formats, qschemes: torch's own objects
            return vars(self.torch).get(t.name, t) if t.module == "torch" and \
                t.name in TORCH_CONSTANTS else t
        if isinstance(t, TensorRecord):  # sparse, quantized, nested, meta: as torch.load
            return record_to_torch(t, self.torch)
        if not isinstance(t, Tensor):
            return t
        torch = self.torch
        dtype = self.dtype(t.dtype)
        ust = self.storage(t.storage)
        if t.is_storage:
            return torch.storage.TypedStorage(wrap_storage=ust, dtype=dtype, _internal=True)
        out = torch.empty(0, dtype=dtype, device=ust.device)
        out.set_(ust, t.storage_offset, t.shape, t.stride)
        return finish_tensor(torch, out, t)


def _restore(torch: Any, storage: Any, location: str, map_location: MapLocation) -> Any:
    """torch.serialization's restore-location rules for one storage saved at ``location``."""
    default: Callable[[Any, str], Any] = torch.serialization.default_restore_location
    if map_location is None:
        return default(storage, location)
    if isinstance(map_location, dict):
        return default(storage, map_location.get(location, location))
    if isinstance(map_location, (str, torch.device)):
        return default(storage, str(map_location))
    if callable(map_location):
        result = map_location(storage, location)
        return default(storage, location) if result is None else result
    raise TypeError(f"map_location must be None, a str, a torch.device, a dict or a "
                    f"callable, not {type(map_location).__name__}")


def _relocate(obj: Any, torch: Any, map_location: MapLocation) -> Any:
    """An inert file's tensors are CPU tensors; a map_location that keeps them there is
    accepted (a dict or callable is not consulted: the file records no saved location)."""
    if map_location is None or callable(map_location) or isinstance(map_location, dict) \
            or str(map_location) == "cpu":
        return obj
    raise UnsupportedError(f"map_location={map_location!r} for an inert file: its tensors "
                           "load on the CPU", hint="load with map_location='cpu' and move "
                                                   "the tensors with .to(device)")
