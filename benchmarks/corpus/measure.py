#!/usr/bin/env python
"""Measures torchless on the benign corpus ``generate.py`` wrote, against torch's view of
each file that the manifest recorded at build time, and ``torch.load(weights_only=True)``.

Usage (torch 2.13 in the interpreter; the libraries that wrote the files are not needed)::

    PYTHONPATH=src /work/corpus-venv/bin/python benchmarks/corpus/measure.py /work/corpus-out
    ... measure.py OUT --json results.json      # every file's outcome as well
    ... measure.py OUT --only peft,zuko         # some libraries

Per file:

* ``open``: exact when ``torchless.open`` lists the tensors torch's object reaches by the
  flat-name rule (modules saved whole by their ``state_dict``), each with torch's dtype,
  shape and the sha256 of its bytes, and nothing else; sparse, quantized, nested and meta
  tensors by name as unsupported or as records;
* ``load``: the tree is rebuilt when the skeleton of ``torchless.load`` (``skeleton.py``:
  containers, keys in order, tensor dtypes and shapes, plain values, class paths of objects
  and their pickled state) equals the skeleton of torch's object (not applicable to a ZeRO
  checkpoint directory, of which torch reads no one object);
* ``scan``: the status ``torchless.scan`` gives the file (clean, unvetted, dangerous,
  anomalous, unreadable, error);
* ``weights_only``: whether ``torch.load(f, weights_only=True)`` reads it (files only: a DCP
  directory is not a file ``torch.load`` takes, and is counted as not applicable).

Acceptance (issue 29): at least 99 % of files exact in ``open``, at least 95 % with the whole
tree rebuilt, no file called dangerous; every file below that is listed with the reason.
The exit code is 1 when a threshold is missed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
import warnings
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # tests/_expected_names.py: canonical() for sets
sys.path.insert(0, str(HERE))

from skeleton import first_difference, of_torchless  # noqa: E402

import torchless  # noqa: E402

OPEN_TARGET, LOAD_TARGET = 0.99, 0.95


def _raw(tensor: torchless.Tensor) -> bytes:
    """The tensor's elements in C order, little-endian (raw bytes where NumPy has no dtype)."""
    if tensor.numel == 0:
        return b""
    if tensor.dtype.numpy is not None:
        arr = tensor.numpy()
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        return bytes(np.ascontiguousarray(arr).tobytes())
    size = tensor.dtype.itemsize
    view = np.ndarray(
        tensor.shape,
        dtype=np.dtype((np.void, size)),
        buffer=tensor.storage.buffer(),
        offset=tensor.storage_offset * size,
        strides=tuple(s * size for s in tensor.stride),
    )
    return bytes(np.ascontiguousarray(view).tobytes())


def _describe(counter: Counter[Any], limit: int = 4) -> str:
    items = sorted(f"{name}: {key}" for name, key in counter.elements())
    more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
    return "; ".join(s[:140] for s in items[:limit]) + more


def check_open(path: Path, entry: dict[str, Any]) -> tuple[bool, str]:
    from tests import _expected_names as en

    want_entries = [
        (name, ("tensor", dtype, tuple(shape), sha) if kind == "tensor" else ("unsupported",))
        for name, kind, dtype, shape, sha in entry["leaves"]
    ]
    sets = [tuple(s) for s in entry["sets"]]
    try:
        with torchless.open(path) as ckpt:
            have_entries: list[tuple[str, Any]] = [
                (
                    name,
                    ("tensor", t.dtype.name, tuple(t.shape), hashlib.sha256(_raw(t)).hexdigest()),
                )
                for name, t in ckpt.tensors.items()
            ]
            have_entries += [(name, ("unsupported",)) for name in ckpt.unsupported]
    except torchless.CheckpointError as e:
        return False, f"refused: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    except Exception as e:  # a bug: torchless must raise CheckpointError or succeed
        return False, f"crashed: {type(e).__name__}: {str(e)[:200]}"
    have, want = en.canonical(have_entries, sets), en.canonical(want_entries, sets)
    if have == want:
        return True, ""
    return False, (
        f"missing or wrong: {_describe(want - have)} | unexpected: {_describe(have - want)}"
    )


def check_load(path: Path, entry: dict[str, Any]) -> tuple[bool | None, str]:
    if entry["skeleton"] is None:
        return None, "no torch object to compare (a ZeRO checkpoint directory)"
    try:
        obj = torchless.load(path)
    except torchless.CheckpointError as e:
        return False, f"refused: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    except Exception as e:
        return False, f"crashed: {type(e).__name__}: {str(e)[:200]}"
    got = json.loads(json.dumps(of_torchless(obj)))
    diff = first_difference(entry["skeleton"], got)
    return diff is None, diff or ""


def check_scan(path: Path) -> tuple[str, str]:
    try:
        report = torchless.scan(path)
    except Exception as e:
        return "error", f"crashed: {type(e).__name__}: {str(e)[:200]}"
    statuses = Counter(f.status for f in report.files)
    for status in ("dangerous", "anomalous", "error", "unreadable", "unvetted", "clean"):
        if statuses.get(status):
            why = ""
            for f in report.files:
                if f.status == status and status != "clean":
                    names = sorted(
                        {
                            f"{g.module}.{g.name}"
                            for g in f.globals
                            if g.verdict in ("dangerous", "unvetted")
                        }
                    )
                    why = (
                        ", ".join(names[:6])
                        or "; ".join(str(a) for a in f.anomalies[:2])
                        or (f.error or "")
                    )[:300]
                    break
            return status, why
    return "skipped", ""


def check_weights_only(path: Path) -> tuple[str, str]:
    import torch

    if path.is_dir():
        return "n/a", "a DCP directory"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.load(path, weights_only=True, map_location="cpu")
        return "ok", ""
    except Exception as e:
        text = str(e)
        import re

        m = re.search(r"Unsupported (?:global|operand)[^\n]*", text)
        return "refused", (m.group(0) if m else text.splitlines()[0] if text else type(e).__name__)[
            :200
        ]


def measure(out: Path, only: set[str]) -> dict[str, Any]:
    manifest = json.loads((out / "MANIFEST.json").read_text())
    results: list[dict[str, Any]] = []
    t0 = time.time()
    for rel, entry in sorted(manifest["files"].items()):
        if only and entry["library"] not in only:
            continue
        path = out / rel
        ok_open, why_open = check_open(path, entry)
        ok_load, why_load = check_load(path, entry)
        verdict, why_scan = check_scan(path)
        wo, why_wo = check_weights_only(path)
        results.append(
            {
                "file": rel,
                "library": entry["library"],
                "kind": entry["kind"],
                "tensors": len(entry["leaves"]),
                "open": ok_open,
                "open_why": why_open,
                "load": ok_load,
                "load_why": why_load,
                "scan": verdict,
                "scan_why": why_scan,
                "weights_only": wo,
                "weights_only_why": why_wo,
            }
        )
    import torch

    return {
        "torch": torch.__version__,
        "torchless": torchless.__version__,
        "built_with_torch": manifest["torch"],
        "seconds": round(time.time() - t0, 1),
        "libraries": manifest["libraries"],
        "files": results,
    }


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(results)
    wo_files = [r for r in results if r["weights_only"] != "n/a"]
    verdicts = Counter(r["scan"] for r in results)
    return {
        "files": n,
        "tensors": sum(r["tensors"] for r in results),
        "open_exact": sum(r["open"] for r in results),
        "load_tree": sum(r["load"] is True for r in results),
        "load_files": sum(r["load"] is not None for r in results),
        "scan": dict(verdicts),
        "weights_only_ok": sum(r["weights_only"] == "ok" for r in wo_files),
        "weights_only_files": len(wo_files),
    }


def pct(a: int, b: int) -> str:
    return f"{100 * a / b:.1f} %" if b else "-"


def table(data: dict[str, Any]) -> str:
    by_lib: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in data["files"]:
        by_lib[r["library"]].append(r)
    lines = [
        "| library | version | files | tensors | open exact | load tree | scan clean / "
        "unvetted / dangerous / other | weights_only loads |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def row(name: str, version: str, s: dict[str, Any]) -> str:
        sc = s["scan"]
        other = s["files"] - sc.get("clean", 0) - sc.get("unvetted", 0) - sc.get("dangerous", 0)
        return (
            f"| {name} | {version} | {s['files']} | {s['tensors']} | "
            f"{s['open_exact']} ({pct(s['open_exact'], s['files'])}) | "
            f"{s['load_tree']} of {s['load_files']} ({pct(s['load_tree'], s['load_files'])}) | "
            f"{sc.get('clean', 0)} / {sc.get('unvetted', 0)} / {sc.get('dangerous', 0)} / "
            f"{other} | {s['weights_only_ok']} of {s['weights_only_files']} "
            f"({pct(s['weights_only_ok'], s['weights_only_files'])}) |"
        )

    for name in sorted(by_lib, key=str.lower):
        lines.append(
            row(name, data["libraries"].get(name, {}).get("version", "?"), summarize(by_lib[name]))
        )
    total = summarize(data["files"])
    lines.append(row(f"**all {len(by_lib)}**", "", total))
    return "\n".join(lines)


def failures(data: dict[str, Any]) -> list[str]:
    out = []
    for r in data["files"]:
        if not r["open"]:
            out.append(f"open  {r['file']}: {r['open_why']}")
        if r["load"] is False:
            out.append(f"load  {r['file']}: {r['load_why']}")
        if r["scan"] not in ("clean", "unvetted"):
            out.append(f"scan  {r['file']}: {r['scan']}: {r['scan_why']}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the corpus directory generate.py wrote")
    ap.add_argument("--json", type=Path, help="write every file's outcome here")
    ap.add_argument("--only", default="", help="comma-separated library names")
    args = ap.parse_args()
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    data = measure(args.out, only)
    total = summarize(data["files"])
    data["summary"] = total
    skipped = {k: v["why"] for k, v in data["libraries"].items() if v["status"] != "used"}
    print(
        f"torch {data['torch']} (corpus built with {data['built_with_torch']}), torchless "
        f"{data['torchless']}: {total['files']} files, {total['tensors']} tensors, "
        f"{data['seconds']} s\n"
    )
    print(table(data))
    if skipped:
        print("\nlibraries tried and skipped:")
        for k, why in sorted(skipped.items()):
            print(f"  {k}: {why}")
    fails = failures(data)
    print(f"\nfiles below the bar ({len(fails)}):" if fails else "\nno file below the bar")
    for line in fails:
        print("  " + line)
    ok = (
        total["open_exact"] >= OPEN_TARGET * total["files"]
        and total["load_tree"] >= LOAD_TARGET * total["load_files"]
        and total["scan"].get("dangerous", 0) == 0
    )
    print(f"\nacceptance (open >= 99 %, load >= 95 %, 0 dangerous): {'met' if ok else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps(data, indent=1))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
