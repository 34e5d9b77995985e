"""The ``torch.package`` archive (``PackageExporter``), its pickles read inert.

Layout (``torch/package/package_exporter.py``, ``package_importer.py``)::

    <prefix>/<package path>/<resource>      a pickle (save_pickle), text or bytes
    <prefix>/<module path>.py               the source of every interned module
    <prefix>/.data/<key>.storage            raw bytes of each storage
    <prefix>/.data/extern_modules           the modules left to the loading environment
    <prefix>/.data/version, python_version  format and Python versions
    <prefix>/byteorder                      "little" or "big"

A pickle's classes mostly come from the interned modules, whose source is in the archive:
they stay inert records (the source is never imported or run). Persistent ids are
``("storage", <Name>Storage, key, location, numel)`` as in ``torch.save``, and
``("reduce_package", func, args)`` for an object with ``__reduce_package__``, which is kept
as an inert record of that call. The object is that of the one pickle in the archive, or
(several) a dict of them by resource path.
"""

from __future__ import annotations

from typing import Any

from torchless.containers.torchzip import TorchZip
from torchless.containers.ziparchive import ZipArchive
from torchless.core.limits import Limits
from torchless.errors import ArchiveFormatError, CheckpointError, PickleError, StorageError
from torchless.io.source import Source
from torchless.model.tensor import Storage
from torchless.pickle.machine import run_pickle
from torchless.pickle.values import Global, Opaque
from torchless.rules.resolver import TorchResolver

__all__ = ["PackageArchive", "is_package"]


def _is_pickle(head: bytes) -> bool:
    """What ``save_pickle`` writes: a PROTO opcode first (never a bare protocol-0 pickle)."""
    return len(head) > 2 and head[0] == 0x80 and head[1] <= 5


def is_package(archive: ZipArchive, prefix: str) -> bool:
    """Whether a torch ZIP archive is a ``torch.package`` (every exporter writes these)."""
    return prefix + ".data/extern_modules" in archive.entries


class PackageArchive(TorchZip):
    """Reads the pickles of a torch.package archive and their storages."""

    def __init__(self, source: Source, limits: Limits, archive: ZipArchive, prefix: str,
                 *, verify_crc: bool = False) -> None:
        self.source = source
        self.limits = limits
        self.verify_crc = verify_crc
        self.archive = archive
        self.prefix = prefix
        self.has_crc = archive.has_crc
        self.is_torchscript = False
        self.version = self._version()
        self.byteorder = self._byteorder()
        self._storages: dict[str, Storage] = {}
        n = len(prefix)
        self.pickles = [name[n:] for name, entry in archive.entries.items()
                        if not name[n:].startswith(".data/") and not name.endswith(".py")
                        and name[n:] != "byteorder" and not name.endswith("/")
                        and entry.size <= limits.max_pickle_bytes
                        and _is_pickle(self._head(name))]
        if not self.pickles:
            raise ArchiveFormatError(
                "a torch.package archive with no pickled resource (nothing "
                "PackageImporter.load_pickle reads)",
                hint="the archive holds only modules and data files: there are no tensors "
                     "to read")
        self.interned = sorted(name[n:-3].replace("/", ".") for name in archive.entries
                               if name.endswith(".py"))
        self.extern = [line for line in self.record(".data/extern_modules").decode(
            "utf-8", "replace").splitlines() if line]

    @property
    def format(self) -> str:
        return "package"

    def _head(self, name: str) -> bytes:
        entry = self.archive.entries[name]
        return bytes(self.archive.data(name, check_crc=False)[:512]) if entry.size else b""

    def storage_member(self, key: str) -> str:
        return f"{self.prefix}.data/{key}.storage"

    def load(self, resolver: TorchResolver) -> Any:
        values = {}
        for record in self.pickles:
            name = self.prefix + record
            data = self.archive.data(name, check_crc=self.has_crc)
            try:
                value, end = run_pickle(data, resolver, self.limits)
            except CheckpointError as e:
                raise e.add_context(member=name) from None
            if end != len(data):
                raise PickleError(f"{len(data) - end} bytes after the pickle's STOP opcode",
                                  member=name, offset=end)
            values[record] = value
        return values[self.pickles[0]] if len(self.pickles) == 1 else values

    def persistent_load(self, pid: Any, offset: int) -> Any:
        if isinstance(pid, tuple) and pid and pid[0] in ("reduce_package", b"reduce_package"):
            args = pid[1:]
            if len(args) in (2, 3) and isinstance(args[-2], Global) \
                    and isinstance(args[-1], tuple):
                return Opaque(args[-2], args[-1])
            raise StorageError("a reduce_package persistent id is not "
                               "(reduce_package, [id,] function, args)")
        if isinstance(pid, tuple) and len(pid) == 5 and type(pid[2]) is int:
            pid = (*pid[:2], str(pid[2]), *pid[3:])  # the exporter numbers its storages
        return super().persistent_load(pid, offset)

    def describe(self, resolver: TorchResolver) -> dict[str, Any]:
        return {"prefix": self.prefix.rstrip("/"), "version": self.version,
                "byteorder": self.byteorder, "crc": self.has_crc,
                "pickles": list(self.pickles), "interned": self.interned,
                "extern": self.extern}
