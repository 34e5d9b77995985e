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

The reader (:class:`LegacyStream`) and the scanner (:func:`legacy_regions`) walk the stream
with the same functions (:func:`read_header`, :func:`walk_storages`), strict and in report mode.
"""


from __future__ import annotations

from typing import Any

from torchless.containers.regions import RegionSink, sink_reader
from torchless.containers.storages import (
    PickleReader,
    StorageTable,
    storage_type_of,
    strict_reader,
)
from torchless.core.findings import Findings
from torchless.core.limits import Limits
from torchless.errors import (
    ArchiveFormatError,
    CheckpointError,
    NotACheckpointError,
    StorageError,
    TruncatedInputError,
    UnsupportedError,
    type_phrase,
)
from torchless.io.detect import LEGACY_MAGIC
from torchless.io.source import Source
from torchless.model.graph import ModuleHook, module_state_dict
from torchless.pickle.machine import run_pickle
from torchless.rules.resolver import TorchResolver

__all__ = ["LegacyStream", "declared_storages", "legacy_regions", "persistent", "read_header",
           "walk_storages"]

PROTOCOL_VERSION = 1001


def read_header(read: PickleReader, f: Findings) -> tuple[dict[Any, Any], str, int] | None:
    """The magic number, protocol version and sys_info pickles: (sys_info, byte order,
    offset of the object pickle), or None where report mode cannot follow them."""
    got = read(0, None, "magic number", True)
    if got is None:
        return None
    magic, pos = got
    if type(magic) is not int or magic != LEGACY_MAGIC:
        f("legacy", NotACheckpointError("legacy stream with a wrong magic number"), offset=0,
          report="the magic number is not the literal torch writes")
    start = pos
    got = read(pos, None, "protocol version", True)
    if got is None:
        return None
    proto, pos = got
    if type(proto) is not int or proto != PROTOCOL_VERSION:
        f("legacy", UnsupportedError(f"legacy stream protocol version {proto!r} (expected 1001)",
                                     hint="torch has written protocol 1001 since 2017; another "
                                          "version means a damaged or hand-made file"),
          offset=start, report=f"protocol version {proto!r} is not 1001")
    start = pos
    got = read(pos, None, "sys_info", True)
    if got is None:
        return None
    sys_info, pos = got
    if not isinstance(sys_info, dict):
        f("legacy", ArchiveFormatError("legacy sys_info is not a dict"), offset=start)
        sys_info = {}
    little = sys_info.get("little_endian", True)
    if type(little) is not bool:
        f("legacy", ArchiveFormatError("legacy sys_info little_endian is not a bool"),
          offset=start)
        little = True
    return sys_info, "little" if little else "big", pos


def walk_storages(source: Source, pos: int, keys: Any, declared: dict[Any, tuple[int, int]],
                  byteorder: str, f: Findings) -> tuple[dict[Any, int], int] | None:
    """Follow the raw storages after the key list pickle, whose value is ``keys``:
    ``declared`` maps each root storage key to (element count, bytes). Returns where each
    storage's bytes start and where the last one ends, or None where report mode cannot
    follow them. Only the counts are read, never the data."""
    if not isinstance(keys, list):
        f("legacy", ArchiveFormatError("legacy storage key list is not a list"), offset=pos)
        return None
    offsets: dict[Any, int] = {}
    for key in keys:
        if isinstance(key, int) and not isinstance(key, bool):
            key = str(key)
        if not isinstance(key, (str, bytes)) or key not in declared:
            f("legacy", StorageError(f"storage key list names {key!r}, which nothing declared"),
              offset=pos, report=f"storage {key!r} cannot be followed (undeclared); the rest "
                                 "of the file is not accounted for")
            return None
        if key in offsets:
            f("legacy", StorageError(f"storage key {key!r} appears twice in the key list"),
              offset=pos)
        if pos + 8 > source.size:
            f("legacy", TruncatedInputError(f"storage {key!r}: element count cut short",
                                            offset=pos))
            return None
        numel, nbytes = declared[key]
        count = int.from_bytes(source.view(pos, 8), "little", signed=True)
        if count != numel and byteorder == "big":
            # a big-endian host's torch wrote the count in its own byte order
            count = int.from_bytes(source.view(pos, 8), "big", signed=True)
        if count != numel:
            f("legacy", StorageError(f"storage {key!r}: the file holds {count} elements, the "
                                     f"pickle declared {numel}", offset=pos))
            return None
        if pos + 8 + nbytes > source.size:
            f("legacy", TruncatedInputError(
                f"storage {key!r}: expected {nbytes} bytes, got {source.size - pos - 8}",
                offset=pos))
            return None
        offsets[key] = pos + 8
        pos += 8 + nbytes
    missing = [k for k in declared if k not in offsets]
    if missing:
        f("legacy", StorageError(f"storages {missing[:5]} are used but never stored in the "
                                 "file"))
    return offsets, pos


def persistent(table: StorageTable, pid: Any) -> Any:
    """What a legacy persistent id stands for: a root storage, a view of one, or a module
    class saved whole (its source kept as metadata)."""
    if not isinstance(pid, tuple) or not pid:
        raise StorageError(f"persistent id is {type_phrase(pid)}, not a tuple")
    tag = pid[0].decode("ascii", "replace") if isinstance(pid[0], bytes) else pid[0]
    if tag == "module":
        return table.module(pid)
    if tag != "storage":
        raise StorageError(f"persistent id tag is {tag!r}, expected 'storage' or 'module'")
    if len(pid) != 6:
        raise StorageError(f"storage persistent id has {len(pid)} fields, expected 6")
    _, storage_type, key, location, numel, view = pid
    root = table.root(storage_type, key, location, numel)
    if view is None:
        return root
    if not isinstance(view, tuple) or len(view) != 3:
        raise StorageError("storage view metadata is not a 3-tuple")
    return table.view(root, *view)


def declared_storages(pids: list[Any], source: Source, limits: Limits, byteorder: str,
                      f: Findings) -> dict[Any, tuple[int, int]]:
    """Report mode: the root storages that the persistent ids met by an inert run of the
    object pickle declare, as the reader's :func:`persistent` reads them: key -> (element
    count, bytes). What the reader refuses is reported; a bytes key, which the reader
    refuses and torch.load matches byte for byte, is kept so the storages can be followed."""
    table = StorageTable(source, limits, byteorder)
    out: dict[Any, tuple[int, int]] = {}
    for pid in pids:
        if isinstance(pid, tuple) and len(pid) > 1:
            pid = (pid[0], storage_type_of(pid[1], limits) or pid[1], *pid[2:])
        try:
            persistent(table, pid)
        except CheckpointError as e:
            key = pid[2] if isinstance(pid, tuple) and len(pid) == 6 else None
            if not isinstance(key, bytes):
                f("legacy", e)
                continue
            if key not in out:
                f("legacy", e, report=f"storage key {key!r} is bytes, not str: torch.save "
                  "never writes one; torch.load matches it byte for byte, the torchless "
                  "reader refuses the file")
            storage_type, numel = storage_type_of(pid[1], limits), pid[4]
            if storage_type is not None and type(numel) is int and numel >= 0:
                out.setdefault(key, (numel, numel * storage_type.dtype.itemsize))
    out.update({k: (r.numel, r.storage.nbytes) for k, r in table.roots.items()})
    return out


class LegacyStream:
    """Reads one legacy-stream checkpoint."""

    format = "legacy"

    def __init__(self, source: Source, limits: Limits) -> None:
        self.source = source
        self.limits = limits
        self.findings = Findings("strict")
        self._read = strict_reader(source, limits)
        header = read_header(self._read, self.findings)
        assert header is not None  # strict mode raises instead
        self.sys_info, self.byteorder, self._object_start = header
        self.storages = StorageTable(source, limits, self.byteorder)
        self.pickle_protocol: int | None = None
        self.trailing_bytes = 0

    def persistent_load(self, pid: Any, offset: int) -> Any:
        return persistent(self.storages, pid)

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
        got = self._read(pos, None, "storage keys", True)
        assert got is not None
        keys, pos = got
        declared = {k: (r.numel, r.storage.nbytes) for k, r in self.storages.roots.items()}
        walked = walk_storages(src, pos, keys, declared, self.byteorder, self.findings)
        assert walked is not None
        offsets, pos = walked
        self.storages.offsets.update(offsets)
        # torch reads the first stream and ignores what follows (torch.save called twice on
        # one file object writes two); a ZIP archive there is refused earlier, as a polyglot
        self.trailing_bytes = src.size - pos
        return value


def legacy_regions(source: Source, limits: Limits, sink: RegionSink) -> str:
    """The stream's regions, walked by the reader's own functions in report mode: its five
    pickles (the three header pickles and the storage keys read as plain data), and any
    pickle after its last storage."""
    buf, size = source.raw, source.size
    read = sink_reader(sink, buf, size, None, "legacy")
    header = read_header(read, sink.findings)
    if header is None:
        return "legacy"
    _, byteorder, pos = header
    obj = sink.pickle(buf, pos, size, None, "legacy object", want_value=True, pids="legacy")
    if obj is None or not obj.stopped:
        return "legacy"
    got = read(obj.end, None, "storage keys", True)
    if got is None:
        return "legacy"
    keys, pos = got
    declared = declared_storages(obj.pids, source, limits, byteorder, sink.findings)
    walked = walk_storages(source, pos, keys, declared, byteorder, sink.findings)
    if walked is not None and walked[1] < size:
        end = walked[1]
        sink.flag("trailing", f"{size - end} bytes after the last storage", None, end)
        sink.chain(buf, end, size, None, "trailing", tentative=True)
    return "legacy"
