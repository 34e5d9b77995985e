"""``inspect``: what it reads (a file, a URL, a DCP directory, a model directory as one model,
or the checkpoint files found under other directories) and how it shows it: the text report
(summary first), ``--tree``, an ``--html`` page, or JSON (``--json``: one document with an
entry per file, however many; ``--jsonl``: the same entries one per line)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from torchless.cli.messages import print_error
from torchless.cli.modeldir import ModelDir, is_checkpoint_dir, model_dir
from torchless.core.limits import Limits
from torchless.core.text import line_writer
from torchless.errors import CheckpointError, InternalError

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from torchless.scanner.report import ScanReport

__all__ = ["JSON_FORMAT", "Target", "inspect_entry", "run_inspect", "targets"]

#: ``inspect --json``'s document: ``{"format": JSON_FORMAT, "version": 1, "ok": …,
#: "files": [entry, …]}``; an entry is :func:`inspect_entry`'s.
JSON_FORMAT = "torchless-inspect"


class Target:
    """One thing inspect reads: ``path`` (a file, URL or DCP directory), or the weights of
    the model directory ``model``."""

    def __init__(self, path: str, model: ModelDir | None = None) -> None:
        self.path = path
        self.model = model


def targets(paths: Sequence[str], walk: Callable[[Sequence[str]], list[str]]
            ) -> tuple[list[Target], bool]:
    """What ``paths`` stand for, and whether it is one checkpoint (named as a file, a DCP
    directory or a model directory) rather than files found by ``walk`` (which raises when
    a directory holds none)."""
    out: list[Target] = []
    for p in paths:
        model = model_dir(p)
        if model is not None:
            out.append(Target(model.weights, model))
        elif os.path.isdir(p) and not is_checkpoint_dir(p):
            out.extend(Target(f) for f in walk([p]))
        else:
            out.append(Target(p))
    one = len(paths) == 1 and len(out) == 1 and (
        out[0].model is not None or out[0].path == paths[0])
    return out, one


def _options(args: argparse.Namespace, limits: Limits | None) -> dict[str, Any]:
    return {"strict": args.strict, "allow_globals": tuple(args.allow_global),
            "limits": limits, "verify_crc": args.verify_crc}


def inspect_entry(path: str, options: dict[str, Any], pattern: str | None,
                  model: ModelDir | None = None) -> dict[str, Any]:
    """One entry of ``inspect --json``: ``path``, ``ok``, ``status`` (``done``, ``refused``:
    torchless will not read it, ``failed``: a bug of torchless), ``error`` and ``hint``,
    and for a file read every field of the inspect document (module level: workers run
    it)."""
    from torchless.cli.show import inspect_json
    from torchless.reader import checkpoint as _checkpoint

    try:
        with _checkpoint.open(path, **options) as ckpt:
            doc = inspect_json(ckpt, pattern)
    except CheckpointError as e:
        return {"path": path, "ok": False,
                "status": "failed" if isinstance(e, InternalError) else "refused",
                "error": str(e), "hint": e.hint}
    if model is not None:
        doc["model_dir"] = model.directory
        doc["also_in_dir"] = list(model.others)
    return {"path": path, "ok": True, "status": "done", "error": None, "hint": None, **doc}


def run_inspect(args: argparse.Namespace, limits: Limits | None, found: list[Target],
                one: bool, pool: Executor | None) -> int:
    """One checkpoint: text, --tree or --html; JSON and many files: an entry per file."""
    if args.json or args.jsonl or not one:
        return _many(args, limits, found, pool)
    target = found[0]
    if args.html:
        return _write_html(args, target, limits)
    from torchless.cli.show import inspect_text
    from torchless.reader import checkpoint as _checkpoint

    with _checkpoint.open(target.path, **_options(args, limits)) as ckpt:
        if args.quiet:
            return 0
        if args.tree:
            import fnmatch

            from torchless.cli.tree import tree_text

            pattern = args.filter
            tree_text(ckpt.tree, sys.stdout, None if pattern is None else
                      lambda name: fnmatch.fnmatchcase(name, pattern))
        else:
            inspect_text(ckpt, sys.stdout, 10**9 if args.all else 100, args.filter)
            if target.model is not None:
                _also_text(target.model, sys.stdout)
    return 0


def _also_text(model: ModelDir, out: Any) -> None:
    w = line_writer(out)
    w(f"\n  model directory {model.directory}: read {os.path.basename(model.weights)}\n")
    if model.others:
        w("  also in the directory (inspect each by its path):\n")
        for name in model.others:
            w(f"    {name}\n")


def _entries(args: argparse.Namespace, limits: Limits | None, found: list[Target],
             pool: Executor | None) -> Iterator[dict[str, Any]]:
    """The entries in the order of ``found``, each as soon as it and those before it are
    done (a worker that dies fails its file only)."""
    options = _options(args, limits)
    if pool is None:
        for t in found:
            yield inspect_entry(t.path, options, args.filter, t.model)
        return
    futures = [pool.submit(inspect_entry, t.path, options, args.filter, t.model)
               for t in found]
    for t, future in zip(found, futures, strict=True):
        try:
            yield future.result()
        except Exception as e:  # the worker died (out of memory?)
            yield {"path": t.path, "ok": False, "status": "failed",
                   "error": f"the worker reading it failed ({type(e).__name__}: {e})",
                   "hint": "run this file alone, or with fewer workers (-j)"}


def _many(args: argparse.Namespace, limits: Limits | None, found: list[Target],
          pool: Executor | None) -> int:
    """JSON (one document, or a line per entry) or a summary line per file."""
    from torchless.cli.progress import Progress, progress_wanted
    from torchless.cli.show import human

    bar = Progress(human, unit="files") if len(found) > 1 and progress_wanted(
        args.quiet or args.json or args.jsonl) else None
    entries: list[dict[str, Any]] = []
    w = line_writer(sys.stdout)
    try:
        for entry in _entries(args, limits, found, pool):
            entries.append(entry)
            if bar is not None:
                bar.clear()
            if not entry["ok"]:
                print_error(entry["error"], entry["hint"])
            if args.jsonl:
                sys.stdout.write(json.dumps(entry, ensure_ascii=False) + "\n")
                sys.stdout.flush()
            elif entry["ok"] and not args.json and not args.quiet:
                w(f"{entry['path']}: {entry['format']}, {entry['tensor_count']} tensors, "
                  f"{human(entry['total_bytes'])}"
                  + (f", {len(entry['opaque_globals'])} opaque classes"
                     if entry["opaque_globals"] else "") + "\n")
            if bar is not None:
                bar(len(entries), len(found))
    finally:
        if bar is not None:
            bar.close()
    ok = all(e["ok"] for e in entries)
    if args.json:
        json.dump({"format": JSON_FORMAT, "version": 1, "ok": ok, "files": entries},
                  sys.stdout, indent=1, ensure_ascii=False)
        sys.stdout.write("\n")
    return 0 if ok else 1


def _verdict(report: ScanReport) -> dict[str, Any]:
    """The scan of what the page shows (a file, or an index and its shards): the worst
    status, and per file what made it so, actions grouped by package."""
    from torchless.scanner.report import action_groups

    order = ("error", "dangerous", "anomalous", "unvetted", "unreadable", "clean", "skipped")
    statuses: list[str] = [f.status for f in report.files] or ["unknown"]
    status = min(statuses, key=lambda s: order.index(s) if s in order else len(order))
    files = []
    for f in report.files:
        files.append({
            "path": f.path, "status": f.status, "layout": f.layout, "error": f.error,
            "hint": f.hint,
            "groups": [{"severity": g.severity, "text": g.describe(), "opcode": g.opcode,
                        "where": f"{g.member}@{g.offset}" if g.member else f"@{g.offset}",
                        "reason": g.reason}
                       for g in action_groups(f, ("dangerous", "unvetted"))],
            "globals": [{"name": f"{g.module}.{g.name}", "verdict": g.verdict,
                         "opcode": g.opcode,
                         "where": f"{g.member}@{g.offset}" if g.member else f"@{g.offset}",
                         "reason": g.reason} for g in f.globals],
            "anomalies": [f"{a.kind}: {a.message}" for a in f.anomalies]})
    return {"status": status, "files": files}


def _write_html(args: argparse.Namespace, target: Target, limits: Limits | None) -> int:
    """The report page, with the scan verdict and its findings, written whole or not at
    all; for a file torchless refuses (a dangerous one), the page of the scan alone, and
    exit 1. -o follows convert's existing-output rule: an existing FILE is replaced only
    with --force, and never one the page is about."""
    from torchless.cli.html import page
    from torchless.cli.show import human
    from torchless.conversion.existing import claim
    from torchless.scanner.files import scan
    from torchless.write import atomic

    dst = args.output
    sources = [target.path]
    if os.path.isdir(target.path):
        sources += [os.path.join(target.path, n) for n in os.listdir(target.path)]
    claim([dst], sources, force=args.force)

    report = scan(target.path, strict=args.strict, limits=limits,
                  allow_globals=args.allow_global)
    verdict = _verdict(report)
    options = _options(args, limits)
    entry = inspect_entry(target.path, options, args.filter, target.model)
    flagged = sorted({f"{g.module}.{g.name}" for f in report.files for g in f.globals
                      if g.verdict in ("dangerous", "unvetted")} - set(args.allow_global))
    if not entry["ok"] and flagged:
        # the page shows what the file holds too: the names it was refused for are kept as
        # inert records (never imported or called, as --allow-global does), for the page only
        again = inspect_entry(target.path, {**options, "allow_globals": (
            *options["allow_globals"], *flagged)}, args.filter, target.model)
        if again["ok"]:
            again["refused"] = {"error": entry["error"], "hint": entry["hint"],
                                "kept_inert": flagged}
            entry = again
    text = page(entry, verdict, human)
    # a name may hold a lone surrogate (a pickle's BINUNICODE allows it): escaped
    data = text.encode("utf-8", errors="backslashreplace")
    with atomic.Output(dst, force=args.force) as out:
        out.write(data)
        out.finish(len(data))
        atomic.commit([out], force=args.force)
    refused = entry.get("refused") or entry
    if not entry["ok"] or "refused" in entry:
        print_error(refused["error"], refused["hint"])
    if not args.quiet:
        what = (f"report of {entry['tensor_count']} tensors" if entry["ok"] else
                "report of the scan (the file is not read)")
        line_writer(sys.stdout)(f"{dst}: {what}, scan verdict {verdict['status']}\n")
    return 0 if entry["ok"] and "refused" not in entry else 1
