"""``torchless scan``: every global and every container trick in a file, without running it.

The reader refuses a file at its first problem; a scanner must instead report everything a
loader could be made to do. For each file (directories are walked recursively) the layout is
found from the content, never the name, and then:

* every pickle is walked opcode by opcode (:mod:`._scan_pickle`): all members of a ZIP archive
  (not only ``data.pkl``; other members when their bytes are a pickle), the five pickles of a
  legacy stream and whatever follows its storages, each pickle of a TAR checkpoint, plain
  pickles and every pickle concatenated after them, the object array of a ``.npy`` file, and
  the bytes before, between and after the members of an archive;
* each global gets a verdict from the reader's own tables (:class:`._rules.TorchResolver`,
  which applies the rebuild rules and :func:`._policy.judge`): ``rebuilt`` (a rule rebuilds
  it), ``opaque`` (a class kept as inert data) or ``dangerous`` (calling or importing it could
  run code, touch files, processes or the network; or its name cannot be read statically);
* container anomalies that make scanners and torch see different files are listed
  (:mod:`._scan_zip` for ZIP; legacy, TAR and pickle checks here).

Status of a file: ``dangerous`` (a dangerous global), ``anomalous`` (an anomaly, no dangerous
global), ``clean``, ``unreadable`` (cannot be opened or is not a checkpoint but was named
explicitly, or is a compressed container that may hide one), or ``skipped`` (met while walking
a directory and not a checkpoint: text, images, safetensors …), or ``error`` (the scanner met
a bug of its own on the file: no verdict; the error says "internal error" and the hint asks
for a report). Exit code: 1 if any file is dangerous or anomalous, else 2 if any is
unreadable or met an error, else 0.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from collections.abc import Iterable, Iterator
from concurrent.futures import Executor
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from torchless.containers.legacy import declared_storages, read_header, walk_storages
from torchless.containers.storages import PickleReader
from torchless.containers.tar import (
    check_object_end,
    read_sys_info,
    walk_tensors,
)
from torchless.containers.tar import walk_storages as walk_tar_storages
from torchless.containers.tararchive import TarArchive
from torchless.containers.ziparchive import Entry, ZipArchive
from torchless.core.findings import Anomaly, Findings
from torchless.core.limits import Limits
from torchless.core.text import printable
from torchless.errors import CheckpointError, InternalError, NotACheckpointError
from torchless.io.detect import Layout, _detect, has_zip_tail
from torchless.io.remote import RemoteSource, is_remote
from torchless.io.source import Source
from torchless.rules.resolver import TorchResolver
from torchless.scanner.pickles import FoundGlobal, StreamScan, scan_stream

__all__ = ["Anomaly", "FileScan", "GlobalRef", "ScanReport", "format_table", "scan",
           "scan_paths"]

#: Bytes of the start of a member or region walked to decide whether it holds a pickle.
_SNIFF = 64 << 10
#: Bytes of a stored member checksummed at a time (then handed back to the page cache).
_CRC_BLOCK = 64 << 20
#: Members larger than this are not inflated just to check their CRC.
_CRC_INFLATE_CAP = 64 << 20
#: Pickles followed one after another in a plain file or after a legacy stream.
_MAX_CHAINED = 1000
_PICKLE_START = frozenset(b"(cNIJKLMFSTUVXG]})\x8a\x8c\x95\x80")
_COMPRESSED = (b"\x1f\x8b", b"7z\xbc\xaf\x27\x1c", b"BZh", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd",
               b"Rar!")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


#: Globals the reader rebuilds only for some arguments (it refuses the others): judged by
#: name, as the scanner judges, they could run code under torch.load.
_ARGUMENT_DEPENDENT = {
    ("builtins", "getattr"): "getattr reaches any attribute of what it is given; torchless "
                             "resolves only getattr(Class, 'Name'), torch.load calls it",
}


#: What the scanner makes of one global.
Verdict = Literal["rebuilt", "opaque", "dangerous"]
#: What the scanner makes of one file.
FileStatus = Literal["clean", "dangerous", "anomalous", "unreadable", "skipped", "error"]


@dataclass(frozen=True)
class GlobalRef:
    """A global a file names: where, through which opcode, and what it would be."""

    module: str
    name: str
    #: Offset of the opcode: inside ``member`` when set, else inside the file.
    offset: int
    opcode: str
    verdict: Verdict
    member: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class FileScan:
    path: str
    status: FileStatus
    layout: str | None = None
    pickles: int = 0
    globals: tuple[GlobalRef, ...] = ()
    anomalies: tuple[Anomaly, ...] = ()
    error: str | None = None
    hint: str | None = None  # what to do about ``error``

    @property
    def dangerous(self) -> tuple[GlobalRef, ...]:
        return tuple(g for g in self.globals if g.verdict == "dangerous")

    @property
    def exit_code(self) -> int:
        return {"dangerous": 1, "anomalous": 1, "unreadable": 2, "error": 2}.get(self.status, 0)


@dataclass(frozen=True)
class ScanReport:
    files: tuple[FileScan, ...] = field(default_factory=tuple)

    @property
    def exit_code(self) -> int:
        codes = {f.exit_code for f in self.files}
        return 1 if 1 in codes else 2 if 2 in codes else 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(("clean", "dangerous", "anomalous", "unreadable", "skipped",
                             "error"), 0)
        for f in self.files:
            out[f.status] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"format": "torchless-scan", "version": 1, "exit_code": self.exit_code,
                "summary": self.counts(),
                "files": [{**asdict(f), "dangerous": len(f.dangerous)} for f in self.files]}

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)


def scan(path: str | os.PathLike[str], *, strict: bool = False,
         limits: Limits | None = None, allow_globals: Iterable[str] = ()) -> ScanReport:
    """Scan one file or directory (recursively) without running anything it holds.

    ``strict`` counts every global outside the rebuild rules as dangerous; ``allow_globals``
    (exact ``module.name`` strings you trust) are not counted as dangerous; ``limits`` as for
    :func:`torchless.open`. Archive members' CRCs are always checked."""
    return scan_paths([path], strict=strict, limits=limits, allow_globals=allow_globals)


def scan_paths(paths: Iterable[str | os.PathLike[str]], *, strict: bool = False,
               limits: Limits | None = None, allow_globals: Iterable[str] = (),
               executor: Executor | None = None) -> ScanReport:
    """Scan several files or directories into one report (in the order given); with an
    ``executor`` (a process pool, a Dask cluster's executor …) files are scanned in it."""
    lim = limits or Limits()
    allow = frozenset(allow_globals)
    jobs: list[tuple[str, bool]] = []
    for given in paths:
        p = given if isinstance(given, str) and is_remote(given) else os.fspath(given)
        if not is_remote(p) and os.path.isdir(p):
            jobs.extend((f, False) for f in _walk(p))
        else:
            jobs.append((p, True))
    if executor is None:
        files = [_scan_file(f, strict, lim, allow, explicit=e) for f, e in jobs]
    else:
        files = list(executor.map(_scan_job, [f for f, _ in jobs], [e for _, e in jobs],
                                  [strict] * len(jobs), [lim] * len(jobs),
                                  [allow] * len(jobs)))
    return ScanReport(tuple(files))


def _scan_job(path: str, explicit: bool, strict: bool, limits: Limits,
              allow: frozenset[str]) -> FileScan:
    """One file (module level, so executors can run it in other processes)."""
    return _scan_file(path, strict, limits, allow, explicit=explicit)


def _walk(root: str) -> Iterator[str]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            if os.path.isfile(full):  # symlinked files too (the Hugging Face cache layout)
                yield full


def _scan_file(path: str, strict: bool, limits: Limits, allow: frozenset[str], *,
               explicit: bool) -> FileScan:
    try:
        return _scan_one(path, strict, limits, allow, explicit=explicit)
    except Exception as e:  # a bug of ours: no verdict on the file, and not "unreadable"
        bug = InternalError.wrap(e, "scanning")
        return FileScan(path, "error", error=bug.message, hint=bug.hint)


def _scan_one(path: str, strict: bool, limits: Limits, allow: frozenset[str], *,
              explicit: bool) -> FileScan:
    try:
        # a remote file is fetched whole: every byte of it is scanned
        source = RemoteSource(path) if is_remote(path) else Source(path)
    except CheckpointError as e:
        return FileScan(path, "unreadable", error=e.message, hint=e.hint)
    with source:
        state = _File(source, strict, limits, allow)
        try:
            layout = state.run()
        except (RecursionError, MemoryError) as e:  # pragma: no cover - defensive
            return FileScan(path, "unreadable", error=f"scanner gave up: {type(e).__name__}")
        except CheckpointError as e:  # what the content is, if not a checkpoint
            compressed = source.size > 0 and any(
                bytes(source.raw[:len(m)]) == m for m in _COMPRESSED)
            unread: FileStatus = "unreadable" if explicit or compressed else "skipped"
            return FileScan(path, unread, error=e.message, hint=e.hint)
        dangerous = any(g.verdict == "dangerous" for g in state.globals)
        status: FileStatus = ("dangerous" if dangerous else
                              "anomalous" if state.anomalies else "clean")
        return FileScan(path, status, layout, state.pickles, tuple(state.globals),
                        tuple(dict.fromkeys(state.anomalies)))


class _File:
    """The scan of one file: what has been found so far."""

    def __init__(self, source: Source, strict: bool, limits: Limits,
                 allow: frozenset[str] = frozenset()) -> None:
        self.source = source
        self.allow = allow
        self.buf: Any = source.raw
        self.size = source.size
        self.strict = strict
        self.limits = limits
        self.globals: list[GlobalRef] = []
        #: The containers' findings in report mode, and the scanner's own observations.
        self.findings = Findings("report")
        self.anomalies: list[Anomaly] = self.findings.anomalies
        self.pickles = 0
        self._verdicts: dict[tuple[str, str], tuple[Verdict, str]] = {}
        self._crcs: dict[tuple[int, int, int, int], int | None] = {}

    def flag(self, kind: str, message: str, member: str | None = None,
             offset: int | None = None) -> None:
        self.findings.note(kind, message, member, offset)

    # ---- verdicts ---------------------------------------------------------------------

    def verdict(self, g: FoundGlobal) -> tuple[Verdict, str]:
        if g.unresolved:
            return "dangerous", f"{g.opcode} whose name cannot be read statically ({g.unresolved})"
        if g.module == "copyreg.extension":
            return "dangerous", ("names a global through the loading process's copyreg "
                                 "extension registry")
        key = (g.module, g.name)
        if key not in self._verdicts:
            resolver = TorchResolver(self.limits, strict=self.strict, allow=self.allow)
            try:
                resolver.find_global(g.module, g.name, g.offset)
            except CheckpointError as e:
                self._verdicts[key] = ("dangerous", e.message)
            else:
                rec = resolver.globals[-1]
                if (rec.module, rec.name) in _ARGUMENT_DEPENDENT:
                    self._verdicts[key] = ("dangerous", _ARGUMENT_DEPENDENT[rec.module, rec.name])
                else:
                    self._verdicts[key] = (rec.verdict, "")
        return self._verdicts[key]

    # ---- pickles ----------------------------------------------------------------------

    def pickle(self, data: Any, start: int, end: int, member: str | None, what: str, *,
               tentative: bool = False, want_value: bool = False) -> StreamScan | None:
        """Scan one pickle; ``tentative``: bytes that merely might hold one (a member not
        named .pkl, data before or after an archive or a stream): report it only if
        :func:`_plausible`. None if the bytes were not walked at all."""
        if tentative and (start >= end or data[start] not in _PICKLE_START):
            return None
        result = scan_stream(data, start, end, self.limits, want_value=want_value)
        if tentative and not _plausible(result, data):
            return result  # not reported; a caller may still walk on after its STOP
        self.pickles += 1
        for g in result.globals:
            verdict, reason = self.verdict(g)
            self.globals.append(GlobalRef(g.module, g.name, g.offset, g.opcode, verdict,
                                          member, reason))
        for offset, message in result.problems:
            self.flag("limit" if result.limited and "max_" in message else "pickle",
                      f"{what} pickle: {message}", member, offset)
        return result

    def chain(self, data: Any, start: int, end: int, member: str | None, what: str) -> None:
        """Pickles one after another: anything after a STOP is scanned as another pickle."""
        pos = start
        for i in range(_MAX_CHAINED):
            result = self.pickle(data, pos, end, member, what, tentative=i > 0)
            if result is None or not result.stopped or result.end >= end:
                return
            if i == 0:
                self.flag("trailing", f"{end - result.end} bytes after the {what} pickle's STOP "
                          "(a loader reading pickles one after another would run them)",
                          member, result.end)
            pos = result.end

    # ---- layouts ----------------------------------------------------------------------

    def run(self) -> str:
        head = bytes(self.buf[:8]) if self.size else b""
        if head.startswith(b"\x93NUMPY"):
            return self.npy()
        zip_tail = has_zip_tail(self.source)
        try:
            layout: Layout | None = _detect(self.source)
        except NotACheckpointError:
            if not zip_tail and not self._looks_like_pickle():
                raise
            layout = None if zip_tail else Layout.PICKLE
        except CheckpointError:
            if not zip_tail:
                raise
            layout = None
        if layout is not None and layout is not Layout.ZIP and zip_tail:
            self.flag("polyglot", f"the file starts as a {layout.value} checkpoint and ends "
                      "with a ZIP archive: torch and ZIP readers load different content")
        if layout is Layout.LEGACY:
            self.legacy()
        elif layout is Layout.TAR:
            self.tar()
        elif layout is Layout.PICKLE:
            self.chain(self.buf, 0, self.size, None, "plain")
        if layout is Layout.ZIP or zip_tail:
            name = self.zip(skip_prefix=layout is not None and layout is not Layout.ZIP)
            return name if layout in (None, Layout.ZIP) else f"{layout.value}+zip"
        assert layout is not None
        return str(layout.value)

    def _looks_like_pickle(self) -> bool:
        """A file torch.load would hand to the unpickler although no magic matched."""
        return self.size > 0 and _is_pickle(self.buf[:_SNIFF], self.limits)

    def npy(self) -> str:
        buf = self.buf
        major = buf[6] if self.size > 7 else 0
        width = 2 if major == 1 else 4
        if self.size < 8 + width:
            self.flag("npy", "NumPy header cut short")
            return "npy"
        n = int.from_bytes(buf[8:8 + width], "little")
        header = bytes(buf[8 + width:8 + width + n]).decode("latin-1")
        start = 8 + width + n
        if "'O'" in header or "'|O'" in header:
            self.chain(buf, start, self.size, None, "NumPy object-array")
        return "npy"

    def legacy(self) -> None:
        """The legacy stream, walked by the reader's own functions in report mode."""
        read = self.reader(None, "legacy")
        header = read_header(read, self.findings)
        if header is None:
            return
        _, byteorder, pos = header
        obj = self.pickle(self.buf, pos, self.size, None, "legacy object", want_value=True)
        if obj is None or not obj.stopped:
            return
        got = read(obj.end, None, "storage keys", True)
        if got is None:
            return
        keys, pos = got
        declared = declared_storages(obj.pids, self.source, self.limits, byteorder,
                                     self.findings)
        walked = walk_storages(self.source, pos, keys, declared, byteorder, self.findings)
        if walked is not None and walked[1] < self.size:
            end = walked[1]
            self.flag("trailing", f"{self.size - end} bytes after the last storage", None, end)
            self.chain_tentative(end)

    def reader(self, member: str | None, layout: str) -> PickleReader:
        """The container walks' pickle reader: each pickle scanned and reported, its value
        from the inert run; None where the stream cannot be followed."""
        def read(pos: int, end: int | None, what: str, plain: bool) -> tuple[Any, int] | None:
            result = self.pickle(self.buf, pos, self.size if end is None else end, member,
                                 f"{layout} {what}", want_value=True)
            if result is None or not result.stopped:
                return None
            return result.value, result.end
        return read

    def chain_tentative(self, pos: int) -> None:
        for _ in range(_MAX_CHAINED):
            result = self.pickle(self.buf, pos, self.size, None, "trailing", tentative=True)
            if result is None or not result.stopped or result.end >= self.size:
                return
            pos = result.end

    # ---- ZIP --------------------------------------------------------------------------

    def zip(self, *, skip_prefix: bool) -> str:
        archive = ZipArchive(self.source, self.limits, mode="report")
        self.anomalies.extend(a for a in archive.anomalies
                              if not (skip_prefix and a.kind == "prefix"))
        for lo, hi in archive.loose:
            if not (skip_prefix and lo == 0):
                self.chain_region(lo, hi)
        members = [m for m in archive.members if not m.is_dir]
        for m in members:
            self.member(archive, m)
        names = [m.name for m in members if m.listed]
        pickles = [n for n in names if n.rsplit("/", 1)[-1] == "data.pkl"]
        if len(pickles) > 1:
            self.flag("torch", f"{len(pickles)} data.pkl records ({', '.join(pickles[:4])}): "
                      "readers pick different ones")
        prefixes = sorted({n.split("/", 1)[0] for n in names if "/" in n})
        if len(prefixes) > 1:
            self.flag("torch", f"members under {len(prefixes)} top-level directories "
                      f"({', '.join(prefixes[:4])}): several checkpoints in one archive")
        script = any(n.endswith("/constants.pkl") for n in names)
        code = any("/code/" in n for n in names)
        if script and not code:
            self.flag("torch", "constants.pkl without code/: a torch.save archive dressed as "
                      "TorchScript (loaders dispatch it to torch.jit.load)")
        return "torchscript" if script and code else "zip"

    def chain_region(self, lo: int, hi: int) -> None:
        pos = lo
        for _ in range(_MAX_CHAINED):
            result = self.pickle(self.buf, pos, hi, None, "unowned", tentative=True)
            if result is None or not result.stopped or result.end >= hi:
                return
            pos = result.end

    def member(self, archive: ZipArchive, m: Entry) -> None:
        is_pickle = m.name.endswith("pkl")  # data.pkl, constants.pkl, *.debug_pkl
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
        self._check_crc(archive, m, data)
        if not is_pickle:
            if not _is_pickle(data, self.limits):
                return
            if m.size > len(data):
                data, _ = archive.head(m, min(m.size, self.limits.max_pickle_bytes))
                if data is None:
                    return
        if is_pickle:
            self.chain(data, 0, min(len(data), m.size), m.name, "member")
        else:
            self.pickle(data, 0, len(data), m.name, "member", tentative=True)

    def _check_crc(self, archive: ZipArchive, m: Entry, head: bytes) -> None:
        if m.method == 8 and len(head) > m.size:
            self.flag("member", f"inflates to more than the {m.size} bytes declared", m.name,
                      m.data_offset)
            return
        if not archive.has_crc or m.method not in (0, 8) or not m.listed:
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
        """The TAR layout, walked by the reader's own functions in report mode."""
        archive = TarArchive(self.source, self.limits, mode="report")
        self.anomalies.extend(archive.anomalies)
        f = self.findings
        for dup in archive.duplicates:
            self.chain_region(dup.offset, dup.offset + dup.size)
        for name, m in archive.members.items():
            read = self.reader(name, "TAR")
            if name == "pickle":
                end = m.offset + m.size
                result = self.pickle(self.buf, m.offset, end, name, "TAR object")
                if result is not None and result.stopped:
                    check_object_end(result.end, m, f)
                    if result.end < end:
                        self.chain_region(result.end, end)
            elif name == "sys_info":
                read_sys_info(m, read, f)
            elif name == "storages":
                walk_tar_storages(self.source, m, read, self.limits, f)
            elif name == "tensors":
                walk_tensors(self.source, m, read, self.limits, f)
            else:
                self.chain_region(m.offset, m.offset + m.size)


def _is_pickle(head: Any, limits: Limits) -> bool:
    """Whether bytes that need not be a pickle (a member not named .pkl, data around an
    archive) are one: walked and run, they end at a STOP without a fault; or they open with
    PROTO and name a well-formed global before breaking (a payload in a broken stream).
    Tensor bytes pass neither test by chance, so real checkpoints raise no false alarm."""
    if not head or head[0] not in _PICKLE_START:
        return False
    probe = scan_stream(head, 0, len(head), limits)
    if not probe.stopped and probe.end >= len(head) and probe.globals:
        return True  # the sniffed window ends inside a stream that names globals
    return _plausible(probe, head)


def _plausible(result: StreamScan, data: Any) -> bool:
    """A stream worth reporting among bytes that need not be a pickle: it names a global,
    every name it reads inline is a well-formed dotted name (bytes that merely decode as a
    GLOBAL cannot be imported) and it is whole, or opens with PROTO and breaks after them."""
    if not result.globals or not all(
            g.unresolved or (_NAME.match(g.module) and _NAME.match(g.name))
            for g in result.globals):
        return False
    if result.stopped and not result.problems:
        return True
    start = result.start
    return data[start] == 0x80 and len(data) > start + 1 and 2 <= data[start + 1] <= 5


# ---- text ---------------------------------------------------------------------------------

_MARK = {"clean": "ok", "dangerous": "DANGER", "anomalous": "ANOMALY", "unreadable": "ERROR",
         "skipped": "skip", "error": "BUG"}


def format_table(report: ScanReport, *, verbose: bool = False) -> str:
    """A summary table: one line per file, then what made each flagged file flagged."""
    lines = [f"{'STATUS':<8} {'LAYOUT':<12} {'PICKLES':>7} {'GLOBALS':>7} {'DANGER':>6} "
             f"{'ANOMALY':>7}  PATH"]
    for f in report.files:
        if f.status == "skipped" and not verbose:
            continue
        lines.append(f"{_MARK[f.status]:<8} {f.layout or '-':<12} {f.pickles:>7} "
                     f"{len(f.globals):>7} {len(f.dangerous):>6} {len(f.anomalies):>7}  {f.path}")
        if f.error:
            lines.append(f"    error: {f.error}")
            if f.hint and f.status in ("unreadable", "error"):
                lines.append(f"    hint: {f.hint}")
        shown = f.globals if verbose else f.dangerous
        for g in shown:
            where = f"{g.member}@{g.offset}" if g.member else f"@{g.offset}"
            why = f": {g.reason}" if g.reason else ""
            lines.append(f"    {g.verdict:<9} {g.module}.{g.name} ({g.opcode} {where}){why}")
        for a in f.anomalies:
            where = f" [{a.member}]" if a.member else ""
            at = f" @{a.offset}" if a.offset is not None else ""
            lines.append(f"    anomaly   {a.kind}{where}{at}: {a.message}")
    c = report.counts()
    lines.append(f"{len(report.files)} files: {c['clean']} clean, {c['dangerous']} dangerous, "
                 f"{c['anomalous']} anomalous, {c['unreadable']} unreadable, "
                 f"{c['skipped']} skipped"
                 + (f", {c['error']} internal errors (torchless bugs)" if c["error"] else ""))
    return "\n".join(printable(line) for line in lines) + "\n"
