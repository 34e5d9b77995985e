"""``torchless scan``: every global and every container trick in a file, without running it.

The reader refuses a file at its first problem; a scanner must instead report everything a
loader could be made to do. For each file (directories are walked recursively) the layout is
found from the content, never the name, and then:

* every pickle is walked opcode by opcode (:mod:`.pickles`): all members of a ZIP archive
  (not only ``data.pkl``; other members when their bytes are a pickle), the five pickles of a
  legacy stream and whatever follows its storages, each pickle of a TAR checkpoint, plain
  pickles and every pickle concatenated after them, the object array of a ``.npy`` file, and
  the bytes before, between and after the members of an archive;
* each global gets a verdict from the reader's own tables (:class:`~torchless.rules.resolver.
  TorchResolver`, which applies the rebuild rules and the policy): ``rebuilt`` (a rule rebuilds
  it), ``opaque`` (a class kept as inert data) or ``dangerous`` (calling or importing it could
  run code, touch files, processes or the network; or its name cannot be read statically);
* container anomalies that make scanners and torch see different files are listed: the
  reader's own ZIP, TAR and legacy parsers run in report mode, each registered layout's
  region walk beside its reader (:mod:`torchless.containers.regions`, dispatched by
  :mod:`.sink`), so that whatever the reader refuses the scanner reports; the pickle pass
  reports broken streams.

A Hugging Face index file (``*.index.json`` with a ``weight_map``) is JSON, which runs
nothing: it scans ``clean`` when every shard it names is there, ``unreadable`` naming those
that are missing; named explicitly, its shards are scanned after it (:func:`index_scan`).

Status of a file: ``dangerous`` (a dangerous global), ``anomalous`` (an anomaly, no dangerous
global), ``clean``, ``unreadable`` (cannot be opened or is not a checkpoint but was named
explicitly, or is a compressed container that may hide one), or ``skipped`` (met while walking
a directory and not a checkpoint: text, images, safetensors …), or ``error`` (the scanner met
a bug of its own on the file: no verdict; the error says "internal error" and the hint asks
for a report). Exit code: 1 if any file is dangerous or anomalous, else 2 if any is
unreadable or met an error, else 0.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from torchless.containers import registry
from torchless.containers.base import ARCHIVE_OF_FILES
from torchless.containers.pt2 import MemberSource
from torchless.containers.regions import EACH_FILE
from torchless.core.collector import collector_paused
from torchless.core.findings import Anomaly, Findings
from torchless.core.limits import Limits, allowing_download
from torchless.errors import CheckpointError, InternalError, TruncatedInputError, error_boundary
from torchless.io.detect import starts_as_json_object
from torchless.io.remote import RemoteSource, is_remote
from torchless.io.source import Source
from torchless.rules.resolver import TorchResolver
from torchless.scanner.pickles import (
    MAX_CHAINED,
    PICKLE_START,
    RUNS_OUT,
    FoundGlobal,
    StreamScan,
    plausible,
    scan_stream,
)
from torchless.scanner.plain import HEADERS
from torchless.scanner.report import (
    SEVERITY_ORDER,
    Action,
    FileScan,
    FileStatus,
    GlobalRef,
    ScanReport,
    Severity,
    Verdict,
    format_table,
    new_global_ref,
)
from torchless.scanner.sink import RegionScan

if TYPE_CHECKING:
    from concurrent.futures import Executor

__all__ = ["Anomaly", "FileScan", "FileStatus", "GlobalRef", "ScanReport", "Verdict",
           "format_table", "index_scan", "index_shards", "scan", "scan_paths"]

#: The limits of a scan that names none (a frozen dataclass: shared by every scan).
_LIMITS = Limits()
#: Whether the reader has a rebuild rule for a (module, name) as a file spells it: a
#: function of the name alone (the rule tables), kept for every scan of this process, up to
#: :data:`_KNOWN_MAX` names (a hostile file may name millions).
_KNOWN: dict[tuple[str, str], bool] = {}
_KNOWN_MAX = 4096
_RESOLVER = TorchResolver(_LIMITS)
#: Files up to this size are read whole rather than mapped (most checkpoints a scan meets
#: are small: a map's set-up, page faults and unmap cost more than the copy).
_COPY_BELOW = 256 << 10

_COMPRESSED = (b"\x1f\x8b", b"7z\xbc\xaf\x27\x1c", b"BZh", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd",
               b"Rar!")


def scan(path: str | os.PathLike[str], *, strict: bool = False,
         limits: Limits | None = None, allow_globals: Iterable[str] = (),
         verify_crc: bool = False, allow_full_download: bool = False) -> ScanReport:
    """Scan one file or directory (recursively) without running anything it holds.

    ``strict`` counts every global outside the rebuild rules as dangerous; ``allow_globals``
    (exact ``module.name`` strings you trust) are not counted as dangerous; ``limits`` as for
    :func:`torchless.open`. The CRC-32 of every archive member that is a pickle, that reads
    as one or that is read whole anyway (up to 64 KiB) is checked; ``verify_crc`` checks
    tensor data members too (reading every byte of the file); ``allow_full_download`` as
    for :func:`torchless.open` (a remote file is scanned whole in any case)."""
    return scan_paths([path], strict=strict, limits=allowing_download(
        limits, allow_full_download), allow_globals=allow_globals, verify_crc=verify_crc)


def scan_paths(paths: Iterable[str | os.PathLike[str]], *, strict: bool = False,
               limits: Limits | None = None, allow_globals: Iterable[str] = (),
               executor: Executor | None = None, verify_crc: bool = False,
               progress: Callable[[int, int], None] | None = None) -> ScanReport:
    """Scan several files or directories into one report (in the order given); with an
    ``executor`` (a process pool, a Dask cluster's executor …) files are scanned in it.
    ``progress(files_done, files_total)`` is called as each file's scan is in (directories
    are walked first, so the total is known)."""
    lim = limits or _LIMITS
    allow = frozenset(allow_globals)
    jobs: list[tuple[str, bool, bool]] = []  # (path, named explicitly, a DCP directory)
    for given in paths:
        p = given if isinstance(given, str) else os.fspath(given)
        if not is_remote(p) and os.path.isdir(p):
            if _is_unit(p):
                jobs.append((p, True, True))
            else:
                jobs.extend((f, False, not is_file) for f, is_file in _walk(p))
        else:
            jobs.append((p, True, False))
            jobs.extend((shard, True, False) for shard in index_shards(p, lim))
    jobs = list({j[0]: j for j in reversed(jobs)}.values())[::-1]  # each path once, first
    if executor is None:
        results: Iterable[FileScan] = (
            _scan_file(f, strict, lim, allow, explicit=e, verify_crc=verify_crc, unit=u)
            for f, e, u in jobs)
    else:
        results = executor.map(_scan_job, [f for f, _, _ in jobs], [e for _, e, _ in jobs],
                               [strict] * len(jobs), [lim] * len(jobs), [allow] * len(jobs),
                               [verify_crc] * len(jobs), [u for _, _, u in jobs])
    files: list[FileScan] = []
    for result in results:
        files.append(result)
        if progress is not None:
            progress(len(files), len(jobs))
    return ScanReport(tuple(files))


def _scan_job(path: str, explicit: bool, strict: bool, limits: Limits,
              allow: frozenset[str], verify_crc: bool = False,
              unit: bool | None = None) -> FileScan:
    """One file (module level, so executors can run it in other processes)."""
    return _scan_file(path, strict, limits, allow, explicit=explicit, verify_crc=verify_crc,
                      unit=unit)


def _is_unit(path: str) -> bool:
    """A directory that is one checkpoint (DCP), scanned as one item."""
    found = registry.sniff_directory(path)
    return found is not None and found.regions != EACH_FILE


def _walk(root: str) -> Iterator[tuple[str, bool]]:
    """(path, whether it is a file) of every file and DCP directory under ``root``."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        units = [d for d in dirnames if _is_unit(os.path.join(dirpath, d))]
        yield from ((os.path.join(dirpath, d), False) for d in units)
        dirnames[:] = [d for d in dirnames if d not in units]
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            if os.path.isfile(full):  # symlinked files too (the Hugging Face cache layout)
                yield full, True


def _scan_file(path: str, strict: bool, limits: Limits, allow: frozenset[str], *,
               explicit: bool, verify_crc: bool = False, unit: bool | None = None) -> FileScan:
    try:
        # what a file's scan builds dies with it (the runs of its pickles, their actions):
        # the collector's passes during it found nothing to free and were a fifth of a scan
        with error_boundary("scanning", max_depth=limits.max_depth), collector_paused():
            return _scan_one(path, strict, limits, allow, explicit=explicit,
                             verify_crc=verify_crc, unit=unit)
    except InternalError as bug:  # a bug of ours: no verdict on the file, not "unreadable"
        return FileScan(path, "error", error=bug.message, hint=bug.hint)
    except CheckpointError as e:  # out of memory, or the system failed us
        return FileScan(path, "unreadable", error=e.message, hint=e.hint)


def _scan_one(path: str, strict: bool, limits: Limits, allow: frozenset[str], *,
              explicit: bool, verify_crc: bool = False, unit: bool | None = None) -> FileScan:
    """``unit``: whether ``path`` is a DCP directory (None: not known yet)."""
    if unit if unit is not None else not is_remote(path) and os.path.isdir(path):
        return _scan_directory(path, _File(MemberSource(path, b""), strict, limits, allow, -1,
                                           verify_crc=verify_crc))
    try:
        # a remote file is fetched whole: every byte of it is scanned
        source = RemoteSource(path, max_download=limits.max_download_bytes) if is_remote(
            path) else Source(path, copy_below=_COPY_BELOW)
    except CheckpointError as e:
        return FileScan(path, "unreadable", error=e.message, hint=e.hint)
    with source:
        state = _File(source, strict, limits, allow, verify_crc=verify_crc)
        try:
            layout = state.run()
        except (RecursionError, MemoryError) as e:  # pragma: no cover - defensive
            return FileScan(path, "unreadable", error=f"scanner gave up: {type(e).__name__}")
        except CheckpointError as e:  # what the content is, if not a checkpoint
            index = index_scan(path, limits)
            if index is not None:
                return index
            compressed = (source.size > 0 and any(
                bytes(source.raw[:len(m)]) == m for m in _COMPRESSED)
            ) or e.message.startswith(ARCHIVE_OF_FILES)  # it may hide checkpoints
            unread: FileStatus = "unreadable" if explicit or compressed else "skipped"
            return FileScan(path, unread, error=e.message, hint=e.hint)
        return _file_scan(path, layout, state)


def _file_scan(path: str, layout: str, state: _File) -> FileScan:
    """The verdict on what a scan found (a file's, or a directory's that is one item): the
    worst of its actions and names, its anomalies, or unreadable when it is cut short (torch
    cannot read it either) and nothing in it is dangerous."""
    severities = {a.severity for a in state.actions} | {
        g.verdict for g in state.globals if g.verdict in ("dangerous", "unvetted")}
    dangerous = "dangerous" in severities
    cut = state.findings.truncated
    if not dangerous and cut is not None:  # torch cannot read it either
        return FileScan(path, "unreadable", layout, state.pickles, tuple(state.globals),
                        tuple(dict.fromkeys(state.anomalies)), error=cut.message,
                        hint=cut.hint, script_ops=tuple(state.script_ops),
                        actions=tuple(state.actions))
    status: FileStatus = ("dangerous" if dangerous else
                          "anomalous" if state.anomalies else
                          "unvetted" if "unvetted" in severities else "clean")
    return FileScan(path, status, layout, state.pickles, tuple(state.globals),
                    tuple(dict.fromkeys(state.anomalies)),
                    script_ops=tuple(state.script_ops), actions=tuple(state.actions))


def _scan_directory(path: str, root: _File) -> FileScan:
    """A directory that is one checkpoint, walked by its layout's regions walk; ``root``
    gathers the findings (its files are files of their own: depth 0)."""
    layout = registry.sniff_directory(path)
    if layout is None or layout.regions == EACH_FILE:
        return FileScan(path, "unreadable", error="no registered layout reads the directory "
                        "as one checkpoint")
    try:
        name = layout.regions(path, root.limits, root)
    except CheckpointError as e:
        return FileScan(path, "unreadable", layout.name, error=e.message, hint=e.hint)
    return _file_scan(path, name, root)


class _File(RegionScan):
    """The scan of one file: what has been found so far."""

    def __init__(self, source: Source, strict: bool, limits: Limits,
                 allow: frozenset[str] = frozenset(), depth: int = 0, *,
                 verify_crc: bool = False) -> None:
        self.source = source
        self.depth = depth
        self.verify_crc = verify_crc
        self.allow = allow
        self.buf: Any = source.raw
        self.size = source.size
        self.strict = strict
        self.limits = limits
        self.globals: list[GlobalRef] = []
        self.script_ops: list[str] = []
        self.actions: list[Action] = []
        #: The containers' findings in report mode, and the scanner's own observations.
        self.findings = Findings("report")
        self.anomalies: list[Anomaly] = self.findings.anomalies
        self.pickles = 0

    def spawn(self, source: Source) -> _File:
        return _File(source, self.strict, self.limits, self.allow, self.depth + 1,
                     verify_crc=self.verify_crc)

    # ---- verdicts ---------------------------------------------------------------------

    def verdict(self, g: FoundGlobal, severity: Severity) -> tuple[Verdict, str]:
        """A name's verdict: the worst severity of the actions it takes part in; a vetted
        name is ``rebuilt`` when the reader has a rule for it, else ``opaque``."""
        if severity == "dangerous":
            return "dangerous", ""
        if severity == "unvetted":
            return ("dangerous", "strict mode: not vetted") if self.strict else ("unvetted", "")
        known = _KNOWN.get((g.module, g.name))
        if known is None:
            try:
                known = _RESOLVER.known(g.module, g.name, g.offset)
            except CheckpointError:
                known = False
            if len(_KNOWN) < _KNOWN_MAX:
                _KNOWN[g.module, g.name] = known
        return ("rebuilt", "") if known else ("opaque", "")

    def judged(self, action: Action) -> Action:
        """The action as this scan reports it: ``allow_globals`` vets an unvetted target (the
        user trusts their own package) but never a dangerous one, which the report names as
        allowed (allowing lets the reader read the file; what loading it with torch would
        run stays what it is); strict mode counts an unvetted one as dangerous."""
        if action.severity == "vetted":
            return action
        if action.target.removesuffix(".__new__") in self.allow:
            if action.severity == "dangerous":
                return replace(action, reason=f"allowed by the caller (allow_globals), and "
                               f"still dangerous: {action.reason}")
            return replace(action, severity="vetted", reason="allowed by the caller "
                           "(allow_globals)")
        if action.severity == "unvetted" and self.strict:
            return replace(action, severity="dangerous", reason=f"strict mode: "
                           f"{action.reason}")
        return action

    # ---- pickles ----------------------------------------------------------------------

    def pickle(self, data: Any, start: int, end: int, member: str | None, what: str, *,
               tentative: bool = False, want_value: bool = False,
               pids: str = "storage", plain: bool = False,
               returned: bool = True) -> StreamScan | None:
        """Scan one pickle; ``tentative``: bytes that merely might hold one (a member not
        named .pkl, data before or after an archive or a stream): report it only if
        :func:`.pickles.plausible`; ``pids``: what the loader's persistent_load makes of an
        id; ``plain``: torch reads it with plain ``pickle.load``
        (:mod:`torchless.rules.findclass`); ``returned``: its value reaches the program
        (every callable in it counts as called). None if the bytes were not walked at all."""
        if tentative and (start >= end or data[start] not in PICKLE_START):
            return None
        result = scan_stream(data, start, end, self.limits, want_value=want_value,
                             member=member, pids=pids, plain=plain, returned=returned,
                             header=what if want_value and what in HEADERS else "")
        if tentative and not plausible(result, data):
            return result  # not reported; a caller may still walk on after its STOP
        self.pickles += 1
        actions = result.actions
        if self.allow or self.strict:
            actions = [self.judged(a) for a in actions]
        self.actions.extend(actions)
        worst: dict[int, Severity] = {}
        reasons: dict[int, str] = {}
        if any(a.severity != "vetted" for a in actions):  # else every name is vetted
            order = SEVERITY_ORDER
            for a in actions:
                if a.origin is not None and order[a.severity] >= order[worst.get(a.origin,
                                                                                   "vetted")]:
                    if a.origin not in reasons or order[a.severity] > order[worst[a.origin]]:
                        reasons[a.origin] = a.reason
                    worst[a.origin] = a.severity
        known = _KNOWN
        for g in result.globals:
            severity = worst.get(g.offset, "vetted") if worst else "vetted"
            rebuilt = known.get((g.module, g.name)) if severity == "vetted" else None
            if rebuilt is not None:  # self.verdict's answer, from its cache
                verdict: Verdict = "rebuilt" if rebuilt else "opaque"
            else:
                verdict, _ = self.verdict(g, severity)
            reason = reasons.get(g.offset, "") if verdict in ("dangerous", "unvetted") else ""
            self.globals.append(new_global_ref(g.module, g.name, g.offset, g.opcode,
                                               verdict, member, reason))
        for offset, message in result.problems:
            self.flag("limit" if result.limited and "max_" in message else "pickle",
                      f"{what} pickle: {message}", member, offset)
        if (member is None and not tentative and end >= self.size and not result.stopped
                and not result.limited and result.problems
                and RUNS_OUT.search(result.problems[-1][1])
                and self.findings.truncated is None):
            self.findings.truncated = TruncatedInputError(
                f"the {what} pickle runs to the end of the file without its STOP opcode: "
                "the file is cut short", offset=result.problems[-1][0])
        return result

    def chain(self, data: Any, start: int, end: int, member: str | None, what: str, *,
              tentative: bool = False, plain: bool = False) -> None:
        """Pickles one after another: anything after a STOP is scanned as another pickle;
        ``tentative``: the first too may be none (bytes no layout owns); ``plain``: as torch's
        plain ``pickle.load`` passes read them."""
        pos = start
        for i in range(MAX_CHAINED):
            result = self.pickle(data, pos, end, member, what, tentative=tentative or i > 0,
                                 plain=plain)
            if result is None or not result.stopped or result.end >= end:
                return
            if i == 0 and not tentative:
                self.flag("trailing", f"{end - result.end} bytes after the {what} pickle's STOP "
                          "(a loader reading pickles one after another would run them)",
                          member, result.end)
            pos = result.end


# ---- Hugging Face index files (model.safetensors.index.json, pytorch_model.bin.index.json)

def _may_be_index(path: str) -> bool:
    """False for a file whose first bytes rule out an index (what :func:`torchless.reader.
    formats.sniff` checks first), read without mapping the file; True when it may be one or
    cannot be read (the index reader then says why)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    except OSError:
        return True
    try:
        head = os.read(fd, 512)
    except OSError:
        return True
    finally:
        os.close(fd)
    return starts_as_json_object(head)


def _index_map(path: str, limits: Limits) -> dict[str, str] | None:
    """An index file's weight_map (its shard names checked to be plain file names), None
    for a file that is no index; the index's own errors are raised."""
    if is_remote(path) or not _may_be_index(path):
        return None
    from torchless.reader import formats  # here: the index reader only for what may be one

    with Source(path) as source:
        if formats.sniff(source) != "index":
            return None
        return formats.read_index(source, limits)[0]


def index_shards(path: str, limits: Limits) -> list[str]:
    """The shard files an index file names that exist beside it, in the order first named
    (none for a file that is no index, or an index that cannot be read: its scan says so)."""
    try:
        wmap = _index_map(path, limits)
    except CheckpointError:
        return []
    if not wmap:
        return []
    folder = os.path.dirname(path)
    shards = (os.path.join(folder, s) for s in dict.fromkeys(wmap.values()))
    return [s for s in shards if os.path.isfile(s)]


def index_scan(path: str, limits: Limits) -> FileScan | None:
    """The scan of an index file: JSON that runs nothing, ``clean`` when every shard it
    names is there (the shards are scanned as files of their own), ``unreadable`` naming the
    shards that are missing or when it cannot be read; None for a file that is no index."""
    try:
        wmap = _index_map(path, limits)
    except CheckpointError as e:
        return FileScan(path, "unreadable", "index", error=f"the index cannot be read: "
                        f"{e.message}", hint=e.hint)
    if wmap is None:
        return None
    folder = os.path.dirname(path)
    shards = list(dict.fromkeys(wmap.values()))
    missing = [s for s in shards if not os.path.isfile(os.path.join(folder, s))]
    if missing:
        return FileScan(path, "unreadable", "index", error=(
            f"the index names {len(shards)} shard files, {len(missing)} of them missing: "
            + ", ".join(missing[:10]) + (f" … {len(missing) - 10} more" if len(missing) > 10
                                         else "")),
            hint="the download is incomplete: fetch the missing shards (all from one "
                 "revision) and scan again")
    return FileScan(path, "clean", "index")
