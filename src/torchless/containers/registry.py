"""Which container reads a path: the layouts torchless knows, each found by sniffing a file's
first bytes or a directory's entries, never by a name's extension.

A new layout is one module and one :func:`register` call here, for reading and scanning
both: the module has a class that follows :class:`~torchless.containers.base.Container` (its
reader) and a region walk beside it (:mod:`.regions`: what torch would unpickle or compile in
the file, handed to the scanner's sink). ``torchless.open`` and everything built on it then
read it, ``Checkpoint.format`` / ``info["layout"]`` report it, and ``torchless scan`` walks
it: a layout cannot be registered without its region walk, so none is ever left unscanned.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from torchless.containers.base import Container, PlainPickle, plain_regions
from torchless.containers.legacy import LegacyStream, legacy_regions
from torchless.containers.regions import EACH_FILE, DirectoryWalk, FileWalk, RegionSink
from torchless.containers.tar import TorchTar, tar_regions
from torchless.containers.zipkinds import extracted_archive, open_zip
from torchless.containers.zipregions import zip_regions
from torchless.core.limits import Limits
from torchless.errors import AmbiguousArchiveError, NotACheckpointError
from torchless.io import detect
from torchless.io.source import Source

__all__ = ["DirectoryLayout", "FileLayout", "file_layout", "find_directory", "find_file",
           "layouts", "register", "sniff_directory", "sniff_file"]


@dataclass(frozen=True)
class FileLayout:
    """A layout of one file. ``sniff(head, size)`` looks at its first 512 bytes; a ``weak``
    sniff (any pickle) is tried only after every known other format is ruled out;
    ``regions`` walks what torch would unpickle or compile in it, for the scanner."""

    name: str
    sniff: Callable[[bytes, int], bool]
    open: Callable[[Source, Limits, bool], Container]  # (source, limits, verify_crc)
    regions: FileWalk
    weak: bool = False


@dataclass(frozen=True)
class DirectoryLayout:
    """A layout of a directory (a sharded checkpoint). ``sniff(path)`` looks at its entries;
    ``open`` returns a container that also has ``close()``; ``regions`` walks the directory
    as one item for the scanner, or is :data:`~.regions.EACH_FILE`: its files are scanned
    each as a file of its own (no pickle torch unpickles spans them)."""

    name: str
    sniff: Callable[[str], bool]
    open: Callable[[str, Limits, bool], Container]
    regions: DirectoryWalk | Literal["each file"]


_FILES: list[FileLayout] = []
_DIRECTORIES: list[DirectoryLayout] = []


def register(layout: FileLayout | DirectoryLayout, *, first: bool = False) -> None:
    """Add a layout (tried after those registered before it, or before all with ``first``)."""
    if not (callable(layout.regions) or
            (isinstance(layout, DirectoryLayout) and layout.regions == EACH_FILE)):
        raise TypeError(f"the {layout.name!r} layout has no region walk: the scanner could "
                        "not look at its pickles")
    if layout.name in layouts():
        raise ValueError(f"a layout named {layout.name!r} is already registered")
    if isinstance(layout, FileLayout):
        _FILES.insert(0 if first else len(_FILES), layout)
    else:
        _DIRECTORIES.insert(0 if first else len(_DIRECTORIES), layout)


def layouts() -> tuple[str, ...]:
    """The names of every registered layout, files first, in the order they are tried."""
    return tuple([x.name for x in _FILES] + [x.name for x in _DIRECTORIES])


def file_layout(name: str) -> FileLayout:
    """The registered file layout named ``name`` (KeyError if there is none)."""
    found = next((x for x in _FILES if x.name == name), None)
    if found is None:
        raise KeyError(name)
    return found


def sniff_file(source: Source) -> FileLayout:
    """The layout ``source`` starts as; NotACheckpointError saying what the file is otherwise.
    (The scanner uses this and reports a polyglot; readers use :func:`find_file`.)"""
    head, size = detect.head_of(source), source.size
    found = next((x for x in _FILES if not x.weak and x.sniff(head, size)), None)
    if found is None:
        detect.refuse_other_formats(head, size)
        found = next((x for x in _FILES if x.weak and x.sniff(head, size)), None)
    if found is None:
        detect.refuse_unrecognised(source, head)
        raise AssertionError  # pragma: no cover - it always raises
    return found


def find_file(source: Source) -> FileLayout:
    """The layout of ``source``, for reading: a file that starts as one layout and ends as a
    ZIP archive is refused (torch and a ZIP reader would see different checkpoints in it)."""
    if not source.remote:
        from torchless.containers import dcp, zero

        dcp.refuse_member(source.path)
        zero.refuse_rank_file(source.path)
    found = sniff_file(source)
    other = detect.tar_polyglot(detect.head_of(source), source.size)
    if other is not None:
        raise AmbiguousArchiveError(
            f"the file is both a TAR archive and {other} (torch.load reads the TAR "
            "archive, other readers the rest: they would load different content)",
            hint="do not load this file; if you made it, save it again with torch.save")
    if found.name != "zip" and detect.has_zip_tail(source):
        raise AmbiguousArchiveError(
            f"the file starts as a {found.name} checkpoint but ends with a ZIP archive "
            "(a polyglot: different readers would load different content)")
    return found


def sniff_directory(path: str) -> DirectoryLayout | None:
    """The layout of a directory that is one checkpoint (a DCP directory …), or None."""
    return next((x for x in _DIRECTORIES if x.sniff(path)), None)


def find_directory(path: str) -> DirectoryLayout:
    found = sniff_directory(path)
    unpacked = extracted_archive(path) if found is None else None
    if unpacked is not None:
        raise NotACheckpointError(
            f"a directory holding {unpacked} unpacked: torchless reads the archive file",
            path=path, hint="open the archive file itself (or zip the directory back, its "
                            "members under one top directory, without compression)")
    if found is None:
        model_dir = any(name.endswith((".bin", ".safetensors", ".index.json"))
                        for name in os.listdir(path))
        raise NotACheckpointError(
            "a directory that no registered layout reads (known: "
            f"{', '.join(layouts())})", path=path,
            hint="a Hugging Face model directory converts with `torchless convert DIR`; "
                 "`torchless inspect DIR` lists each checkpoint file in it" if model_dir else
                 "pass a checkpoint file; `torchless inspect DIR` lists the checkpoint "
                 "files in a directory")
    return found


register(FileLayout("zip", detect.is_zip, open_zip,  # torch.save, .pt2, torch.package
                    zip_regions))
register(FileLayout("legacy", detect.is_legacy, lambda s, lim, crc: LegacyStream(s, lim),
                    legacy_regions))
register(FileLayout("tar", detect.is_tar, lambda s, lim, crc: TorchTar(s, lim), tar_regions))
register(FileLayout("pickle", detect.is_pickle, lambda s, lim, crc: PlainPickle(s, lim),
                    plain_regions, weak=True))

# The directory layouts' modules are imported when a directory is sniffed or read: scanning
# or opening a file never imports them (they were 16 of the scan command's 91 modules).

def _is_dcp(path: str) -> bool:
    from torchless.containers.dcp import is_dcp_dir

    return is_dcp_dir(path)


def _open_dcp(path: str, limits: Limits, verify_crc: bool, *,
              hf_sharded: bool = False) -> Container:
    from torchless.containers.dcp import DcpDirectory

    return DcpDirectory(path, limits, verify_crc=verify_crc, hf_sharded=hf_sharded)


def _dcp_regions(path: str, limits: Limits, sink: RegionSink) -> str:
    from torchless.containers.dcpregions import dcp_regions

    return dcp_regions(path, limits, sink)


def _is_hf_sharded(path: str) -> bool:
    from torchless.containers.dcpst import is_hf_sharded_dir

    return is_hf_sharded_dir(path)


def _is_zero(path: str) -> bool:
    from torchless.containers.zero import is_zero_dir

    return is_zero_dir(path)


def _open_zero(path: str, limits: Limits, verify_crc: bool) -> Container:
    from torchless.containers.zero import ZeroDirectory

    return ZeroDirectory(path, limits, verify_crc=verify_crc)


def _is_ranks(path: str) -> bool:
    from torchless.containers.ranks import is_rank_dir

    return is_rank_dir(path)


def _open_ranks(path: str, limits: Limits, verify_crc: bool) -> Container:
    from torchless.containers.ranks import RankDirectory

    return RankDirectory(path, limits, verify_crc=verify_crc)


def _is_megatron_legacy(path: str) -> bool:
    from torchless.containers.megatronlegacy import is_megatron_legacy_dir

    return is_megatron_legacy_dir(path)


def _open_megatron_legacy(path: str, limits: Limits, verify_crc: bool) -> Container:
    from torchless.containers.megatronlegacy import MegatronLegacyDirectory

    return MegatronLegacyDirectory(path, limits, verify_crc=verify_crc)


def _megatron_dist(path: str) -> str | None:
    """The DCP directory a Megatron tracker file points at, or None."""
    from torchless.containers.megatron import tracked_dist_dir

    return tracked_dist_dir(path)


register(DirectoryLayout("dcp", _is_dcp, _open_dcp, _dcp_regions))
register(DirectoryLayout("dcp-hf", _is_hf_sharded,
                         lambda p, lim, crc: _open_dcp(p, lim, crc, hf_sharded=True),
                         "each file"))
register(DirectoryLayout("zero", _is_zero, _open_zero, "each file"))
register(DirectoryLayout("ranks", _is_ranks, _open_ranks, "each file"))
register(DirectoryLayout("megatron-legacy", _is_megatron_legacy, _open_megatron_legacy,
                         "each file"))
register(DirectoryLayout("megatron-dist", lambda p: _megatron_dist(p) is not None,
                         lambda p, lim, crc: _open_dcp(_megatron_dist(p) or p, lim, crc),
                         lambda p, lim, sink: _dcp_regions(_megatron_dist(p) or p, lim,
                                                           sink)))
