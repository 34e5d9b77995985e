"""What the legacy stream and the TAR layout share: their small header pickles and the table
of storages their persistent ids declare.

Both layouts are walked by one function each (:mod:`.legacy`, :mod:`.tar`), in strict mode
for the reader and report mode for the scanner; the walk reads each pickle through a
:data:`PickleReader`, which the reader runs with the rebuild rules (:func:`strict_reader`)
and the scanner with its own inert walk, which finds every global and refuses none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torchless.core.dtypes import StorageType
from torchless.core.limits import Limits
from torchless.errors import (
    CheckpointError,
    StorageError,
    TruncatedInputError,
    UnsafeGlobalError,
)
from torchless.io.source import Source
from torchless.model.tensor import Storage, storage_record
from torchless.pickle.machine import run_pickle
from torchless.pickle.values import Global
from torchless.rules.resolver import TorchResolver

__all__ = ["NAMES_A_CLASS", "PickleReader", "StorageTable", "small_pickle", "storage_type_of",
           "strict_reader"]

#: Reads the pickle at ``start`` that must end by ``end`` (None: anywhere before the end of
#: the file) and returns its value and the offset after its STOP; ``what`` names it in
#: messages; ``plain``: torch reads it with plain ``pickle.load``, where no storage name is
#: mapped (:mod:`torchless.rules.findclass`): each pass the walks read through it is one (the
#: object pickles are run by the reader and the scanner themselves). A scanner's reader
#: returns None where the stream cannot be followed (it has reported why).
PickleReader = Callable[[int, "int | None", str, bool], "tuple[Any, int] | None"]

#: The plain passes where torch writes a name: the TAR tensor record's tensor class
#: (torch.FloatTensor …), read inert. The others hold plain data and a storage type, and the
#: reader refuses any global outside the rebuild rules there.
NAMES_A_CLASS = frozenset({"tensor record"})


def small_pickle(source: Source, pos: int, what: str, limits: Limits,
                 end: int | None = None, *, strict: bool = True,
                 plain: bool = True) -> tuple[Any, int]:
    """A header pickle: plain data only (strict: no global outside the rules); ``plain``:
    torch reads it with plain ``pickle.load``."""
    try:
        value, after = run_pickle(source.raw, TorchResolver(limits, strict=strict, plain=plain),
                                  limits, start=pos)
    except UnsafeGlobalError as e:
        if strict and e.names:  # not the user's strict mode: header pickles hold plain data
            e.message = (f"{what} pickle: refused global {e.names[0]}: torch writes plain "
                         "data there, never a global")
            e.hint = "the file was built to attack whoever loads it: do not torch.load it"
        else:
            e.message = f"{what} pickle: {e.message}"
        e.args = (e.message,)
        raise
    if end is not None and after > end:
        raise TruncatedInputError(f"{what} pickle runs past the end of its member", offset=pos)
    return value, after


@dataclass
class _Root:
    storage: Storage
    numel: int


class StorageTable:
    """Storages declared by persistent ids, shared by the legacy and TAR layouts."""

    def __init__(self, source: Source, limits: Limits, byteorder: str) -> None:
        self.source = source
        self.limits = limits
        self.byteorder = byteorder
        self.roots: dict[str, _Root] = {}
        self.views: dict[str, Storage] = {}
        self.offsets: dict[str, int] = {}
        self.module_sources: dict[str, tuple[str, str]] = {}

    def _loader(self, key: str, nbytes: int) -> Any:
        offsets, source = self.offsets, self.source  # not self: no cycle through the table

        def load() -> memoryview:
            if key not in offsets:
                raise StorageError(f"storage {key!r} has no bytes in the file")
            return source.view(offsets[key], nbytes, f"storage {key}")
        return load

    def root(self, storage_type: Any, key: Any, location: Any, numel: Any) -> Storage:
        storage_type, key, location, numel = storage_record(storage_type, key, location, numel)
        dtype = storage_type.dtype
        known = self.roots.get(key)
        if known is not None and numel == known.numel == 0 and known.storage.dtype != dtype:
            # torch makes a new empty storage of this use's dtype (no bytes to share)
            return Storage(key, dtype, 0, lambda: b"", location=location,
                           byteorder=self.byteorder)
        if known is not None:
            if known.storage.dtype != dtype or known.numel != numel:
                raise StorageError(
                    f"storage {key!r} is declared as {known.storage.dtype!r} x {known.numel} "
                    f"and as {dtype!r} x {numel}")
            return known.storage
        nbytes = numel * dtype.itemsize
        if nbytes > self.source.size:
            raise TruncatedInputError(
                f"storage {key!r} declares {nbytes} bytes, more than the whole file "
                f"({self.source.size} bytes)")
        storage = Storage(key, dtype, nbytes, self._loader(key, nbytes), location=location,
                          byteorder=self.byteorder)
        self.roots[key] = _Root(storage, numel)
        return storage

    def view(self, root: Storage, view_key: Any, offset: Any, size: Any) -> Storage:
        if isinstance(view_key, int) and not isinstance(view_key, bool):
            view_key = str(view_key)
        if type(view_key) is not str or type(offset) is not int or type(size) is not int:
            raise StorageError("storage view metadata must be (key, offset, size)")
        itemsize = root.dtype.itemsize
        if offset < 0 or size < 0 or (offset + size) * itemsize > root.nbytes:
            raise StorageError(
                f"storage view {view_key!r} ({offset}+{size} elements) lies outside its "
                f"storage of {root.nbytes // itemsize}")
        known = self.views.get(view_key)
        if known is not None:
            if known.dtype != root.dtype or known.nbytes != size * itemsize:
                raise StorageError(f"storage view {view_key!r} is declared twice differently")
            return known
        start, nbytes = offset * itemsize, size * itemsize

        def load() -> memoryview | bytes:
            return root.buffer()[start:start + nbytes]

        storage = Storage(view_key, root.dtype, nbytes, load, location=root.location,
                          byteorder=root.byteorder)
        self.views[view_key] = storage
        return storage

    def module(self, pid: tuple[Any, ...]) -> Any:
        if len(pid) != 4:
            raise StorageError(f"module persistent id has {len(pid)} fields, expected 4")
        cls, source_file, source_text = pid[1], pid[2], pid[3]
        if isinstance(cls, Global) and isinstance(source_text, str):
            self.module_sources[cls.path] = (str(source_file), source_text)
        return cls


def strict_reader(source: Source, limits: Limits) -> PickleReader:
    """The reader's :data:`PickleReader`: :func:`small_pickle`, raising on any problem."""
    def read(pos: int, end: int | None, what: str, plain: bool) -> tuple[Any, int]:
        return small_pickle(source, pos, what, limits, end, strict=what not in NAMES_A_CLASS,
                            plain=plain)
    return read


def storage_type_of(value: Any, limits: Limits, *, plain: bool = False) -> StorageType | None:
    """A storage type as the reader's rules rebuild it, from the rebuilt value or from the
    inert name the scanner's walk leaves (the same rule decides); None if it is none.
    ``plain``: the value comes from a plain ``pickle.load`` pass."""
    if isinstance(value, StorageType):
        return value
    if isinstance(value, Global):
        resolver = TorchResolver(limits, plain=plain)
        resolver.proto = 3  # the name as the scanner's run mapped it: mapped no further
        try:
            found = resolver.find_global(value.module, value.name, value.offset)
        except CheckpointError:
            return None
        return found if isinstance(found, StorageType) else None
    return None
