#!/usr/bin/env python
"""Whole-module saves: opening and loading a ``torch.save(model)`` file of many small modules,
against ``torch.load(mmap=True, weights_only=False)``, in one interleaved run (issue 29).

Usage::

    python benchmarks/bench_modules.py                 # ~1,000 modules, 7 repetitions
    python benchmarks/bench_modules.py --reps 11 --scale 2
    python benchmarks/bench_modules.py --quick         # a small model, one repetition
    python benchmarks/bench_modules.py --json

It builds, from ``torch.nn`` classes only (so that ``torch.load`` needs no import of ours), a
detector-like model: a convolutional backbone of residual-less blocks (``Conv2d``,
``BatchNorm2d``, ``ReLU``, ``SiLU`` in ``Sequential``\\ s), a ``TransformerEncoder`` and a
``TransformerDecoder`` (multi-head attention, ``LayerNorm``, ``Dropout``) and per-layer heads
in a ``ModuleList``, all under a ``ModuleDict``: the shape of an RT-DETR or a YOLO save, where
each module pickles its ``__dict__`` with a dozen ``OrderedDict``\\ s of hooks, and parameters
through ``_rebuild_parameter``. It saves the model whole and its ``state_dict()``, reads each
file once (warm page cache), then measures, interleaved (every reader once per repetition, in
turn), each in a process forked from this one after every import:

* ``torch``            ``torch.load(path, mmap=True, weights_only=False)``;
* ``torchless-open``   ``torchless.open(path)`` and ``len(ckpt.tensors)``;
* ``torchless-load``   ``torchless.load(path)``: the module as its record, tensors as
                       NumPy views (for the state dict, a dict of arrays).

Each child runs its reader twice: ``first``, the first call after the imports (a fresh
process, where torch's unpickler also pays for the collector's passes over everything torch
imported), and ``warm``, the second call in the same process (the issue's "warm" figure).
CPU time is the process time of the operation alone (the steadier figure on a shared
machine), wall time next to it; medians. Ratios are each torchless reader's over torch's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench_open import forked

READERS = ("torch", "torchless-open", "torchless-load")


def build(scale: int = 1) -> Any:
    """The model (``scale`` multiplies its depth; 0: two blocks and layers, for --quick)."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    def block(c: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c),
                             nn.ReLU(inplace=True), nn.Conv2d(c, c, 3, padding=1, bias=False),
                             nn.BatchNorm2d(c), nn.SiLU())

    c, d = 8, 16
    stages, blocks, layers = 4, 12 * scale or 2, 12 * scale or 2
    backbone = nn.Sequential(*[nn.Sequential(*[block(c) for _ in range(blocks)])
                               for _ in range(stages)])
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 2, 32, batch_first=True),
                                    layers, enable_nested_tensor=False)
    decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(d, 2, 32, batch_first=True),
                                    layers)
    heads = nn.ModuleList([nn.Sequential(nn.Linear(d, d), nn.LayerNorm(d), nn.GELU(),
                                         nn.Linear(d, 4)) for _ in range(layers)])
    model = nn.ModuleDict({"backbone": backbone, "encoder": encoder, "decoder": decoder,
                           "heads": heads})
    model.eval()
    return model


def _op(reader: str, path: str) -> Callable[[], int]:
    if reader == "torch":
        import torch

        def run_torch() -> int:
            obj = torch.load(path, mmap=True, weights_only=False)
            return len(obj.state_dict()) if hasattr(obj, "state_dict") else len(obj)

        return run_torch
    import torchless

    if reader == "torchless-open":
        def run_open() -> int:
            with torchless.open(path) as ckpt:
                return len(ckpt.tensors)

        return run_open

    def run_load() -> int:
        torchless.load(path)
        return -1

    return run_load


def _in_child(reader: str, path: str) -> dict[str, float]:
    """One measurement in a process forked from this one (imports done, nothing else): the
    first call and the warm one."""
    def measure() -> dict[str, float]:
        op = _op(reader, path)
        out: dict[str, float] = {}
        for run in ("first", "warm"):
            t0, c0 = time.perf_counter(), time.process_time()
            n = op()
            out[f"{run}_seconds"] = time.perf_counter() - t0
            out[f"{run}_cpu"] = time.process_time() - c0
            out["count"] = n
        return out

    return forked(measure, f"{reader} on {path}")


def run(scale: int, reps: int, directory: str) -> dict[str, Any]:
    import torch

    model = build(scale)
    modules = sum(1 for _ in model.modules())
    files = {"whole module": os.path.join(directory, "model.pt"),
             "state dict": os.path.join(directory, "state_dict.pt")}
    torch.save(model, files["whole module"])
    torch.save(model.state_dict(), files["state dict"])
    tensors = len(model.state_dict())
    results: dict[str, Any] = {"modules": modules, "tensors": tensors, "reps": reps,
                               "load": os.getloadavg()[0], "rows": []}
    for kind, path in files.items():
        with open(path, "rb") as f:  # warm the page cache
            f.read()
        for reader in READERS:  # lazy imports and one-time set-up happen before the forks
            _op(reader, path)()
        samples: dict[str, list[dict[str, float]]] = {r: [] for r in READERS}
        for _ in range(reps):
            for reader in READERS:
                samples[reader].append(_in_child(reader, path))
        for reader in ("torch", "torchless-open"):
            if samples[reader][0]["count"] != tensors:
                raise SystemExit(f"{reader} counts {samples[reader][0]['count']} tensors in "
                                 f"{path}, the model has {tensors}")
        for reader in READERS:
            results["rows"].append({
                "file": kind, "bytes": os.path.getsize(path), "reader": reader,
                **{k: statistics.median(s[k] for s in samples[reader])
                   for k in ("first_cpu", "first_seconds", "warm_cpu", "warm_seconds")}})
    return results


def table(results: dict[str, Any]) -> str:
    rows = results["rows"]
    lines = [f"{results['modules']:,} modules, {results['tensors']:,} tensors; medians of "
             f"{results['reps']} interleaved runs; load average {results['load']:.1f}", "",
             "| file | reader | warm CPU | warm wall | first CPU | first wall | "
             "warm CPU / torch's | first CPU / torch's |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        base = next(r for r in rows if r["file"] == row["file"] and r["reader"] == "torch")
        lines.append(f"| {row['file']} | {row['reader']} | {row['warm_cpu']:.4f} s | "
                     f"{row['warm_seconds']:.4f} s | {row['first_cpu']:.4f} s | "
                     f"{row['first_seconds']:.4f} s | "
                     f"{row['warm_cpu'] / base['warm_cpu']:.2f}x | "
                     f"{row['first_cpu'] / base['first_cpu']:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # type: ignore[union-attr]
    ap.add_argument("--reps", type=int, default=7, help="repetitions per reader (7)")
    ap.add_argument("--scale", type=int, default=1,
                    help="multiplies the model's depth (1: about 1,000 modules)")
    ap.add_argument("--dir", help="where to write the files (default: a temporary directory)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--quick", action="store_true", help="a small model, one repetition")
    args = ap.parse_args(argv)
    try:
        import torch  # noqa: F401 - imported before the forks
    except ImportError:
        print("bench_modules.py needs torch (it writes the files with torch.save)",
              file=sys.stderr)
        return 2
    import torchless  # noqa: F401 - imported before the forks

    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        results = run(0 if args.quick else args.scale, 1 if args.quick else args.reps, d)
    print(json.dumps(results, indent=1) if args.json else table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
