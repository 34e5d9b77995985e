"""What ``torchless scan`` reports: per file a status, the globals its pickles name and the
anomalies of its container, and the whole report as JSON or as a table."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from torchless.core.findings import Anomaly
from torchless.core.text import printable

__all__ = ["FileScan", "FileStatus", "GlobalRef", "ScanReport", "Verdict", "format_table"]

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
    #: The operators the file's TorchScript code calls, in the order first met.
    script_ops: tuple[str, ...] = ()

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
