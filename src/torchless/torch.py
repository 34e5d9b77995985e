"""A ``torch.load`` drop-in for programs that have torch: real torch tensors and Parameters,
read by torchless, so no pickle code ever runs.

``torchless.torch.load(f, map_location=None)`` takes what ``torch.load`` takes (a path or a
binary, seekable file object) and returns the object ``torch.load`` would, with storages
shared as torch shares them. It reads every format :func:`torchless.load` reads, torchless's
own safetensors and inert files too (whatever their name: Lightning opens a ``.ckpt`` that
``InertCheckpointIO`` wrote and passes the file object to ``torch.load``).

Memory is torch's: without ``mmap`` each storage is read once, straight from the file into
the tensor's own memory (no page of the file's map is touched, no copy in between), so the
peak is the tensors' bytes (as ``torch.load``), not twice them; with ``mmap=True`` (or
torch's ``torch.utils.serialization.config.load.mmap``) tensors view a private (or, with
``torch.serialization.set_default_mmap_options(MAP_SHARED)``, shared) map of the file made by
torch, as ``torch.load(mmap=True)`` gives them, and no page is read until a tensor is used.
A missing file is a ``FileNotFoundError`` (:class:`~torchless.errors.MissingFileError`), as
torch raises; a refused global or call (:class:`~torchless.errors.UnsafeGlobalError`) and a
malformed pickle (:class:`~torchless.errors.PickleError`) are also the
``pickle.UnpicklingError`` that ``torch.load(weights_only=True)`` raises for them, so code
written around ``torch.load`` catches them.

Unlike ``torch.load(weights_only=True)`` it reads the checkpoints that carry
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
from typing import IO, Any, TypeVar

from torchless.core.dtypes import DType
from torchless.core.limits import Limits
from torchless.errors import CheckpointError, PickleError, UnsafeGlobalError, UnsupportedError
from torchless.model.interop import finish_tensor, record_to_torch

__all__ = ["from_array", "load", "patched"]

MapLocation = Any  # None, str, torch.device, dict[str, str] or callable(storage, location)


def _import_torch(asked: str = "torchless.torch") -> Any:
    """torch, imported when a function of this module is called, or when torch objects are
    asked for (``asked``: ``framework='pt'``, ``to_torch()``); the one place in torchless
    that imports it (tests/project/test_static_safety.py allows it here only; any layer
    may call it, tests/project/test_layers.py)."""
    try:
        import torch  # noqa: TID251 - the drop-in returns torch objects; see the docstring
    except ImportError as e:
        raise UnsupportedError(f"{asked} needs torch, which cannot be imported here: {e}",
                               hint="install torch, or read NumPy arrays (framework='np', "
                                    "Tensor.numpy())") from None

    try:  # torch.load's own defaults (``mmap``), which ``import torch`` does not import
        import torch.utils.serialization.config  # noqa: TID251 - torch >= 2.5
    except ImportError:
        pass
    return torch


def load(f: str | os.PathLike[str] | IO[bytes], map_location: MapLocation = None,
         pickle_module: Any = None, *, weights_only: bool | None = None,
         mmap: bool | None = None, limits: Limits | None = None, strict: bool = False,
         allow_globals: tuple[str, ...] = (), verify_crc: bool = False,
         **pickle_load_args: Any) -> Any:
    """``torch.load`` without running pickle code.

    Args:
        f: a path, or a binary file object: the operating system's own file (``open(path,
            "rb")``, fsspec's local file) is mapped like its path; any other is read by
            ranges and must be seekable (``seek``, ``tell``, ``read``).
        map_location: as ``torch.load``: None (each storage where it was saved), a device
            string or ``torch.device``, a dict mapping saved locations to others, or a
            callable ``(storage, location)`` returning a storage or None. Each storage is
            restored once, by ``torch.serialization.default_restore_location``, so tensors
            that shared a storage still share it.
        pickle_module: must be None (torchless never unpickles).
        weights_only: accepted for compatibility and ignored: nothing in the file can run,
            whichever value is given; unknown classes come back as inert records instead
            of being refused.
        mmap: as ``torch.load``: True maps the file (``f`` must be a path) and tensors view
            the map; None takes torch's ``config.load.mmap``. A storage that is not plain
            bytes in the file (deflated, in the other byte order) is copied.
        limits: as for :func:`torchless.open`.
        strict: as for :func:`torchless.open`.
        allow_globals: as for :func:`torchless.open`.
        verify_crc: as for :func:`torchless.open`.
        pickle_load_args: ``encoding`` (``"latin1"`` / ``"bytes"`` for Python 2 files) is
            accepted; torchless decodes Python 2 strings its own way.

    Raises:
        MissingFileError: no file at the path (a ``FileNotFoundError``).
        UnsafeGlobalError: the file names a callable only an attack would use (and, in
            ``strict`` mode, any name outside the rebuild rules); also a
            ``pickle.UnpicklingError``, as ``torch.load(weights_only=True)`` raises.
        PickleError: a malformed pickle; also a ``pickle.UnpicklingError``.
        CheckpointError: anything else wrong with the file.
        ValueError: a ``pickle_module``, an unknown keyword, ``mmap`` with a file object.
    """
    if pickle_module is not None:
        raise ValueError("torchless.torch.load never unpickles: pickle_module must be None")
    unknown = set(pickle_load_args) - {"encoding"}
    if unknown:
        raise ValueError(f"unknown keyword(s) for load: {', '.join(sorted(unknown))}")
    del weights_only
    torch = _import_torch()
    from torchless.io.opening import is_file_object

    if mmap is None:  # torch's own default, where this torch has one (2.5 and later)
        mmap = hasattr(torch.utils, "serialization") and bool(
            torch.utils.serialization.config.load.mmap)
    if mmap and is_file_object(f):
        raise ValueError("f must be a file path in order to use the mmap argument")
    try:
        return _load(torch, f, map_location, bool(mmap), limits or Limits(), strict,
                     allow_globals, verify_crc)
    except (UnsafeGlobalError, PickleError) as e:
        e.__class__ = _unpickling_error(type(e), torch.serialization.pickle.UnpicklingError)
        raise


_E = TypeVar("_E", bound=CheckpointError)
#: (torchless error class, torch's UnpicklingError) -> the class that is both
_UNPICKLING: dict[tuple[type, type], type] = {}


def _unpickling_error(cls: type[_E], unpickling: type[Exception]) -> type[_E]:
    """``cls`` that is also ``unpickling`` (the ``pickle.UnpicklingError`` torch raises;
    torchless never imports pickle), made once per class: same name, same module. Pickled
    (to another process), it is ``cls`` again."""
    known = _UNPICKLING.get((cls, unpickling))
    if known is None:
        def __reduce__(self: CheckpointError) -> tuple[Any, ...]:
            rebuild, (_, args, state) = cls.__reduce__(self)
            return rebuild, (cls, args, state)

        known = _UNPICKLING[(cls, unpickling)] = type(cls.__name__, (cls, unpickling), {
            "__module__": cls.__module__, "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__, "__reduce__": __reduce__})
    return known


def _load(torch: Any, f: Any, map_location: MapLocation, mmap: bool, limits: Limits,
          strict: bool, allow_globals: tuple[str, ...], verify_crc: bool) -> Any:
    from torchless.errors import error_boundary
    from torchless.inert.store import load_safetensors
    from torchless.io.opening import open_source
    from torchless.io.source import Source
    from torchless.reader import checkpoint as _checkpoint
    from torchless.reader import formats

    target = f if not isinstance(f, os.PathLike) else os.fspath(f)
    local = isinstance(target, str) and os.path.isfile(target)
    source: Source | None = None
    if local or not isinstance(target, str):
        with error_boundary("loading", target if isinstance(target, str) else None):
            source = open_source(target)
            try:
                kind = formats.sniff(source)
            except BaseException:
                source.close()
                raise
            if kind != "safetensors":
                source.close()
                source = None
    if source is not None:  # a safetensors or inert file: its tree, our tensors
        loader = _Loader(torch, map_location, limits, source, target if mmap else None)
        with error_boundary("loading", source.path):
            obj = load_safetensors(source, tensors="torch", limits=limits,
                                   on_tensor=lambda t, _: loader.leaf(t))
        return obj
    ckpt = _checkpoint.open(f, limits=limits, strict=strict, allow_globals=allow_globals,
                            verify_crc=verify_crc)
    own = ckpt._source if isinstance(ckpt._source, Source) else None
    if mmap and (own is None or own.remote):
        ckpt.close()
        raise UnsupportedError("mmap=True maps one local file, and this checkpoint is not "
                               "one", path=ckpt.path, hint="load it without mmap")
    loader = _Loader(torch, map_location, limits, own, target if mmap else None)
    return loader.load(ckpt)


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

    def __init__(self, torch: Any, map_location: MapLocation, limits: Limits, source: Any,
                 mapped: str | None) -> None:
        """``source``: the file's local :class:`Source` (storages are read from it), or
        None; ``mapped``: the path to map (``mmap=True``)."""
        from torchless.model.interop import torch_dtypes

        self.torch = torch
        self.map_location = map_location
        self.limits = limits
        self.source = source
        self.overall: Any = None
        if mapped is not None and source is not None and source.size:
            import mmap as _mmap

            shared = torch.serialization.get_default_mmap_options() == _mmap.MAP_SHARED
            self.overall = torch.UntypedStorage.from_file(mapped, shared, source.size)
        self.dtypes = torch_dtypes(torch)
        self.storages: dict[int, Any] = {}
        self.leaves: dict[int, tuple[Any, Any]] = {}  # id -> (tensor, torch value), made once

    def load(self, ckpt: Any) -> Any:
        from torchless.model.graph import finish
        from torchless.model.walk import LEAVES
        from torchless.pickle.values import Global

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
        where = self.file_offset(s, unit)
        if not s.nbytes:
            ust = torch.UntypedStorage(0)
        elif where is not None and self.overall is not None:  # mmap=True: a view of the map
            ust = self.overall[where:where + s.nbytes]
        elif where is not None:  # read once, straight into the storage's own memory
            out = torch.empty(s.nbytes, dtype=torch.uint8)
            self.source.read_into(where, out.numpy())
            ust = out.untyped_storage()
        else:  # inflated or byte-swapped bytes, already in memory: copied once
            raw = bytearray(s.native_buffer(unit))
            ust = torch.frombuffer(raw, dtype=torch.uint8).untyped_storage()
        ust = _restore(torch, ust, s.location, self.map_location)
        self.storages[id(s)] = (s, ust)  # the storage kept alive: ids stay unique
        return ust

    def file_offset(self, s: Any, unit: int) -> int | None:
        """Where the bytes of ``s`` lie in the local file, when they are plain bytes there
        (stored, in this machine's order); None otherwise. Asking loads nothing: the
        storage's buffer is a view of the file's map, no page of it touched."""
        if self.source is None or self.source.remote or not s.nbytes \
                or (s.byteorder != "little" and unit > 1) or s.streams:
            return None
        buf = s.buffer()
        where: int | None = s.file_offset(self.source)
        if where is None and isinstance(buf, memoryview):
            where = self.source.offset_of(buf)
        return where

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
