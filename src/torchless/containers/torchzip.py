"""The torch ZIP layout (``torch.save`` since 1.6, and ``torch.jit.save``).

::

    <prefix>/data.pkl            the object pickle; storages are persistent ids
                                 ("storage", <Name>Storage | UntypedStorage, key, location, numel)
    <prefix>/data/<key>          raw bytes of each storage (numel x itemsize)
    <prefix>/version             format version (also <prefix>/.data/version)
    <prefix>/byteorder           "little" or "big" (missing = little)
    <prefix>/constants.pkl       TorchScript only, with code/ (class definitions as text)

Every member lives under one prefix, taken from the first entry as torch does.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

from torchless.containers.base import archive_of_files
from torchless.containers.ziparchive import ZipArchive
from torchless.containers.zipformat import STORED
from torchless.core.dtypes import DType, StorageType
from torchless.core.limits import Limits
from torchless.errors import (
    AmbiguousArchiveError,
    ArchiveFormatError,
    CheckpointError,
    LimitError,
    NotACheckpointError,
    PickleError,
    StorageError,
    UnsafePathError,
    UnsupportedError,
    type_phrase,
)
from torchless.io.source import Source
from torchless.model.graph import ModuleDict, ModuleHook, module_state_dict
from torchless.model.tensor import Storage, storage_record
from torchless.pickle.machine import run_pickle
from torchless.pickle.values import Global, Opaque
from torchless.rules.resolver import TorchResolver

__all__ = ["MemberStorage", "TorchZip", "archive_prefix", "not_a_torch_zip"]

#: Highest ``version`` record torch 2.x writes is single-digit; anything far beyond
#: is a file from the future or a lie.
MAX_FORMAT_VERSION = 64
_KEY = re.compile(r"[A-Za-z0-9_]+\Z")
_CLASS = re.compile(r"^class (\w+)\((\w+(?:\.\w+)*)\):", re.M)
_LIST = re.compile(r"^  (__parameters__|__buffers__) = \[(.*?)\]", re.M)


class MemberStorage(Storage):
    """A storage whose bytes are an archive member: it reads them itself (:meth:`_load`)
    and, where they are compressed or remote, streams them (``_stream``). One object per
    storage, no loader beside it (opening a file of many small tensors made a loader
    object, and before that two closures, per tensor)."""

    __slots__ = ("archive", "check", "member")

    def __init__(self, archive: ZipArchive, member: str, key: str, dtype: DType, nbytes: int,
                 location: str, byteorder: str, check: bool) -> None:
        # the stream is not a bound method of self: a storage that holds itself is a cycle
        super().__init__(key, dtype, nbytes, None, location=location, byteorder=byteorder,
                         stream=functools.partial(archive.iter_member, member, check_crc=check)
                         if archive.source.remote or archive.is_deflated(member) else None)
        self.archive = archive
        self.member = member
        self.check = check

    def _load(self) -> memoryview | bytes:
        return self.archive.data(self.member, check_crc=self.check)

    def _offset_in(self, source: object) -> int | None:
        """Where the member's stored bytes lie in ``source``'s file (None when the archive
        is not on that local source, or the member is deflated or not located)."""
        archive = self.archive
        e = archive.entries.get(self.member)
        if archive.source is not source or archive.source.remote or e is None or not e.located \
                or e.method != STORED:
            return None
        return e.data_offset


@dataclass
class _ScriptClass:
    is_module: bool
    parameters: list[str] = field(default_factory=list)
    buffers: list[str] = field(default_factory=list)


def not_a_torch_zip(names: list[str]) -> NotACheckpointError:
    """What a ZIP archive without any ``data.pkl`` is: a zipped folder of checkpoint files
    (to unzip), or some other ZIP archive; never a damaged checkpoint."""
    files = [n for n in names if not n.endswith("/")]
    packed = archive_of_files("ZIP", files)
    if packed is not None:
        return packed
    shown = ", ".join(repr(n) for n in files[:3]) + (" …" if len(files) > 3 else "")
    return NotACheckpointError(
        f"not a torch checkpoint (a ZIP with {len(files)} files: {shown}; no data.pkl)",
        hint="torchless reads the ZIP archives torch writes: torch.save / torch.jit.save "
             "(<name>/data.pkl), torch.export.save (a PT2 archive with an archive_format "
             "record) and torch.package (.data/extern_modules); this is another kind of "
             "ZIP file")


class TorchZip:
    """Reads one torch ZIP checkpoint: the object pickle and its storages."""

    def __init__(self, source: Source, limits: Limits, *, verify_crc: bool = False,
                 archive: ZipArchive | None = None) -> None:
        self.source = source
        self.limits = limits
        self.verify_crc = verify_crc
        self.archive = archive if archive is not None else ZipArchive(source, limits)
        self.prefix = archive_prefix(self.archive)
        self.has_crc = self.archive.has_crc
        self.is_torchscript = self._has("constants.pkl")
        if not self._has(self.object_record):
            raise ArchiveFormatError(f"no {self.prefix}{self.object_record} in the archive")
        self.version = self._version()
        self.byteorder = self._byteorder()
        self._storages: dict[str, Storage] = {}

    #: The record holding the object pickle; storages are ``storage_member(key)``.
    object_record = "data.pkl"

    def storage_member(self, key: str) -> str:
        return f"{self.prefix}data/{key}"

    @property
    def format(self) -> str:
        return "torchscript" if self.is_torchscript else "zip"

    def describe(self, resolver: TorchResolver) -> dict[str, Any]:
        n = len(self.prefix)
        records = sorted(name[n:] for name in self.archive.entries
                         if not name[n:].startswith(("data/", "code/", "constants/")))
        return {"prefix": self.prefix.rstrip("/"), "version": self.version,
                "byteorder": self.byteorder, "crc": self.has_crc, "records": records}

    def _has(self, record: str) -> bool:
        return self.archive.resolve(self.prefix + record) is not None

    def _member(self, record: str) -> str:
        """The member torch reads for ``<prefix>/record`` (names compare ignoring case)."""
        return self._member_name(self.prefix + record)

    def _member_name(self, name: str) -> str:
        return self.archive.resolve(name) or name

    def record(self, record: str) -> bytes:
        """A small record's bytes, CRC-checked."""
        return self.archive.copy(self._member(record), check_crc=self.has_crc)

    def _version(self) -> int | None:
        for record in (".data/version", "version"):
            if self._has(record):
                text = self.record(record).strip()
                if not text.isdigit():
                    raise ArchiveFormatError(f"{record} record is not an integer: {text[:20]!r}")
                version = int(text)
                if version > MAX_FORMAT_VERSION:
                    raise UnsupportedError(
                        f"archive format version {version} is newer than any torch writes",
                        hint="a newer torchless may read it (pip install -U torchless); if "
                             "not, please report the file")
                return version
        raise ArchiveFormatError("no version record in the archive (torch requires one)")

    def _byteorder(self) -> str:
        if not self._has("byteorder"):
            return "little"
        value = self.record("byteorder")
        if value not in (b"little", b"big"):
            raise ArchiveFormatError(f"byteorder record is {value[:20]!r}, not little or big")
        return value.decode()

    # ---- the object -----------------------------------------------------------------

    def load(self, resolver: TorchResolver) -> Any:
        name = self._member(self.object_record)
        declared = self.archive.entries[name].size
        if declared > self.limits.max_pickle_bytes:
            raise LimitError("max_pickle_bytes", self.limits.max_pickle_bytes, declared, name)
        data = self.archive.copy(name, check_crc=self.has_crc)
        try:
            value, end = run_pickle(data, resolver, self.limits)
        except CheckpointError as e:
            if e.offset is not None:  # it counts from the start of data.pkl
                e.add_context(member=name)
            raise
        if end != len(data):
            raise PickleError(f"{len(data) - end} bytes after the pickle's STOP opcode",
                              member=name, offset=end)
        return value

    def persistent_load(self, pid: Any, offset: int) -> Storage:
        if not isinstance(pid, tuple):
            raise StorageError(f"persistent id is {type_phrase(pid)}, not a tuple")
        if len(pid) != 5:
            raise StorageError(f"persistent id has {len(pid)} fields, expected 5")
        tag, storage_type, key, location, numel = pid
        if tag != "storage":
            if isinstance(tag, bytes):
                tag = tag.decode("ascii", "replace")
            if tag != "storage":
                raise StorageError(f"persistent id tag is {tag!r}, expected 'storage'")
        if type(key) is not str:  # torch forms the record name from it: str only
            raise StorageError(f"storage key is {type_phrase(key)}, not a str")
        if not (key.isdigit() and key.isascii()) and not _KEY.match(key):  # digits: torch's
            raise UnsafePathError(f"storage key {key[:60]!r} is not a plain record name")
        if type(storage_type) is not StorageType or type(location) is not str or \
                type(numel) is not int or numel < 0:  # else storage_record changes nothing
            storage_type, key, location, numel = storage_record(storage_type, key, location,
                                                                numel)
        dtype = storage_type.dtype
        nbytes = numel * dtype.itemsize
        known = self._storages.get(key)
        if known is not None and nbytes == known.nbytes == 0 and known.dtype != dtype:
            known = None  # torch re-reads an empty storage for each use, in that use's dtype
        if known is not None:
            if known.dtype != dtype or known.nbytes != nbytes:
                raise StorageError(
                    f"storage {key!r} is used as {known.dtype!r} x {known.nbytes} bytes and as "
                    f"{dtype!r} x {nbytes} bytes")
            return known
        archive = self.archive
        name = self._member_name(self.storage_member(key))
        entry = archive.entries.get(name)
        if entry is None:
            raise StorageError(f"storage {key!r} has no record {name!r} in the archive")
        if entry.size != nbytes:
            raise StorageError(
                f"storage {key!r} declares {numel} x {dtype.itemsize} = {nbytes} bytes, "
                f"its record holds {entry.size}")
        # the archive, not self: a storage must not keep the storage table alive; the
        # entry's name, not ours: one string per member
        storage = MemberStorage(archive, entry.name, key, dtype, nbytes, location,
                                self.byteorder, self.verify_crc and self.has_crc)
        self._storages[key] = storage
        return storage

    # ---- TorchScript ----------------------------------------------------------------

    def script_classes(self) -> dict[str, _ScriptClass]:
        """Class definitions of a TorchScript archive, read as text (never run)."""
        classes: dict[str, _ScriptClass] = {}
        code_prefix = self.prefix + "code/"
        for name, entry in self.archive.entries.items():
            if not name.startswith(code_prefix) or not name.endswith(".py"):
                continue
            if entry.size > self.limits.max_pickle_bytes:
                continue
            text = self.archive.copy(name, check_crc=self.has_crc).decode(
                "utf-8", "replace")
            module = name[len(code_prefix):-3].replace("/", ".")
            blocks = list(_CLASS.finditer(text))
            for i, m in enumerate(blocks):
                body = text[m.end():blocks[i + 1].start() if i + 1 < len(blocks) else len(text)]
                cls = _ScriptClass(is_module=m.group(2).split(".")[-1] == "Module")
                for lm in _LIST.finditer(body):
                    names = re.findall(r'"([^"]*)"', lm.group(2))
                    if lm.group(1) == "__parameters__":
                        cls.parameters = names
                    else:
                        cls.buffers = names
                classes[f"{module}.{m.group(1)}"] = cls
        return classes

    def module_hook(self) -> ModuleHook:
        """How modules are recognised: by their pickled __dict__, or by TorchScript class."""
        if not self.is_torchscript:
            return module_state_dict
        classes = self.script_classes()

        def hook(obj: Opaque) -> ModuleDict | None:
            c = obj.callable
            if not isinstance(c, Global) or not isinstance(obj.state, dict):
                return module_state_dict(obj)
            info = classes.get(c.path)
            if info is None or not info.is_module:
                return None
            out = ModuleDict()
            state = obj.state
            for k, v in state.items():
                if k in info.parameters and v is not None:
                    out[k] = v
            for k, v in state.items():
                if k in info.buffers and v is not None:
                    out[k] = v
            for k, v in state.items():
                if isinstance(v, ModuleDict):
                    for sub, t in v.items():
                        out[f"{k}.{sub}"] = t
            return out

        return hook


def archive_prefix(archive: ZipArchive) -> str:
    """The one directory every member of a torch ZIP archive lies in (torch takes it from
    the first entry)."""
    entries = list(archive.entries)
    if not entries:
        raise ArchiveFormatError("the ZIP archive has no members")
    first = entries[0]
    if "/" not in first:
        raise ArchiveFormatError(
            f"archive member {first!r} is not in a subdirectory (torch requires one)")
    prefix = first.split("/", 1)[0] + "/"
    for name in entries:
        if not name.startswith(prefix):
            raise AmbiguousArchiveError(
                f"archive member {name!r} lies outside the prefix {prefix!r} "
                "(several checkpoints in one archive)")
    return prefix
