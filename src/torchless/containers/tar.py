"""The TAR layout torch wrote before 0.1.10, read without :mod:`tarfile`.

::

    sys_info   pickled dict
    storages   pickled count; per storage a pickled (key, location, storage_type), an int64
               element count and the raw bytes; then a pickled list of storage views
               (target_key, root_key, offset, numel)
    tensors    pickled count; per tensor a pickled (key, storage_key, tensor_type), int32 ndim,
               4 padding bytes, ndim int64 sizes, ndim int64 strides, int64 storage offset
    pickle     the object; its persistent ids are tensor or storage keys

The members come from :class:`~.tararchive.TarArchive`. The reader (:class:`TorchTar`) and
the scanner (:func:`tar_regions`) walk them with the same functions (:func:`read_sys_info`,
:func:`walk_storages`, :func:`walk_tensors`, :func:`check_object_end`), strict and in report
mode; the reader builds its storages and tensors from what the walk hands it. Nothing is
ever extracted.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from torchless.containers.base import archive_of_files
from torchless.containers.regions import RegionSink, absorb, sink_reader
from torchless.containers.storages import (
    PickleReader,
    StorageTable,
    storage_type_of,
    strict_reader,
)
from torchless.containers.tararchive import TarArchive, TarMember
from torchless.core.dtypes import StorageType
from torchless.core.findings import Findings
from torchless.core.limits import Limits
from torchless.errors import (
    ArchiveFormatError,
    LimitError,
    NotACheckpointError,
    StorageError,
    TensorGeometryError,
    TruncatedInputError,
    type_phrase,
)
from torchless.io.source import Source
from torchless.model.graph import ModuleHook, module_state_dict
from torchless.model.tensor import Storage, Tensor, make_tensor
from torchless.pickle.machine import run_pickle
from torchless.rules.resolver import TorchResolver

__all__ = ["MEMBERS", "TorchTar", "check_object_end", "not_a_torch_tar", "read_sys_info",
           "tar_regions", "walk_storages", "walk_tensors"]

#: The members a TAR checkpoint has.
MEMBERS = ("sys_info", "storages", "tensors", "pickle")

#: A root storage met by :func:`walk_storages`: key, location, storage type, element count,
#: offset of its bytes.
OnStorage = Callable[[str, Any, StorageType, int, int], None]
#: A tensor met by :func:`walk_tensors`: key, storage key, sizes, strides, storage offset.
OnTensor = Callable[[str, str, tuple[int, ...], tuple[int, ...], int], None]


def object_key(key: Any, f: Findings) -> str:
    """A storage or tensor key as torch's TAR loader compares them: text."""
    if isinstance(key, bytes):
        key = key.decode("ascii", "replace")
    if isinstance(key, int) and not isinstance(key, bool):
        return str(key)
    if type(key) is not str:
        f("tar", StorageError(f"TAR object key is {type_phrase(key)}"))
        return repr(key)
    return key


def read_sys_info(member: TarMember, read: PickleReader, f: Findings) -> str:
    """The byte order the ``sys_info`` member declares (torch 2.13 never unpickles this
    member; it is scanned as a plain ``pickle.load`` pass would read it)."""
    got = read(member.offset, member.offset + member.size, "sys_info", True)
    sys_info = got[0] if got is not None else {}
    if not isinstance(sys_info, dict):
        f("tar", ArchiveFormatError("TAR sys_info is not a dict"), "sys_info")
        sys_info = {}
    return "little" if sys_info.get("little_endian", True) is not False else "big"


def _count(read: PickleReader, pos: int, end: int, what: str, member: str, limits: Limits,
           f: Findings) -> tuple[int, int] | None:
    got = read(pos, end, what, True)
    if got is None:
        return None
    count, pos = got
    if type(count) is not int or count < 0:
        f("tar", ArchiveFormatError(f"TAR {what} is not a non-negative int"), member, pos)
        return None
    if count > limits.max_tensors:
        f("limit", LimitError("max_tensors", limits.max_tensors, count, what), member)
        count = limits.max_tensors
    return count, pos


def walk_storages(source: Source, member: TarMember, read: PickleReader, limits: Limits,
                  f: Findings, on_storage: OnStorage | None = None) -> Any:
    """Follow the ``storages`` member: each record pickle, its element count and bytes
    (handed to ``on_storage``); returns the value of the storage view list that ends it
    (None where report mode cannot follow the member)."""
    end = member.offset + member.size
    head = _count(read, member.offset, end, "storage count", "storages", limits, f)
    if head is None:
        return None
    count, pos = head
    seen: set[str] = set()
    for _ in range(count):
        got = read(pos, end, "storage record", True)
        if got is None:
            return None
        record, pos = got
        if not isinstance(record, tuple) or len(record) != 3:
            f("tar", StorageError("TAR storage record is not (key, location, storage_type)"),
              "storages", pos)
            return None
        key = object_key(record[0], f)
        if key in seen:
            f("tar", StorageError(f"TAR storage {key!r} appears twice"), "storages", pos)
        seen.add(key)
        storage_type = storage_type_of(record[2], limits, plain=True)
        if storage_type is None:
            f("tar", StorageError("TAR storage record has no storage type"), "storages", pos)
            return None
        if pos + 8 > end:
            f("tar", TruncatedInputError("TAR storage element count cut short", offset=pos),
              "storages")
            return None
        numel = int.from_bytes(source.view(pos, 8), "little", signed=True)
        if numel < 0:
            f("tar", StorageError(f"TAR storage {key!r} has a negative element count"),
              "storages", pos)
            return None
        if pos + 8 + numel * storage_type.dtype.itemsize > end:
            f("tar", TruncatedInputError(f"TAR storage {key!r} bytes cut short", offset=pos),
              "storages")
            return None
        if on_storage is not None:
            on_storage(key, record[1], storage_type, numel, pos + 8)
        pos += 8 + numel * storage_type.dtype.itemsize
    if pos == end and not f.strict:
        # some writers leave the view list out: torch fails on the file (EOFError) and so
        # does the reader, and no reader sees other content, so no anomaly
        return []
    got = read(pos, end, "storage views", True)
    return None if got is None else got[0]


def walk_tensors(source: Source, member: TarMember, read: PickleReader, limits: Limits,
                 f: Findings, on_tensor: OnTensor | None = None) -> None:
    """Follow the ``tensors`` member: each record pickle and the geometry after it (handed
    to ``on_tensor``). The record names the tensor class (torch.FloatTensor …): a class,
    read inert."""
    end = member.offset + member.size
    head = _count(read, member.offset, end, "tensor count", "tensors", limits, f)
    if head is None:
        return
    count, pos = head
    for _ in range(count):
        got = read(pos, end, "tensor record", True)
        if got is None:
            return
        record, pos = got
        if not isinstance(record, tuple) or len(record) != 3:
            f("tar", StorageError("TAR tensor record is not (key, storage_key, tensor_type)"),
              "tensors", pos)
            return
        key, storage_key = object_key(record[0], f), object_key(record[1], f)
        if pos + 8 > end:
            f("tar", TruncatedInputError("TAR tensor header cut short", offset=pos), "tensors")
            return
        (ndim,) = struct.unpack("<i", source.view(pos, 4))
        if ndim < 0 or ndim > limits.max_ndim:
            f("tar", TensorGeometryError(f"TAR tensor {key!r} declares {ndim} dimensions"),
              "tensors", pos)
            return
        pos += 8
        need = 16 * ndim + 8
        if pos + need > end:
            f("tar", TruncatedInputError("TAR tensor geometry cut short", offset=pos),
              "tensors")
            return
        values = struct.unpack(f"<{2 * ndim + 1}q", source.view(pos, need))
        pos += need
        if on_tensor is not None:
            on_tensor(key, storage_key, values[:ndim], values[ndim:2 * ndim], values[-1])


def check_object_end(after: int, member: TarMember, f: Findings) -> None:
    """The object pickle must end exactly at the end of its member."""
    end = member.offset + member.size
    if after > end:
        f("tar", TruncatedInputError("TAR pickle runs past the end of its member"), "pickle")
    elif after != end:
        f("trailing", ArchiveFormatError("bytes after the pickle in the TAR 'pickle' member"),
          "pickle", after, report=f"{end - after} bytes after the pickle in the TAR 'pickle' "
                                  "member")


def not_a_torch_tar(names: list[str]) -> NotACheckpointError:
    """What a TAR archive without any of torch's members is: another kind of TAR file (a
    folder packed with tar is a common one), never a damaged checkpoint."""
    packed = archive_of_files("TAR archive", names)
    if packed is not None:
        return packed
    shown = ", ".join(repr(n) for n in names[:3]) + (" …" if len(names) > 3 else "")
    return NotACheckpointError(
        f"not a torch checkpoint (a TAR archive with {len(names)} files"
        + (f": {shown}" if names else "") + f"; none of {', '.join(MEMBERS)})",
        hint="torch's TAR checkpoints (before 0.1.10) hold sys_info, storages, tensors and "
             "pickle; if this archive packs checkpoint files, extract it and open those")


class TorchTar:
    """Reads one pre-0.1.10 TAR checkpoint."""

    format = "tar"

    def __init__(self, source: Source, limits: Limits) -> None:
        self.source = source
        self.limits = limits
        self.archive = TarArchive(source, limits)
        self.findings = self.archive.findings
        missing = [m for m in MEMBERS if m not in self.archive.members]
        if len(missing) == len(MEMBERS):
            raise not_a_torch_tar(list(self.archive.members))
        if missing:
            raise ArchiveFormatError(f"TAR checkpoint lacks member(s) {missing}")
        members = self.archive.members
        read = strict_reader(source, limits)
        self.byteorder = read_sys_info(members["sys_info"], read, self.findings)
        self.storages = StorageTable(source, limits, self.byteorder)
        self.objects: dict[str, Storage | Tensor] = {}
        views = walk_storages(source, members["storages"], read, limits, self.findings,
                              self._storage)
        self._views(views)
        walk_tensors(source, members["tensors"], read, limits, self.findings, self._tensor)

    def _storage(self, key: str, location: Any, storage_type: StorageType, numel: int,
                 offset: int) -> None:
        self.objects[key] = self.storages.root(storage_type, key, location, numel)
        self.storages.offsets[key] = offset

    def _views(self, views: Any) -> None:
        if not isinstance(views, list):
            raise StorageError("TAR storage view list is not a list")
        for view in views:
            if not isinstance(view, tuple) or len(view) != 4:
                raise StorageError("TAR storage view is not (target, root, offset, numel)")
            target, root_key, offset, numel = view
            root = self.objects.get(object_key(root_key, self.findings))
            if not isinstance(root, Storage):
                raise StorageError(f"TAR storage view refers to unknown storage {root_key!r}")
            key = object_key(target, self.findings)
            self.objects[key] = self.storages.view(root, key, offset, numel)

    def _tensor(self, key: str, storage_key: str, sizes: tuple[int, ...],
                strides: tuple[int, ...], offset: int) -> None:
        storage = self.objects.get(storage_key)
        if not isinstance(storage, Storage):
            raise StorageError(f"TAR tensor {key!r} uses unknown storage {storage_key!r}")
        self.objects[key] = make_tensor(storage, offset, sizes, strides, storage.dtype,
                                        self.limits)

    def persistent_load(self, pid: Any, offset: int) -> Any:
        if isinstance(pid, tuple):  # a module class record: (class, source_file, source)
            return self.storages.module(pid if pid[:1] == ("module",) else ("module", *pid))
        key = object_key(pid, self.findings)
        obj = self.objects.get(key)
        if obj is None:
            raise StorageError(f"the pickle references unknown TAR object {key!r}")
        return obj

    def describe(self, resolver: TorchResolver) -> dict[str, Any]:
        return {"byteorder": self.byteorder, "python2": resolver.python2_strings,
                "module_sources": dict(self.storages.module_sources)}

    def module_hook(self) -> ModuleHook:
        return module_state_dict

    def load(self, resolver: TorchResolver) -> Any:
        m = self.archive.members["pickle"]
        value, pos = run_pickle(self.source.raw, resolver, self.limits, start=m.offset)
        check_object_end(pos, m, self.findings)
        return value


def tar_regions(source: Source, limits: Limits, sink: RegionSink) -> str:
    """The archive's regions, walked by the reader's own functions in report mode: each of
    torch's members (the ``sys_info``, ``storages`` and ``tensors`` passes read as plain
    data), and every other member and duplicate as bytes that may hold a pickle."""
    buf, size = source.raw, source.size
    archive = TarArchive(source, limits, mode="report")
    absorb(sink, archive.findings)

    def unowned(lo: int, hi: int) -> None:
        sink.chain(buf, lo, hi, None, "unowned", tentative=True)

    if not sink.found_any() and not any(m in archive.members for m in MEMBERS) and \
            not archive.duplicates:
        members = list(archive.members)
        for m in archive.members.values():  # a pickle among its files is still scanned
            unowned(m.offset, m.offset + m.size)
        if not sink.found_any():
            raise not_a_torch_tar(members)
        return "tar"
    f = sink.findings
    for dup in archive.duplicates:
        unowned(dup.offset, dup.offset + dup.size)
    for name, m in archive.members.items():
        read = sink_reader(sink, buf, size, name, "TAR")
        if name == "pickle":
            end = m.offset + m.size
            result = sink.pickle(buf, m.offset, end, name, "TAR object", pids="tar")
            if result is not None and result.stopped:
                check_object_end(result.end, m, f)
                if result.end < end:
                    unowned(result.end, end)
        elif name == "sys_info":
            read_sys_info(m, read, f)
        elif name == "storages":
            walk_storages(source, m, read, limits, f)
        elif name == "tensors":
            walk_tensors(source, m, read, limits, f)
        else:
            unowned(m.offset, m.offset + m.size)
    return "tar"
