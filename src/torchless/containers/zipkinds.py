"""Which reader a torch ZIP archive needs: ``torch.save`` / ``torch.jit.save`` (a
``data.pkl``), ``torch.export.save`` (an ``archive_format`` record) or ``torch.package``
(``.data/extern_modules``). The central directory is parsed once and handed to the reader.
A ZIP archive that is none of them is refused with what it holds."""

from __future__ import annotations

import os

from torchless.containers.base import Container
from torchless.containers.package import PackageArchive, is_package
from torchless.containers.pt2 import Pt2Archive
from torchless.containers.torchzip import TorchZip, archive_prefix, not_a_torch_zip
from torchless.containers.ziparchive import ZipArchive
from torchless.core.limits import Limits
from torchless.io.source import Source

__all__ = ["extracted_archive", "open_zip"]

#: The last name segment of the record that makes a ZIP archive one torch reads (a
#: torch.save/jit.save pickle, a PT2 archive's version record, a package's extern list).
_MARKERS = frozenset({"data.pkl", "archive_format", "extern_modules"})


def open_zip(source: Source, limits: Limits, verify_crc: bool) -> Container:
    archive = ZipArchive(source, limits)
    if not any(name.lower().rsplit("/", 1)[-1] in _MARKERS for name in archive.entries):
        raise not_a_torch_zip(list(archive.entries))
    prefix = archive_prefix(archive)
    entries = archive.entries
    if prefix + "archive_format" in entries:
        return Pt2Archive(source, limits, archive, prefix, verify_crc=verify_crc)
    if is_package(archive, prefix):
        return PackageArchive(source, limits, archive, prefix, verify_crc=verify_crc)
    if archive.resolve(prefix + "data.pkl") is None:
        raise not_a_torch_zip(list(entries))
    return TorchZip(source, limits, verify_crc=verify_crc, archive=archive)


#: A record that marks the root of each kind of torch ZIP archive, and what it is.
_ROOT_RECORDS = (("archive_format", "a PT2 archive (torch.export.save)"),
                 (".data/extern_modules", "a torch.package archive"),
                 ("data.pkl", "a torch.save checkpoint"))


def extracted_archive(path: str) -> str | None:
    """What a directory is if it is a torch ZIP archive unpacked (its root, or the one
    directory every member lies in): torchless reads the archive file, not its members."""
    for root in (path, *_only_subdirectory(path)):
        for record, what in _ROOT_RECORDS:
            if os.path.isfile(os.path.join(root, record)):
                return what
    return None


def _only_subdirectory(path: str) -> list[str]:
    try:
        names = os.listdir(path)
    except OSError:
        return []
    return [os.path.join(path, names[0])] if len(names) == 1 else []
