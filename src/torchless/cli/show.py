"""What the command line prints: tables and JSON documents, with every name
from a file escaped (a name could otherwise drive the terminal or forge a line)."""

from __future__ import annotations

import argparse
import collections
import fnmatch
import sys
import types
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from torchless.cli.messages import print_error
from torchless.cli.summaries import as_json, clipped_repr, compact, structures
from torchless.core.text import line_writer
from torchless.model.graph import ModuleDict
from torchless.model.tensor import Tensor, UnsupportedTensor
from torchless.model.walk import children
from torchless.pickle.values import Global, Opaque

if TYPE_CHECKING:  # annotations only: printing a report loads neither module
    from torchless.conversion.common import ConversionReport, VerifyReport
    from torchless.reader import checkpoint as _checkpoint

__all__ = ["batch_doc", "batch_line", "describe_format", "human", "inspect_json",
           "inspect_text", "report_json", "report_text", "shared_keys",
           "short", "values", "verify_json", "verify_text"]


def verify_json(r: VerifyReport) -> dict[str, Any]:
    return {"src": r.src, "dst": r.dst, "ok": r.ok, "matched": list(r.matched),
            "mismatched": dict(r.mismatched), "missing": list(r.missing),
            "extra": list(r.extra), "skipped": list(r.skipped), "aliases": dict(r.aliases)}


def verify_text(r: VerifyReport, out: Any) -> None:
    w = line_writer(out)
    for name in r.matched:
        w(f"  ok        {name}{' -> ' + r.aliases[name] if name in r.aliases else ''}\n")
    for name, why in r.mismatched.items():
        w(f"  MISMATCH  {name}: {why}\n")
    for name in r.missing:
        w(f"  MISSING   {name}\n")
    for name in r.extra:
        w(f"  EXTRA     {name}\n")
    for name in r.skipped:
        w(f"  skipped   {name} (no safetensors dtype)\n")
    verdict = "identical" if r.ok else "DIFFERENT"
    w(f"{r.src} vs {r.dst}: {verdict} ({len(r.matched)} tensors match, "
      f"{len(r.mismatched)} differ, {len(r.missing)} missing, {len(r.extra)} extra)\n")


def report_json(report: ConversionReport) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "src": report.src, "dst": report.dst, "ok": True, "tensors": report.tensors,
        "bytes": report.bytes, "files": list(report.files), "skipped": list(report.skipped),
        "aliases": dict(report.aliases), "opaque": list(report.opaque),
        "seconds": round(report.seconds, 3), "existing": report.existing}
    if report.verified is not None:
        doc["verify"] = verify_json(report.verified)
    return doc


def report_text(report: ConversionReport, out: Any) -> None:
    w = line_writer(out)
    if report.existing:
        w(f"{report.dst}: already converted (verified: {report.tensors} tensors identical)"
          "\n")
        return
    w(f"{report.dst}: {report.tensors} tensors, {human(report.bytes)} "
      f"in {report.seconds:.2f} s\n")
    if len(report.files) > 1:
        for path in report.files:
            w(f"  wrote {path}\n")
    for name in report.skipped:
        w(f"  skipped (safetensors cannot hold it): {name}\n")
    for removed, kept in report.aliases.items():
        w(f"  alias recorded in __metadata__: {removed} -> {kept}\n")
    if report.opaque:
        w(f"  kept as inert records (torchless.Opaque): {', '.join(report.opaque)}\n")
    if report.verified is not None:
        w(f"  verified: {len(report.verified.matched)} tensors identical\n")


def batch_doc(result: Any) -> dict[str, Any]:
    return {"src": result.path, "ok": result.ok, "status": result.status,
            "dst": result.output, "error": result.error,
            **({"hint": result.hint} if result.error is not None else {}),
            "seconds": round(result.seconds, 3), **result.detail}


def batch_line(doc: dict[str, Any], as_json: bool) -> None:
    if not doc["ok"]:
        print_error(doc["error"], doc.get("hint"))
    elif not as_json and doc["status"] == "skipped":
        line_writer(sys.stdout)(f"{doc['dst']}: already converted (verified)\n")
    elif not as_json:
        line_writer(sys.stdout)(f"{doc['dst']}: {doc['tensors']} tensors, "
                                f"{human(doc['bytes'])} in {doc['seconds']:.2f} s\n")


def human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def describe_format(ckpt: _checkpoint.Checkpoint) -> str:
    info = ckpt.info
    parts = [ckpt.format, str(info.get("era", ""))]
    if ckpt.format in ("zip", "torchscript"):
        parts.append(f"archive version {info.get('version')}, prefix {info.get('prefix')!r}")
    if "byteorder" in info:
        parts.append(f"{info['byteorder']}-endian")
    return "; ".join(p for p in parts if p)


def short(value: Any, width: int = 60) -> str:
    if isinstance(value, Described):
        text = str(value)
    elif isinstance(value, Opaque):
        text = f"<{value.class_path}>"
    elif isinstance(value, Global):
        text = f"<global {value.path}>"
    elif isinstance(value, (str, bytes)):
        text = clipped_repr(value, width)
    elif isinstance(value, (int, float, bool, type(None), list, tuple)):
        text = repr(value)
    else:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= width else text[: width - 3] + "..."


def values(tree: Any, limit: int | None = None) -> Iterator[tuple[str, Any]]:
    """(flat name, value) for values that are not tensors, in walk order (the walker's names),
    each container expanded once (a second path to it shows as a shared reference). Known
    bulk records (RNG states, long lists of numbers) are one value, described by
    :func:`.summary.compact`; an inert record (:class:`Opaque`) is one line and its fields."""
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [("", tree)]
    count = 0
    left = _NAMES_SHOWN
    while stack and (limit is None or count < limit):
        name, obj = stack.pop()
        left -= len(name)
        if left < 0:  # a name repeats every key on its path: long keys down a deep chain
            yield "…", Described(f"{len(stack) + 1} more values not listed: their names "
                                 f"pass {_NAMES_SHOWN} characters")
            return
        if isinstance(obj, (Tensor, UnsupportedTensor, ModuleDict)):
            continue
        bulk = compact(obj)
        if bulk is not None:
            yield name or "<root>", Described(bulk)
            count += 1
            continue
        if isinstance(obj, (list, tuple)) and len(obj) <= 16 and all(
                isinstance(v, (str, int, float, bool, type(None))) for v in obj):
            yield name or "<root>", obj
            count += 1
            continue
        if isinstance(obj, _EXPANDED):
            if id(obj) in seen:
                yield name, "<shared reference>"
                count += 1
                continue
            seen.add(id(obj))
            kids = [(f"{name}.{_clip(n)}" if name and n else name or _clip(n), c)
                    for n, c in children(obj) if n is not None]
            if isinstance(obj, (argparse.Namespace, types.SimpleNamespace)):
                yield name, f"{type(obj).__name__}({len(vars(obj))} fields)"
                count += 1
            elif isinstance(obj, Opaque):
                n = len(obj.state) if isinstance(obj.state, dict) else len(kids)
                yield name or "<root>", Described(f"<{obj.class_path}> ({n} fields)")
                count += 1
            elif not kids:
                yield name or "<root>", obj
                count += 1
            stack.extend(reversed(kids))
            continue
        yield name or "<root>", obj
        count += 1


#: Characters of all the names :func:`values` lists (``Limits.max_name_bytes``' default).
_NAMES_SHOWN = 64 << 20


def _clip(key: str) -> str:
    """A key in a value's name: a key of a file can be megabytes long, and each value under
    it repeats it."""
    return key if len(key) <= 200 else f"{key[:100]}…({len(key)} characters)"


class Described(str):
    """A value shown by its description (printed as is, not quoted)."""


_EXPANDED = (dict, list, tuple, collections.deque, argparse.Namespace, types.SimpleNamespace,
             Opaque)


def shared_keys(ckpt: _checkpoint.Checkpoint) -> set[str]:
    users = collections.Counter(id(t.storage) for t in ckpt.tensors.values())
    return {n for n, t in ckpt.tensors.items() if users[id(t.storage)] > 1}


def inspect_json(ckpt: _checkpoint.Checkpoint, pattern: str | None = None) -> dict[str, Any]:
    """Everything inspect knows, complete (nothing is cut in JSON); ``pattern`` (a glob)
    picks the tensors listed."""
    shared = shared_keys(ckpt)
    totals: dict[str, dict[str, int]] = {}
    tensors = []
    for name, t in ckpt.tensors.items():
        if pattern is not None and not fnmatch.fnmatchcase(name, pattern):
            continue
        tot = totals.setdefault(t.dtype.name, {"count": 0, "bytes": 0})
        tot["count"] += 1
        tot["bytes"] += t.nbytes
        tensors.append({
            "name": name, "dtype": t.dtype.name, "shape": list(t.shape),
            "stride": list(t.stride), "storage_offset": t.storage_offset, "nbytes": t.nbytes,
            "contiguous": t.is_contiguous(), "shared_storage": name in shared,
            "parameter": t.is_parameter, "requires_grad": t.requires_grad,
        })
    doc: dict[str, Any] = {
        "path": ckpt.path, "format": ckpt.format, "description": describe_format(ckpt),
        "info": dict(ckpt.info),
        "summary": as_json(structures(ckpt.tree, ckpt.path, ckpt.info, ckpt.format)),
        "tensor_count": len(tensors),
        "total_bytes": sum(t["nbytes"] for t in tensors), "tensors": tensors,
        "totals_by_dtype": totals, "unsupported": dict(ckpt.unsupported),
        "records": {k: _record_row(r) for k, r in ckpt.records.items()},
        "opaque_globals": sorted({g.module + "." + g.name for g in ckpt.opaque}),
        "values": {k: short(v, 200) for k, v in values(ckpt.tree)},
    }
    if pattern is not None:
        doc["filter"] = pattern
        doc["tensors_in_file"] = len(ckpt.tensors)
    return doc


def _more(w: Any, hidden: int, what: str) -> None:
    if hidden > 0:
        w(f"  … {hidden} more {what} (use --all)\n")


def inspect_text(ckpt: _checkpoint.Checkpoint, out: Any, max_rows: int,
                 pattern: str | None = None) -> None:
    """The summary of known structures first, then tensors, dtype totals, other values and
    inert records; a list cut at ``max_rows`` says how many more there are."""
    data = inspect_json(ckpt, pattern)
    w = line_writer(out)
    w(f"{ckpt.path}\n")
    w(f"  format: {data['description']}\n")
    matched = f" matching {pattern!r} (of {len(ckpt.tensors)})" if pattern else ""
    w(f"  tensors: {data['tensor_count']}{matched}, {human(data['total_bytes'])}\n")
    if data["summary"]:
        w("\n  summary:\n")
        for item in data["summary"]:
            w(f"    {item['text']}\n")
    if ckpt.format == "dcp":
        from torchless.cli.dcpshow import dcp_text

        dcp_text(ckpt.info, w, max_rows, human)
    rows = data["tensors"]
    if rows:
        name_w = min(60, max(len(r["name"]) for r in rows))
        w(f"\n  {'name':<{name_w}}  {'dtype':<14} {'shape':<20} {'size':>10}  notes\n")
        for r in rows[:max_rows]:
            notes = []
            if not r["contiguous"]:
                notes.append("strided")
            if r["shared_storage"]:
                notes.append("shared")
            if r["parameter"]:
                notes.append("param")
            shape = "x".join(map(str, r["shape"])) or "scalar"
            w(f"  {r['name']:<{name_w}}  {r['dtype']:<14} {shape:<20} "
              f"{human(r['nbytes']):>10}  {' '.join(notes)}\n")
        _more(w, len(rows) - max_rows, "tensors")
        w("\n  by dtype:\n")
        for dt, tot in sorted(data["totals_by_dtype"].items()):
            w(f"    {dt:<14} {tot['count']:>6} tensors  {human(tot['bytes']):>10}\n")
    if data["records"]:
        w("\n  sparse, quantized, nested and meta tensors (records of their parts; "
          "not for safetensors):\n")
        for name, row in data["records"].items():
            parts = ", ".join(f"{k} {p['dtype']} {'x'.join(map(str, p['shape'])) or 'scalar'}"
                              for k, p in row["parts"].items())
            shape = "x".join(map(str, row["shape"])) if row["shape"] is not None else "?"
            w(f"    {name}: {row['kind']} {shape}{': ' + parts if parts else ''}\n")
    unreadable = {k: v for k, v in data["unsupported"].items() if k not in data["records"]}
    if unreadable:
        w("\n  unsupported tensors (not readable):\n")
        for name, kind in unreadable.items():
            w(f"    {name}: {kind}\n")
    shown = list(data["values"].items())
    if shown:
        w("\n  other values:\n")
        for name, value in shown[:max_rows]:
            w(f"    {name}: {value if len(value) <= 60 else value[:57] + '...'}\n")
        _more(w, len(shown) - max_rows, "values")
    if data["opaque_globals"]:
        w("\n  kept as inert records (never imported or called):\n")
        for g in data["opaque_globals"]:
            w(f"    {g}\n")


def _record_row(rec: Any) -> dict[str, Any]:
    """A sparse, quantized, nested or meta tensor: its kind, shape and parts."""
    shape = rec.fields.get("shape")
    return {"kind": rec.kind, "shape": None if shape is None else list(shape),
            "parts": {k: {"dtype": t.dtype.name, "shape": list(t.shape)}
                      for k, t in rec.components() if hasattr(t, "storage")}}
