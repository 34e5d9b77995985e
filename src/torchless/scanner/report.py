"""What ``torchless scan`` reports: per file a status, the globals its pickles name and the
anomalies of its container, and the whole report as JSON or as a table."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from torchless.core.findings import Anomaly
from torchless.core.text import printable

__all__ = ["Action", "ActionGroup", "ActionKind", "FileScan", "FileStatus", "GlobalRef",
           "ScanReport", "Verdict", "action_groups", "format_table"]

#: What the scanner makes of one global: vetted names are ``rebuilt`` (the reader has a rule
#: for them) or ``opaque`` (kept as an inert record), the others ``unvetted`` or ``dangerous``.
Verdict = Literal["rebuilt", "opaque", "unvetted", "dangerous"]
#: What the scanner makes of one file.
FileStatus = Literal["clean", "dangerous", "anomalous", "unvetted", "unreadable", "skipped",
                     "error"]
#: What one action of the execution model is.
ActionKind = Literal["import", "call", "build", "update"]
#: How one action of the execution model is judged (see torchless.rules.allowlist).
Severity = Literal["vetted", "unvetted", "dangerous"]
#: The severities from least to most severe.
SEVERITY_ORDER: dict[str, int] = {"vetted": 0, "unvetted": 1, "dangerous": 2}


@dataclass(frozen=True)
class Action:
    """One thing ``torch.load(weights_only=False)`` would do: ``import`` a name, ``call`` a
    callable (``X.__new__`` for NEWOBJ), ``build`` (``__setstate__``/``__setattr__``) or
    ``update`` (``append``/``__setitem__``) an object. Vetted actions of one kind and target
    are listed once, with their ``count``."""

    kind: ActionKind
    target: str
    severity: Severity
    reason: str
    #: Offset of the opcode (inside ``member`` when set, else inside the file).
    offset: int
    opcode: str
    #: The arguments, where the file spells them out (a short rendering).
    args: str | None = None
    #: Offset of the GLOBAL/STACK_GLOBAL/INST that named what acts, if one did.
    origin: int | None = None
    member: str | None = None
    count: int = 1

    def counted(self, n: int) -> Action:
        """The action with ``count`` n (its fields copied, as :func:`new_action` makes one:
        ``dataclasses.replace`` was a few per cent of a small file's scan)."""
        a = _new(Action)
        a.__dict__.update(self.__dict__, count=n)
        return a

    def at(self, base: int, member: str | None) -> Action:
        """The action with offsets moved by ``base`` inside ``member``."""
        a = _new(Action)
        a.__dict__.update(self.__dict__, offset=self.offset + base, member=member,
                          origin=None if self.origin is None else self.origin + base)
        return a


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
    #: Every action torch.load would take (vetted ones once per kind and target).
    actions: tuple[Action, ...] = ()

    @property
    def dangerous(self) -> tuple[GlobalRef, ...]:
        return tuple(g for g in self.globals if g.verdict == "dangerous")

    @property
    def unvetted(self) -> tuple[GlobalRef, ...]:
        return tuple(g for g in self.globals if g.verdict == "unvetted")

    @property
    def exit_code(self) -> int:
        return _EXIT.get(self.status, 0)


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
        out = dict.fromkeys(("clean", "dangerous", "anomalous", "unvetted", "unreadable",
                             "skipped", "error"), 0)
        for f in self.files:
            out[f.status] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"format": "torchless-scan", "version": 1, "exit_code": self.exit_code,
                "summary": self.counts(),
                "files": [{**asdict(f), "dangerous": len(f.dangerous),
                           "groups": [{**asdict(g), "text": g.describe()}
                                      for g in action_groups(f)]} for f in self.files]}

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)


#: Exit code of a file by its status (0 for the others).
_EXIT = {"dangerous": 1, "anomalous": 1, "unvetted": 1, "unreadable": 2, "error": 2}
_new = object.__new__


# A frozen dataclass's own __init__ sets each field through object.__setattr__: three times
# the cost of filling the instance's dict, and building these records was a sixth of the scan
# of a small checkpoint. The scanner's hot paths make them here; the objects are the same
# (equal, hashed and frozen alike: tests/scanner/test_scan_records.py).

#: Characters of a name a report shows: a file can name one long name (a memoised string)
#: thousands of times in a few bytes each, and a report repeating it in full grew with the
#: product (a 220 KB file, a 2.6 GB JSON report).
_NAME_SHOWN = 256


def _shown(text: str) -> str:
    """``text``, or its start and its length when longer than a report shows."""
    if len(text) <= _NAME_SHOWN:
        return text
    return f"{text[:_NAME_SHOWN]}…({len(text)} characters)"


def new_action(kind: ActionKind, target: str, severity: Severity, reason: str, offset: int,
               opcode: str, args: str | None, origin: int | None,
               member: str | None) -> Action:
    """``Action(kind, target, …, member)`` (``count`` 1)."""
    a = _new(Action)
    d = a.__dict__
    d["kind"] = kind
    d["target"] = target if len(target) <= _NAME_SHOWN else _shown(target)
    d["severity"] = severity
    d["reason"] = reason if len(reason) <= 4 * _NAME_SHOWN else _shown(reason)
    d["offset"] = offset
    d["opcode"] = opcode
    d["args"] = args
    d["origin"] = origin
    d["member"] = member
    d["count"] = 1
    return a


def new_global_ref(module: str, name: str, offset: int, opcode: str, verdict: Verdict,
                   member: str | None, reason: str) -> GlobalRef:
    """``GlobalRef(module, name, offset, opcode, verdict, member, reason)``."""
    g = _new(GlobalRef)
    d = g.__dict__
    d["module"] = module if len(module) <= _NAME_SHOWN else _shown(module)
    d["name"] = name if len(name) <= _NAME_SHOWN else _shown(name)
    d["offset"] = offset
    d["opcode"] = opcode
    d["verdict"] = verdict
    d["member"] = member
    d["reason"] = reason
    return g


@dataclass(frozen=True)
class ActionGroup:
    """Actions of one severity and kind on the names of one module, as a person reads them:
    "imports 12 classes of ultralytics.nn", not a line for each of 174 actions."""

    severity: Severity
    kind: ActionKind
    module: str
    #: The distinct names of the module the actions are on, in the order first met.
    names: tuple[str, ...]
    #: How many actions (each with its count).
    count: int
    #: The first action's reason, opcode and place.
    reason: str
    opcode: str
    member: str | None
    offset: int
    #: Whether the actions create objects with ``__new__`` (NEWOBJ), rather than call.
    new: bool = False

    def describe(self) -> str:
        """The group in words: what is done, to how many names of which module."""
        names = _names(self.names)
        n = len(self.names)
        if self.kind == "import":
            return f"imports {_plural(n, 'name')} of {self.module}: {names}"
        if self.kind == "call" and self.new:
            return (f"creates {_plural(self.count, 'object')} of {_plural(n, 'class', 'es')} "
                    f"of {self.module} with __new__: {names}")
        if self.kind == "call":
            return (f"calls {_plural(n, 'callable')} of {self.module} "
                    f"{_plural(self.count, 'time')}: {names}")
        verb = "builds" if self.kind == "build" else "updates"
        how = "__setstate__ or __setattr__" if self.kind == "build" else "item methods"
        return (f"{verb} {_plural(self.count, 'object')} of {_plural(n, 'class', 'es')} of "
                f"{self.module} ({how}): {names}")


#: Names a group line shows before it says how many more there are.
_GROUP_NAMES = 8


def _plural(n: int, word: str, suffix: str = "s") -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}{suffix}"


def _names(names: tuple[str, ...]) -> str:
    shown = ", ".join(names[:_GROUP_NAMES])
    more = len(names) - _GROUP_NAMES
    return f"{shown}, … ({more} more)" if more > 0 else shown


def action_groups(f: FileScan, severities: tuple[Severity, ...] = ("unvetted",)
                  ) -> list[ActionGroup]:
    """The actions of ``f`` of the given severities, grouped by severity, kind and top-level
    package (of the module of the global that named the target, else of the target's dotted
    prefix), in the order each group is first met. A group's ``module`` is the longest
    dotted prefix its modules share (``ultralytics.nn`` for ``ultralytics.nn.tasks`` and
    ``ultralytics.nn.modules.conv``), its names are relative to it."""
    modules = {(g.member, g.offset): g.module for g in f.globals}
    groups: dict[tuple[str, str, bool, str], list[Any]] = {}
    for a in f.actions:
        if a.severity not in severities:
            continue
        new = a.kind == "call" and a.target.endswith(".__new__")
        target = a.target.removesuffix(".__new__") if new else a.target
        module = modules.get((a.member, a.origin)) if a.origin is not None else None
        if module is None or not target.startswith(module + "."):
            module = target.rpartition(".")[0] or target
        key = (a.severity, a.kind, new, module.partition(".")[0])
        group = groups.get(key)
        if group is None:
            groups[key] = [a, {(module, target): None}, a.count]
        else:
            group[1][module, target] = None
            group[2] += a.count
    out: list[ActionGroup] = []
    for (_, _, new, _), (first, targets, count) in groups.items():
        prefix = _common_prefix([m for m, _ in targets])
        names = tuple(dict.fromkeys(t[len(prefix) + 1:] if t != prefix else t
                                    for _, t in targets))
        out.append(ActionGroup(first.severity, first.kind, prefix, names, count, first.reason,
                               first.opcode, first.member, first.offset, new=new))
    return out


def _common_prefix(modules: list[str]) -> str:
    """The longest dotted prefix every module of ``modules`` starts with (whole segments)."""
    parts = modules[0].split(".")
    for m in modules[1:]:
        other = m.split(".")
        n = 0
        while n < min(len(parts), len(other)) and parts[n] == other[n]:
            n += 1
        parts = parts[:n]
    return ".".join(parts) or modules[0].partition(".")[0]


#: Dangerous actions a table lists one by one per file before it says how many more there are.
_LISTED_DANGEROUS = 25


_MARK = {"clean": "ok", "dangerous": "DANGER", "anomalous": "ANOMALY", "unvetted": "UNVETTED",
         "unreadable": "ERROR", "skipped": "skip", "error": "BUG"}


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
        listed = 0
        for act in f.actions:
            if not verbose and act.severity != "dangerous":
                continue  # unvetted ones are grouped below
            listed += 1
            if not verbose and listed > _LISTED_DANGEROUS:
                continue
            where = f"{act.member}@{act.offset}" if act.member else f"@{act.offset}"
            args = f"{act.args}" if act.args is not None and act.kind == "call" else ""
            times = f" x{act.count}" if act.count > 1 else ""
            lines.append(f"    {act.severity:<9} {act.kind} {act.target}{args} ({act.opcode} "
                         f"{where}){times}: {act.reason}")
        if not verbose and listed > _LISTED_DANGEROUS:
            lines.append(f"    dangerous … and {listed - _LISTED_DANGEROUS} more dangerous "
                         "actions (-v or --json lists every one)")
        if not verbose:
            for g in action_groups(f):
                where = f"{g.member}@{g.offset}" if g.member else f"@{g.offset}"
                first = "first " if g.count > 1 else ""
                lines.append(f"    {g.severity:<9} {g.describe()} ({first}{g.opcode} {where}): "
                             f"{g.reason}")
        for a in f.anomalies:
            where = f" [{a.member}]" if a.member else ""
            at = f" @{a.offset}" if a.offset is not None else ""
            lines.append(f"    anomaly   {a.kind}{where}{at}: {a.message}")
    c = report.counts()
    lines.append(f"{len(report.files)} files: {c['clean']} clean, {c['dangerous']} dangerous, "
                 f"{c['anomalous']} anomalous, {c['unvetted']} unvetted, "
                 f"{c['unreadable']} unreadable, "
                 f"{c['skipped']} skipped"
                 + (f", {c['error']} internal errors (torchless bugs)" if c["error"] else ""))
    return "\n".join(printable(line) for line in lines) + "\n"
