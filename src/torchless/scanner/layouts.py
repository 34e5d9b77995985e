"""How the scanner walks each layout: the reader's container parsers in report mode (ZIP,
TAR, the legacy stream), and every pickle they hold, the bytes between and after them
included, handed to the scanner's pickle pass (:meth:`LayoutScans.pickle`)."""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torchless.containers import registry
from torchless.containers.base import npy_regions, plain_regions
from torchless.containers.legacy import legacy_regions
from torchless.containers.regions import SNIFF, PickleRun, absorb
from torchless.containers.tar import tar_regions
from torchless.containers.torchzip import not_a_torch_zip
from torchless.containers.ziparchive import Entry, ZipArchive
from torchless.core.findings import Anomaly, Findings
from torchless.core.limits import Limits
from torchless.errors import CheckpointError, NotACheckpointError
from torchless.io.detect import has_zip_tail, tar_polyglot
from torchless.io.source import Source
from torchless.scanner.pickles import (
    PICKLE_START,
    RUNS_OUT,
    looks_like_pickle,
    scan_stream,
)
from torchless.scanner.report import GlobalRef
from torchless.scanner.script import script_calls
from torchless.scanner.torcharchives import archive_kind, nested_archives, package_code, unpickled

__all__ = ["LayoutScans", "NestedScan"]

_SNIFF = SNIFF
#: Bytes of a stored member checksummed at a time (then handed back to the page cache).
_CRC_BLOCK = 64 << 20
#: Members larger than this are not inflated just to check their CRC.
_CRC_INFLATE_CAP = 64 << 20


class LayoutScans:
    """The layout half of the scan of one file (see ``scanner.files._File``)."""

    source: Source
    buf: Any
    size: int
    limits: Limits
    findings: Findings
    anomalies: list[Anomaly]
    globals: list[GlobalRef]
    #: The operators the TorchScript code in the file calls (:mod:`.script`).
    script_ops: list[str]
    pickles: int
    #: How many archives this file lies inside (0: a file of its own).
    depth: int
    _crcs: dict[tuple[int, int, int, int], int | None]
    #: Whole members under ``code/`` read by :meth:`member`, by ``id()`` of the entry (for
    #: :meth:`script`, which reads them again as text).
    _code: dict[int, bytes]
    #: Check the CRC-32 of every member, tensor data included (else of those read whole).
    verify_crc: bool

    def spawn(self, source: Source) -> LayoutScans:  # pragma: no cover - _File defines it
        """The scan of a file stored inside this one."""
        raise NotImplementedError

    def pickle(self, data: Any, start: int, end: int, member: str | None, what: str, *,
               tentative: bool = False, want_value: bool = False,
               plain: bool = False) -> PickleRun | None:  # pragma: no cover - _File's
        raise NotImplementedError

    def chain(self, data: Any, start: int, end: int, member: str | None, what: str, *,
              tentative: bool = False) -> None:  # pragma: no cover - _File defines it
        raise NotImplementedError

    # ---- the region sink (containers.regions.RegionSink) ------------------------------

    def flag(self, kind: str, message: str, member: str | None = None,
             offset: int | None = None) -> None:
        self.findings.note(kind, message, member, offset)

    def found_any(self) -> bool:
        return bool(self.anomalies or self.globals)

    def could_be_pickle(self, data: Any) -> bool:
        # the first byte's test first: most members are tensor data
        return len(data) > 0 and data[0] in PICKLE_START and looks_like_pickle(data,
                                                                               self.limits)

    def broken_pickle(self, data: Any, start: int, end: int) -> tuple[int, str] | None:
        probe = scan_stream(data, start, end, self.limits)
        if not probe.stopped and not probe.globals and not probe.limited and \
                probe.problems and not RUNS_OUT.search(probe.problems[-1][1]):
            return probe.problems[-1]
        return None

    def code(self, member: str, data: bytes) -> None:
        """The calls TorchScript code names: file and network access is dangerous, an
        operator or class from a native library outside torch an anomaly (:mod:`.script`)."""
        for call in script_calls(data.decode("utf-8", "replace")):
            if call.op not in self.script_ops:
                self.script_ops.append(call.op)
            if call.danger:
                ns, _, op = call.op.partition("::")
                self.globals.append(GlobalRef(
                    f"torch.ops.{ns}", op, call.offset, "TorchScript call", "dangerous",
                    member, f"TorchScript code {call.danger}; torch.jit.load runs it "
                            "when the code is in __setstate__"))
            elif call.unknown:
                self.flag("script", f"TorchScript code calls {call.op}, from a native "
                          "library outside torch: what it does cannot be read from the "
                          "file", member, call.offset)

    def nested(self, source: Source) -> NestedScan:
        sub = self.spawn(source)
        try:
            return NestedScan(self, sub, sub.run(), None)
        except CheckpointError as e:
            return NestedScan(self, sub, None, e)

    # ---- the walks --------------------------------------------------------------------

    def run(self) -> str:
        head = bytes(self.buf[:8]) if self.size else b""
        if head.startswith(b"\x93NUMPY"):
            return npy_regions(self.source, self.limits, self)
        zip_tail = has_zip_tail(self.source)
        try:
            layout: str | None = registry.sniff_file(self.source).name
        except NotACheckpointError:
            if not zip_tail and not self._looks_like_pickle():
                raise
            layout = None if zip_tail else "pickle"
        except CheckpointError:
            if not zip_tail:
                raise
            layout = None
        if layout is not None and layout != "zip" and zip_tail:
            self.flag("polyglot", f"the file starts as a {layout} checkpoint and ends "
                      "with a ZIP archive: torch and ZIP readers load different content")
        tar_too = tar_polyglot(bytes(self.buf[:512]), self.size)
        if tar_too is not None:
            self.flag("polyglot", f"the file is both a TAR archive and {tar_too}: torch.load "
                      "reads the TAR archive, other readers the rest")
            if layout == "tar":
                layout = "zip" if tar_too.endswith("ZIP archive") else \
                    "legacy" if "legacy" in tar_too else "pickle"
            self.tar()
        walks: dict[str, Callable[[], None]] = {
            "legacy": self.legacy, "tar": self.tar,
            "pickle": self.plain}
        if layout is not None and layout != "zip":
            walk = walks.get(layout)
            if walk is None:  # a registered layout the scanner has no walk for
                self.flag("layout", f"no scanner walk for the {layout} layout: its pickles "
                          "were not looked at")
            else:
                walk()
        if layout == "zip" or zip_tail:
            name = self.zip(skip_prefix=layout is not None and layout != "zip")
            name = name if layout in (None, "zip") else f"{layout}+zip"
        else:
            assert layout is not None
            name = layout
        return f"tar+{name}" if tar_too is not None else name

    def plain(self) -> None:
        plain_regions(self.source, self.limits, self)

    def _looks_like_pickle(self) -> bool:
        """A file torch.load would hand to the unpickler although no magic matched."""
        return self.size > 0 and looks_like_pickle(self.buf[:_SNIFF], self.limits)

    def legacy(self) -> None:
        legacy_regions(self.source, self.limits, self)

    # ---- ZIP --------------------------------------------------------------------------

    def zip(self, *, skip_prefix: bool) -> str:
        archive = ZipArchive(self.source, self.limits, mode="report")
        absorb(self, archive.findings, skip_prefix=skip_prefix)
        for lo, hi in archive.loose:
            if not (skip_prefix and lo == 0):
                self.chain_region(lo, hi)
        members = [m for m in archive.members if not m.is_dir]
        lows = [m.name.lower() for m in members]  # torch's reader ignores case
        names = [m.name for m in members if m.listed]
        listed = [low for m, low in zip(members, lows, strict=True) if m.listed]
        kind, prefix = archive_kind(names)
        for m, low in zip(members, lows, strict=True):
            self.member(archive, m, unpickled(kind, prefix, m.name), low)
        self.script(archive, members, lows)
        if kind == "pt2":
            nested_archives(self, archive, members, prefix)
        elif kind == "package":
            package_code(self, members, prefix)
        pickles = [n for n, low in zip(names, listed, strict=True)
                   if low == "data.pkl" or low.endswith("/data.pkl")]
        if len(pickles) > 1:
            self.flag("torch", f"{len(pickles)} data.pkl records ({', '.join(pickles[:4])}): "
                      "readers pick different ones")
        prefixes = sorted({n.split("/", 1)[0] for n in names if "/" in n})
        if len(prefixes) > 1:
            self.flag("torch", f"members under {len(prefixes)} top-level directories "
                      f"({', '.join(prefixes[:4])}): several checkpoints in one archive")
        if kind is not None:
            return kind
        if not self.found_any() and not pickles:
            raise not_a_torch_zip(names)
        script = any(low.endswith("/constants.pkl") for low in listed)
        code = any("/code/" in low for low in listed)
        if script and not code:
            self.flag("torch", "constants.pkl without code/: a torch.save archive dressed as "
                      "TorchScript (loaders dispatch it to torch.jit.load)")
        return "torchscript" if script and code else "zip"

    def script(self, archive: ZipArchive, members: list[Entry], lows: list[str]) -> None:
        """The TorchScript code in the archive (torch finds ``code/`` and ``.py`` ignoring
        case; ``lows``: the members' names in lower case)."""
        for m, name in zip(members, lows, strict=True):
            if "code/" not in name or not name.endswith(".py"):
                continue
            data = self._code.get(id(m))
            if data is None or len(data) > self.limits.max_pickle_bytes:
                data, _ = archive.head(m, self.limits.max_pickle_bytes)
            if data is None:
                continue
            self.code(m.name, data)

    def chain_region(self, lo: int, hi: int) -> None:
        self.chain(self.buf, lo, hi, None, "unowned", tentative=True)

    def member(self, archive: ZipArchive, m: Entry, pickled: bool | None = False,
               low: str | None = None) -> None:
        """``pickled``: torch unpickles the member whatever it holds (True), or if it
        starts with PROTO (None: a torch.package resource); ``low``: its name in lower
        case."""
        low = m.name.lower() if low is None else low
        # data.pkl, constants.pkl, *.debug_pkl; any case (torch's reader ignores case)
        is_pickle = low.endswith("pkl") or pickled is True
        if pickled is None and m.size > 2:
            head, _ = archive.head(m, 2)
            is_pickle = is_pickle or (head is not None and head[:1] == b"\x80")
        if is_pickle and m.size > self.limits.max_pickle_bytes:
            self.flag("limit", f"pickle member of {m.size} bytes is larger than "
                      f"max_pickle_bytes={self.limits.max_pickle_bytes}; not scanned", m.name)
            return
        cap = min(m.size + 1, self.limits.max_pickle_bytes + 1) if is_pickle else _SNIFF
        data, why = archive.head(m, cap)
        if data is None:
            if why and m.method in (0, 8):
                self.flag("member", f"cannot be read: {why}", m.name, m.data_offset)
            return
        if len(data) < cap and "code/" in low:
            self._code[id(m)] = data  # the whole member: script() reads it again
        if not is_pickle and not self.could_be_pickle(data):  # most members: tensor data
            self._check_crc(archive, m, data, whole=False)
            return
        self._check_crc(archive, m, data, whole=True)
        if not is_pickle:
            if m.size > len(data):
                data, _ = archive.head(m, min(m.size, self.limits.max_pickle_bytes))
                if data is None:
                    return
        if is_pickle:
            self.chain(data, 0, min(len(data), m.size), m.name, "member")
        else:
            self.pickle(data, 0, len(data), m.name, "member", tentative=True)

    def _check_crc(self, archive: ZipArchive, m: Entry, head: bytes, *, whole: bool) -> None:
        """The member's CRC-32 against the recorded one. ``whole``: the member is a pickle
        (or reads as one), so its CRC is checked even where its bytes are not all in
        ``head``; the CRC of other members (tensor data, which torch reads unchecked and no
        unpickler runs) only when ``head`` holds them all, or with ``verify_crc``."""
        if m.method == 8 and len(head) > m.size:
            self.flag("member", f"inflates to more than the {m.size} bytes declared", m.name,
                      m.data_offset)
            return
        if not archive.has_crc or m.method not in (0, 8) or not m.listed:
            return
        in_hand = len(head) >= (m.compressed_size if m.method == 0 else m.size)
        if not (whole or in_hand or self.verify_crc):
            return
        key = (m.data_offset, m.compressed_size, m.method, m.size)
        if key not in self._crcs:
            self._crcs[key] = self._crc(archive, m, head)
        crc = self._crcs[key]
        if crc is not None and crc != m.crc:
            self.flag("crc", "CRC-32 of the bytes differs from the recorded one (torch does "
                      "not check it)", m.name, m.data_offset)

    def _crc(self, archive: ZipArchive, m: Entry, head: bytes) -> int | None:
        if m.data_offset < 0 or m.data_offset + m.compressed_size > self.size:
            return None  # reported as out of bounds by the ZIP pass
        if m.method == 0:
            if len(head) == m.compressed_size:  # the whole member, as head() read it
                return zlib.crc32(head)
            crc = 0
            for lo in range(m.data_offset, m.data_offset + m.compressed_size, _CRC_BLOCK):
                hi = min(lo + _CRC_BLOCK, m.data_offset + m.compressed_size)
                crc = zlib.crc32(self.buf[lo:hi], crc)
                self.source.release(lo, hi - lo)  # keep the resident set small
            return crc
        if m.size <= len(head):
            data: bytes | None = head
        elif m.size <= _CRC_INFLATE_CAP:
            data, _ = archive.head(m, m.size + 1)
        else:
            return None
        if data is None:
            return None
        if len(data) != m.size:
            self.flag("member", f"inflates to {len(data)} bytes, {m.size} declared", m.name,
                      m.data_offset)
            return None
        return zlib.crc32(data)

    # ---- TAR --------------------------------------------------------------------------

    def tar(self) -> None:
        tar_regions(self.source, self.limits, self)

@dataclass
class NestedScan:
    """The scan of a file inside another (:meth:`LayoutScans.nested`)."""

    root: LayoutScans
    sub: LayoutScans
    layout: str | None
    error: CheckpointError | None

    def merge(self, where: str) -> None:
        """What the nested scan found, added to the scan it is part of, each finding named
        by ``where`` (and its own member inside it)."""
        def inside(member: str | None) -> str:
            return where if member is None else f"{where}: {member}"

        root, sub = self.root, self.sub
        root.pickles += sub.pickles
        root.globals.extend(dataclasses.replace(g, member=inside(g.member))
                            for g in sub.globals)
        root.anomalies.extend(dataclasses.replace(a, member=inside(a.member))
                              for a in sub.anomalies)
        root.script_ops.extend(op for op in sub.script_ops if op not in root.script_ops)
        cut = sub.findings.truncated
        if cut is not None:
            root.flag("truncated", cut.message, where, cut.offset)
