"""The TAR layout torch wrote before 0.1.10, read without :mod:`tarfile`.

::

    sys_info   pickled dict
    storages   pickled count; per storage a pickled (key, location, storage_type), an int64
               element count and the raw bytes; then a pickled list of storage views
               (target_key, root_key, offset, numel)
    tensors    pickled count; per tensor a pickled (key, storage_key, tensor_type), int32 ndim,
               4 padding bytes, ndim int64 sizes, ndim int64 strides, int64 storage offset
    pickle     the object; its persistent ids are tensor or storage keys

The archive reader accepts regular members only (links are refused), checks
every header checksum and size against the file, and refuses duplicates and
path tricks. Nothing is ever extracted to disk.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from torchless.containers.legacy import StorageTable, small_pickle
from torchless.core.dtypes import StorageType
from torchless.core.limits import Limits
from torchless.errors import (
    AmbiguousArchiveError,
    ArchiveFormatError,
    LimitError,
    StorageError,
    TensorGeometryError,
    TruncatedInputError,
    UnsafePathError,
    type_phrase,
)
from torchless.io.source import Source
from torchless.model.graph import ModuleHook, module_state_dict
from torchless.model.tensor import Storage, Tensor, make_tensor
from torchless.pickle.machine import run_pickle
from torchless.rules.resolver import TorchResolver

__all__ = ["TarArchive", "TorchTar"]

_BLOCK = 512
_REGULAR = (b"0", b"\x00", b"7")
_MEMBERS = ("sys_info", "storages", "tensors", "pickle")


@dataclass
class _Member:
    name: str
    offset: int
    size: int


def _octal(field: bytes, what: str, offset: int) -> int:
    if field[:1] and field[0] & 0x80:
        if field[0] & 0x40:
            raise ArchiveFormatError(f"TAR header {what} field is negative", offset=offset)
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    text = field.split(b"\x00", 1)[0].strip(b" ")
    if not text:
        return 0
    if not all(0x30 <= c <= 0x37 for c in text):
        raise ArchiveFormatError(f"TAR header {what} field is not octal: {text[:12]!r}",
                                 offset=offset)
    return int(text, 8)


def _safe_name(name: str) -> str:
    if "\x00" in name or "\\" in name or name.startswith("/") or \
            any(p == ".." for p in name.split("/")):
        raise UnsafePathError(f"TAR member name {name[:80]!r} is not a plain relative path")
    return name


class TarArchive:
    """The regular members of a TAR file, validated."""

    def __init__(self, source: Source, limits: Limits) -> None:
        self.source = source
        self.members: dict[str, _Member] = {}
        pos = 0
        long_name: str | None = None
        pax_name: str | None = None
        while True:
            if pos + _BLOCK > source.size:
                raise TruncatedInputError("TAR archive ends without its end-of-archive blocks",
                                          offset=pos)
            header = source.read(pos, _BLOCK, "TAR header")
            if header == b"\x00" * _BLOCK:
                self._check_tail(pos + _BLOCK)
                break
            stored = _octal(header[148:156], "checksum", pos)
            actual = sum(header[:148]) + 8 * 32 + sum(header[156:])
            if stored != actual:
                raise ArchiveFormatError("TAR header checksum does not match", offset=pos)
            size = _octal(header[124:136], "size", pos)
            data = pos + _BLOCK
            if data + size > source.size:
                raise TruncatedInputError(
                    f"TAR member declares {size} bytes, the file has {source.size - data}",
                    offset=pos)
            kind = header[156:157]
            raw_name = header[:100].split(b"\x00", 1)[0]
            if header[257:262] == b"ustar" and header[345:346] != b"\x00":
                raw_name = header[345:500].split(b"\x00", 1)[0] + b"/" + raw_name
            try:
                name = raw_name.decode("utf-8")
            except UnicodeDecodeError:
                raise ArchiveFormatError("TAR member name is not UTF-8", offset=pos) from None
            if kind == b"L":
                long_name = source.read(data, size, "GNU long name").split(b"\x00", 1)[0] \
                    .decode("utf-8", "replace")
            elif kind in (b"x", b"g"):
                found = self._pax(source.read(data, size, "PAX header"), pos)
                if kind == b"x":
                    pax_name = found
            elif kind in (b"1", b"2"):
                raise UnsafePathError(f"TAR member {name!r} is a link")
            elif kind in _REGULAR or kind == b"5":
                if pax_name is not None:
                    name = pax_name
                elif long_name is not None:
                    name = long_name
                pax_name = long_name = None
                name = _safe_name(name)
                if kind != b"5":
                    if name in self.members:
                        raise AmbiguousArchiveError(f"duplicate TAR member {name!r}")
                    if len(self.members) >= limits.max_archive_entries:
                        raise LimitError("max_archive_entries", limits.max_archive_entries,
                                         len(self.members) + 1)
                    self.members[name] = _Member(name, data, size)
            else:
                raise ArchiveFormatError(f"TAR member {name!r} has unsupported type {kind!r}")
            pos = data + (size + _BLOCK - 1) // _BLOCK * _BLOCK

    def _check_tail(self, pos: int) -> None:
        """After the end-of-archive block only zero padding may follow."""
        chunk = 1 << 20
        while pos < self.source.size:
            n = min(chunk, self.source.size - pos)
            if self.source.read(pos, n, "TAR padding").count(0) != n:
                raise ArchiveFormatError("data after the end of the TAR archive", offset=pos)
            pos += n

    @staticmethod
    def _pax(body: bytes, pos: int) -> str | None:
        name = None
        i = 0
        while i < len(body):
            space = body.find(b" ", i, i + 20)
            if space < 0 or not body[i:space].isdigit():
                raise ArchiveFormatError("malformed PAX header record", offset=pos)
            length = int(body[i:space])
            if length <= space - i or i + length > len(body):
                raise ArchiveFormatError("PAX header record length out of range", offset=pos)
            record = body[space + 1:i + length - 1]
            key, _, value = record.partition(b"=")
            if key == b"path":
                name = value.decode("utf-8", "replace")
            i += length
        return name


class TorchTar:
    """Reads one pre-0.1.10 TAR checkpoint."""

    format = "tar"

    def __init__(self, source: Source, limits: Limits) -> None:
        self.source = source
        self.limits = limits
        self.archive = TarArchive(source, limits)
        missing = [m for m in _MEMBERS if m not in self.archive.members]
        if missing:
            raise ArchiveFormatError(f"TAR checkpoint lacks member(s) {missing}")
        m = self.archive.members["sys_info"]
        sys_info, _ = small_pickle(source, m.offset, "sys_info", limits, m.offset + m.size)
        if not isinstance(sys_info, dict):
            raise ArchiveFormatError("TAR sys_info is not a dict")
        little = sys_info.get("little_endian", True)
        self.byteorder = "little" if little is not False else "big"
        self.storages = StorageTable(source, limits, self.byteorder)
        self.objects: dict[str, Storage | Tensor] = {}
        self._read_storages()
        self._read_tensors()

    @staticmethod
    def _key(key: Any) -> str:
        if isinstance(key, bytes):
            key = key.decode("ascii", "replace")
        if isinstance(key, int) and not isinstance(key, bool):
            return str(key)
        if type(key) is not str:
            raise StorageError(f"TAR object key is {type_phrase(key)}")
        return key

    def _count(self, pos: int, end: int, what: str) -> tuple[int, int]:
        count, pos = small_pickle(self.source, pos, what, self.limits, end)
        if type(count) is not int or count < 0:
            raise ArchiveFormatError(f"TAR {what} is not a non-negative int")
        if count > self.limits.max_tensors:
            raise LimitError("max_tensors", self.limits.max_tensors, count, what)
        return count, pos

    def _read_storages(self) -> None:
        m = self.archive.members["storages"]
        end = m.offset + m.size
        count, pos = self._count(m.offset, end, "storage count")
        for _ in range(count):
            record, pos = small_pickle(self.source, pos, "storage record", self.limits, end)
            if not isinstance(record, tuple) or len(record) != 3:
                raise StorageError("TAR storage record is not (key, location, storage_type)")
            key, location, storage_type = record
            key = self._key(key)
            if key in self.objects:
                raise StorageError(f"TAR storage {key!r} appears twice")
            if not isinstance(storage_type, StorageType):
                raise StorageError("TAR storage record has no storage type")
            if pos + 8 > end:
                raise TruncatedInputError("TAR storage element count cut short", offset=pos)
            numel = int.from_bytes(self.source.view(pos, 8), "little", signed=True)
            if numel < 0:
                raise StorageError(f"TAR storage {key!r} has a negative element count")
            nbytes = numel * storage_type.dtype.itemsize
            if pos + 8 + nbytes > end:
                raise TruncatedInputError(f"TAR storage {key!r} bytes cut short", offset=pos)
            storage = self.storages.root(storage_type, key, location, numel)
            self.storages.offsets[key] = pos + 8
            self.objects[key] = storage
            pos += 8 + nbytes
        views, pos = small_pickle(self.source, pos, "storage views", self.limits, end)
        if not isinstance(views, list):
            raise StorageError("TAR storage view list is not a list")
        for view in views:
            if not isinstance(view, tuple) or len(view) != 4:
                raise StorageError("TAR storage view is not (target, root, offset, numel)")
            target, root_key, offset, numel = view
            root = self.objects.get(self._key(root_key))
            if not isinstance(root, Storage):
                raise StorageError(f"TAR storage view refers to unknown storage {root_key!r}")
            self.objects[self._key(target)] = self.storages.view(root, self._key(target),
                                                                 offset, numel)

    def _read_tensors(self) -> None:
        m = self.archive.members["tensors"]
        end = m.offset + m.size
        count, pos = self._count(m.offset, end, "tensor count")
        src = self.source
        for _ in range(count):
            # the record names the tensor class (torch.FloatTensor …): a class, kept inert
            record, pos = small_pickle(src, pos, "tensor record", self.limits, end,
                                       strict=False)
            if not isinstance(record, tuple) or len(record) != 3:
                raise StorageError("TAR tensor record is not (key, storage_key, tensor_type)")
            key, storage_key = self._key(record[0]), self._key(record[1])
            storage = self.objects.get(storage_key)
            if not isinstance(storage, Storage):
                raise StorageError(f"TAR tensor {key!r} uses unknown storage {storage_key!r}")
            if pos + 8 > end:
                raise TruncatedInputError("TAR tensor header cut short", offset=pos)
            (ndim,) = struct.unpack("<i", src.view(pos, 4))
            if ndim < 0 or ndim > self.limits.max_ndim:
                raise TensorGeometryError(f"TAR tensor {key!r} declares {ndim} dimensions")
            pos += 8
            need = 16 * ndim + 8
            if pos + need > end:
                raise TruncatedInputError("TAR tensor geometry cut short", offset=pos)
            values = struct.unpack(f"<{2 * ndim + 1}q", src.view(pos, need))
            pos += need
            self.objects[key] = make_tensor(storage, values[-1], values[:ndim],
                                            values[ndim:2 * ndim], storage.dtype, self.limits)

    def persistent_load(self, pid: Any, offset: int) -> Any:
        if isinstance(pid, tuple):  # a module class record: (class, source_file, source)
            return self.storages.module(pid if pid[:1] == ("module",) else ("module", *pid))
        key = self._key(pid)
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
        if pos > m.offset + m.size:
            raise TruncatedInputError("TAR pickle runs past the end of its member")
        if pos != m.offset + m.size:
            raise ArchiveFormatError("bytes after the pickle in the TAR 'pickle' member")
        return value
