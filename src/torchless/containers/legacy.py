"""The legacy stream layout (torch 0.1.10 - 1.5, and ``_use_new_zipfile_serialization=False``).

::

    pickle  magic number 0x1950a86a20f9469cfc6c (LONG1 bytes, or decimal text in protocols 0/1)
    pickle  protocol version 1001
    pickle  sys_info {"protocol_version", "little_endian", "type_sizes"}
    pickle  the object; persistent ids are
              ("storage", <Name>Storage, root_key, location, numel, view_metadata)
                  view_metadata None or (view_key, offset, size) for old storage views
              ("module", module_class, source_file, source)  for saved module classes
    pickle  the list of root storage keys, in the order their bytes follow
    per key int64 little-endian element count, then count x itemsize raw bytes

Offsets of the raw bytes are found by walking the counts (never reading the data);
every count must equal the element count the object pickle declared. Bytes after the last
storage are ignored, as torch ignores them (``info["trailing_bytes"]`` counts them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchless.core.limits import Limits
from torchless.errors import (
    ArchiveFormatError,
    NotACheckpointError,
    StorageError,
    TruncatedInputError,
    UnsafeGlobalError,
    UnsupportedError,
    type_phrase,
)
from torchless.io.detect import LEGACY_MAGIC
from torchless.io.source import Source
from torchless.model.graph import ModuleHook, module_state_dict
from torchless.model.tensor import Storage, storage_record
from torchless.pickle.machine import run_pickle
from torchless.pickle.values import Global
from torchless.rules.resolver import TorchResolver

__all__ = ["LegacyStream", "StorageTable", "small_pickle"]

PROTOCOL_VERSION = 1001


def small_pickle(source: Source, pos: int, what: str, limits: Limits,
                 end: int | None = None, *, strict: bool = True) -> tuple[Any, int]:
    """A header pickle: plain data only (strict: no global outside the rules)."""
    try:
        value, after = run_pickle(source.raw, TorchResolver(limits, strict=strict), limits,
                                  start=pos)
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
            raise StorageError(
                f"storage {key!r} declares {nbytes} bytes, more than the whole file")
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


class LegacyStream:
    """Reads one legacy-stream checkpoint."""

    format = "legacy"

    def __init__(self, source: Source, limits: Limits) -> None:
        self.source = source
        self.limits = limits
        pos = 0
        magic, pos = small_pickle(source, pos, "magic number", limits)
        if type(magic) is not int or magic != LEGACY_MAGIC:
            raise NotACheckpointError("legacy stream with a wrong magic number")
        proto, pos = small_pickle(source, pos, "protocol version", limits)
        if type(proto) is not int or proto != PROTOCOL_VERSION:
            raise UnsupportedError(f"legacy stream protocol version {proto!r} (expected 1001)",
                                   hint="torch has written protocol 1001 since 2017; another "
                                        "version means a damaged or hand-made file")
        sys_info, pos = small_pickle(source, pos, "sys_info", limits)
        if not isinstance(sys_info, dict):
            raise ArchiveFormatError("legacy sys_info is not a dict")
        little = sys_info.get("little_endian", True)
        if type(little) is not bool:
            raise ArchiveFormatError("legacy sys_info little_endian is not a bool")
        self.sys_info = sys_info
        self.byteorder = "little" if little else "big"
        self.storages = StorageTable(source, limits, self.byteorder)
        self._object_start = pos
        self.pickle_protocol: int | None = None
        self.trailing_bytes = 0

    def persistent_load(self, pid: Any, offset: int) -> Any:
        if not isinstance(pid, tuple) or not pid:
            raise StorageError(f"persistent id is {type_phrase(pid)}, not a tuple")
        tag = pid[0].decode("ascii", "replace") if isinstance(pid[0], bytes) else pid[0]
        if tag == "module":
            return self.storages.module(pid)
        if tag != "storage":
            raise StorageError(f"persistent id tag is {tag!r}, expected 'storage' or 'module'")
        if len(pid) != 6:
            raise StorageError(f"storage persistent id has {len(pid)} fields, expected 6")
        _, storage_type, key, location, numel, view = pid
        root = self.storages.root(storage_type, key, location, numel)
        if view is None:
            return root
        if not isinstance(view, tuple) or len(view) != 3:
            raise StorageError("storage view metadata is not a 3-tuple")
        return self.storages.view(root, *view)

    def describe(self, resolver: TorchResolver) -> dict[str, Any]:
        return {"byteorder": self.byteorder, "pickle_protocol": self.pickle_protocol,
                "trailing_bytes": self.trailing_bytes,
                "python2": resolver.python2_strings, "sys_info": dict(self.sys_info),
                "module_sources": dict(self.storages.module_sources)}

    def module_hook(self) -> ModuleHook:
        return module_state_dict

    def load(self, resolver: TorchResolver) -> Any:
        src, lim = self.source, self.limits
        if self.source.size > self._object_start + 1 and \
                src.raw[self._object_start] == 0x80:
            self.pickle_protocol = src.raw[self._object_start + 1]
        value, pos = run_pickle(src.raw, resolver, lim, start=self._object_start)
        keys, pos = small_pickle(src, pos, "storage keys", lim)
        if not isinstance(keys, list):
            raise ArchiveFormatError("legacy storage key list is not a list")
        seen: set[str] = set()
        roots = self.storages.roots
        for key in keys:
            if isinstance(key, int) and not isinstance(key, bool):
                key = str(key)
            if type(key) is not str or key not in roots:
                raise StorageError(f"storage key list names {key!r}, which nothing declared")
            if key in seen:
                raise StorageError(f"storage key {key!r} appears twice in the key list")
            seen.add(key)
            if pos + 8 > src.size:
                raise TruncatedInputError(f"storage {key!r}: element count cut short",
                                          offset=pos)
            count = int.from_bytes(src.view(pos, 8), "little", signed=True)
            root = roots[key]
            if count != root.numel and self.byteorder == "big":
                # a big-endian host's torch wrote the count in its own byte order
                count = int.from_bytes(src.view(pos, 8), "big", signed=True)
            if count != root.numel:
                raise StorageError(
                    f"storage {key!r}: the file holds {count} elements, the pickle declared "
                    f"{root.numel}", offset=pos)
            nbytes = root.storage.nbytes
            if pos + 8 + nbytes > src.size:
                raise TruncatedInputError(
                    f"storage {key!r}: expected {nbytes} bytes, got {src.size - pos - 8}",
                    offset=pos)
            self.storages.offsets[key] = pos + 8
            pos += 8 + nbytes
        missing = [k for k in roots if k not in seen]
        if missing:
            raise StorageError(f"storages {missing[:5]} are used but never stored in the file")
        # torch reads the first stream and ignores what follows (torch.save called twice on
        # one file object writes two); a ZIP archive there is refused earlier, as a polyglot
        self.trailing_bytes = src.size - pos
        return value
