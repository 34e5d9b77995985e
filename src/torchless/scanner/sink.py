"""The scanner's side of the region protocol (:mod:`torchless.containers.regions`): which
layout's walk a file gets, and what is done with the regions the walk hands back.

The layout is found the reader's way (:func:`~torchless.containers.registry.sniff_file`) and
the registered layout's own region walk runs with the scan as its sink; the scanner only adds
what a reader refuses outright and a scanner must walk on through: a file that is two layouts
at once (a polyglot: the other layout's walk runs too), bytes no magic matches that torch
would still unpickle, and a NumPy object array (``numpy.load`` unpickles it; no torch layout).
Pickles go to the pickle pass (``scanner.files._File.pickle``), TorchScript code to
:func:`.script.script_calls`, nested files to a scan of their own whose findings are merged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from torchless.containers import registry
from torchless.containers.base import npy_regions
from torchless.containers.regions import SNIFF, PickleRun
from torchless.containers.zipregions import zip_regions
from torchless.core.findings import Anomaly, Findings
from torchless.core.limits import Limits
from torchless.errors import CheckpointError, NotACheckpointError
from torchless.io.detect import has_zip_tail, looks_like_safetensors, tar_polyglot
from torchless.io.source import Source
from torchless.scanner.pickles import NOT_AN_OPCODE, PICKLE_START, looks_like_pickle, scan_stream
from torchless.scanner.report import Action, GlobalRef

__all__ = ["RegionScan"]


class RegionScan:
    """The sink half of the scan of one file (see ``scanner.files._File``)."""

    source: Source
    buf: Any
    size: int
    limits: Limits
    findings: Findings
    anomalies: list[Anomaly]
    globals: list[GlobalRef]
    #: Every action torch.load would take (a nested file's too, once merged).
    actions: list[Action]
    #: The operators the TorchScript code in the file calls (:mod:`.script`).
    script_ops: list[str]
    pickles: int
    #: How many archives this file lies inside (0: a file of its own).
    depth: int
    #: Check the CRC-32 of every member, tensor data included (else of those read whole).
    verify_crc: bool

    def spawn(self, source: Source) -> RegionScan:  # pragma: no cover - _File defines it
        """The scan of a file stored inside this one."""
        raise NotImplementedError

    def pickle(self, data: Any, start: int, end: int, member: str | None, what: str, *,
               tentative: bool = False, want_value: bool = False, pids: str = "storage",
               plain: bool = False,
               returned: bool = True) -> PickleRun | None:  # pragma: no cover - _File's
        raise NotImplementedError

    def chain(self, data: Any, start: int, end: int, member: str | None, what: str, *,
              tentative: bool = False,
              plain: bool = False) -> None:  # pragma: no cover - _File defines it
        raise NotImplementedError

    def run(self) -> str:
        """Walk the file's regions; returns its layout's name."""
        source, limits = self.source, self.limits
        head = bytes(self.buf[:8]) if self.size else b""
        if head.startswith(b"\x93NUMPY"):
            return npy_regions(source, limits, self)
        if looks_like_safetensors(bytes(self.buf[:16]), self.size):
            return self._safetensors()
        zip_tail = has_zip_tail(source)
        try:
            layout: registry.FileLayout | None = registry.sniff_file(source)
        except NotACheckpointError:
            if not zip_tail and not self._looks_like_pickle():
                raise
            layout = None if zip_tail else registry.file_layout("pickle")
        except CheckpointError:
            if not zip_tail:
                raise
            layout = None
        if layout is not None and layout.name != "zip" and zip_tail:
            self.flag("polyglot", f"the file starts as a {layout.name} checkpoint and ends "
                      "with a ZIP archive: torch and ZIP readers load different content")
        tar_too = tar_polyglot(bytes(self.buf[:512]), self.size)
        if tar_too is not None:
            self.flag("polyglot", f"the file is both a TAR archive and {tar_too}: torch.load "
                      "reads the TAR archive, other readers the rest")
            tar = registry.file_layout("tar")
            if layout is tar:
                layout = registry.file_layout(
                    "zip" if tar_too.endswith("ZIP archive") else
                    "legacy" if "legacy" in tar_too else "pickle")
            tar.regions(source, limits, self)
        if layout is None:  # a ZIP archive found by its end records alone
            name = zip_regions(source, limits, self)
        else:
            name = layout.regions(source, limits, self)
            if zip_tail and layout.name != "zip":
                zip_regions(source, limits, self, skip_prefix=True)
                name = f"{name}+zip"
        return f"tar+{name}" if tar_too is not None else name

    def _looks_like_pickle(self) -> bool:
        """A file torch.load would hand to the unpickler although no magic matched."""
        return self.size > 0 and looks_like_pickle(self.buf[:SNIFF], self.limits)

    # ---- the region sink --------------------------------------------------------------

    def _safetensors(self) -> str:
        """A safetensors file (an inert one too, which torchless writes): no pickle, nothing
        a loader runs. Its header is checked as the reader checks it (JSON nested within the
        limit, known dtypes, byte ranges that tile the data with no holes or overlaps); one
        that does not pass is an anomaly, so the file is never clean."""
        from torchless.write.safetensors import read_header

        try:
            read_header(self.buf, self.limits.max_depth)
        except CheckpointError as e:
            self.flag("safetensors", f"the safetensors header does not check out: "
                      f"{e.message}", None, e.offset)
        return "safetensors"

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
                probe.problems and NOT_AN_OPCODE.search(probe.problems[-1][1]):
            return probe.problems[-1]
        return None

    #: Characters of TorchScript code this file's scan has parsed (:meth:`code`).
    _code_used: int = 0

    def code(self, member: str, data: bytes) -> None:
        """The operators TorchScript code refers to: file and network access is dangerous;
        an operator or class from a native library outside torch, a name no allowlist vets,
        or code that does not parse an anomaly (:mod:`.script`). Past
        :data:`~.script.MAX_CODE_TOTAL` characters of code in one archive, the rest is not
        parsed (a ``limit`` anomaly, once)."""
        # imported here: a scan of a file with no TorchScript code does not load the parser
        from torchless.scanner.script import MAX_CODE_BYTES, MAX_CODE_TOTAL, script_calls

        if self._code_used > MAX_CODE_TOTAL:
            return
        text = data.decode("utf-8", "replace")
        self._code_used += min(len(text), MAX_CODE_BYTES)
        if self._code_used > MAX_CODE_TOTAL:
            self.flag("limit", f"more than {MAX_CODE_TOTAL} characters of TorchScript "
                      "code: the rest is not scanned", member)
            return
        for call in script_calls(text):
            if call.problem:
                self.flag("script", f"TorchScript code that cannot be vetted: "
                          f"{call.problem}", member, call.offset)
                continue
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
            elif call.unvetted:
                self.flag("script", f"TorchScript code refers to {call.op}, which no "
                          "allowlist vets: what it does is not known to compute only "
                          "on tensors", member, call.offset)

    def nested(self, source: Source) -> NestedScan:
        sub = self.spawn(source)
        try:
            return NestedScan(self, sub, sub.run(), None)
        except CheckpointError as e:
            return NestedScan(self, sub, None, e)


@dataclass
class NestedScan:
    """The scan of a file inside another (:meth:`RegionScan.nested`)."""

    root: RegionScan
    sub: RegionScan
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
        root.actions.extend(dataclasses.replace(a, member=inside(a.member))
                            for a in sub.actions)
        root.script_ops.extend(op for op in sub.script_ops if op not in root.script_ops)
        cut = sub.findings.truncated
        if cut is not None:
            root.flag("truncated", cut.message, where, cut.offset)
