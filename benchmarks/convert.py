#!/usr/bin/env python
"""Conversion benchmark: torchless convert against the torch path and ``cp``, in one run.

Usage::

    python benchmarks/convert.py                     # defaults: 512 MiB files, 3 repetitions
    python benchmarks/convert.py --mib 128 --many 500 --reps 2
    python benchmarks/convert.py --json > results.json
    python benchmarks/convert.py --quick             # tiny files, 1 repetition: a smoke run

It writes two checkpoints with ``torch.save`` into a temporary directory:

* ``f32``   ``--big`` float32 matrices, ``--mib`` MiB in all;
* ``bf16``  ``--many`` bfloat16 tensors of mixed sizes, ``--mib`` MiB in all;

and measures, for each file, three ways of producing a file of the same size beside it:

* ``torchless``  ``torchless.convert(src, dst)`` (writes from the map, fsync, atomic rename);
* ``torchless-nofsync``  the same with ``os.fsync`` made a no-op in that child: the
                 like-for-like figure against ``cp`` and the torch path, which leave their
                 output in the page cache;
* ``torch``      ``torch.load(src, mmap=True, weights_only=True)`` then
                 ``safetensors.torch.save_file`` (the usual recipe);
* ``cp``         the ``cp`` command on the same file (the floor: no parsing at all);
* ``cp+sync``    ``cp`` then ``sync DST`` (fsync): the floor for a durable copy, which is
                 what torchless does (it fsyncs before its rename; cp and the torch path
                 leave the data in the page cache).

Every measurement runs in a fresh process (``python -c`` or ``cp``) started by this small
process (the files are written by another child, so that no child inherits torch's memory).
``seconds`` is the time of the operation itself, taken inside that process after its imports
(for ``cp``, the whole process); ``process`` is the wall time of the whole process,
interpreter start and imports included. Peak RSS is the child's ``VmHWM``; for ``cp`` it is
``ru_maxrss`` from ``wait4``, which also counts this launcher's own peak (inherited across
fork and exec), so an upper bound. It includes the interpreter and its imports (``import
torch`` alone is a few hundred MiB) and any pages of the source file mapped and touched. Each
file is read once before anything is measured, so every figure is warm-cache (the page cache
cannot be dropped without root). The output is deleted between repetitions, outside the
timing. Reported figures are medians.

Targets (issue 4): torchless <= 1.3x cp, >= 3x faster than the torch path, peak RSS <= 100 MB.
They are judged like for like: durable against durable (torchless / cp+sync), page cache
against page cache (torchless-nofsync / cp, torch / torchless-nofsync); all ratios are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_read import Spec, human, log, save_with_torch

MiB = 1 << 20
#: What --quick sets (options given explicitly still win): seconds, not figures.
QUICK = {"mib": 1, "big": 2, "many": 16, "reps": 1}
METHODS = ("torchless", "torchless-nofsync", "torch", "cp", "cp+sync")
FILES = ("f32", "bf16")

_CHILD = {
    "torchless": (
        "import torchless",
        "torchless.convert(SRC, DST)",
    ),
    "torchless-nofsync": (
        "import os, torchless\nos.fsync = lambda fd: None",
        "torchless.convert(SRC, DST)",
    ),
    "torch": (
        "import torch, safetensors.torch",
        "sd = torch.load(SRC, mmap=True, weights_only=True)\n"
        "safetensors.torch.save_file(sd, DST, metadata={'format': 'pt'})",
    ),
}
_TEMPLATE = """\
import json, sys, time
SRC, DST = sys.argv[1], sys.argv[2]
{imports}
t0 = time.perf_counter()
{op}
seconds = time.perf_counter() - t0
with open("/proc/self/status") as f:
    hwm = [int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:")]
print(json.dumps({{"seconds": seconds, "rss": hwm[0] if hwm else None}}))
"""


def f32_tree(total: int, count: int) -> dict[str, Spec]:
    per = total // count
    rows = max(1, per // (4 * 1024))
    return {f"layers.{i}.weight": Spec("float32", (rows, 1024), 10 + i) for i in range(count)}


def bf16_tree(total: int, count: int) -> dict[str, Spec]:
    """``count`` bfloat16 tensors: one in eight large, the rest small (norms, biases)."""
    big = max(1, count // 8)
    small_bytes = 2 * 4096 * (count - big)
    per_big = max(2048, (total - small_bytes) // big)
    tree: dict[str, Spec] = {}
    for i in range(count):
        if i % 8 == 0:
            shape: tuple[int, ...] = (max(1, per_big // (2 * 1024)), 1024)
        else:
            shape = (4096,)
        tree[f"model.layers.{i // 8}.p{i % 8}"] = Spec("bfloat16", shape, 5000 + i)
    return tree


def run(method: str, src: str, dst: str) -> dict[str, float]:
    """One measurement in a fresh process: op seconds, process seconds, peak RSS bytes."""
    if method == "cp":
        argv = ["cp", src, dst]
    elif method == "cp+sync":
        argv = ["sh", "-c", 'cp "$0" "$1" && sync "$1"', src, dst]
    else:
        imports, op = _CHILD[method]
        argv = [sys.executable, "-c", _TEMPLATE.format(imports=imports, op=op), src, dst]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    out = proc.stdout.read() if proc.stdout else b""
    err = proc.stderr.read() if proc.stderr else b""
    if proc.returncode != 0:
        raise SystemExit(f"{method} failed on {src}:\n{err.decode(errors='replace')}")
    if method.startswith("cp"):
        return {"seconds": wall, "process": wall, "rss": usage.ru_maxrss * 1024}
    got = json.loads(out)
    rss = got["rss"] if got["rss"] is not None else usage.ru_maxrss * 1024
    return {"seconds": got["seconds"], "process": wall, "rss": rss}


def warm(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(16 * MiB):
            pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=512, help="size of each checkpoint (MiB)")
    p.add_argument("--big", type=int, default=24, help="float32 matrices in the f32 file")
    p.add_argument("--many", type=int, default=2000, help="tensors in the bf16 file")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--files", default=",".join(FILES),
                   help=f"comma-separated subset of {','.join(FILES)} (all)")
    p.add_argument("--dir", help="where to write the files (default: a temporary directory)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run in seconds: "
                        + ", ".join(f"--{k} {v}" for k, v in QUICK.items())
                        + " unless given (its figures mean nothing)")
    p.add_argument("--generate", metavar="DIR", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        p.set_defaults(**QUICK)
        args = p.parse_args(argv)
    files = [f for f in args.files.split(",") if f]
    if not files or set(files) - set(FILES):
        p.error(f"--files: a comma-separated subset of {','.join(FILES)}")
    if args.generate:
        if "f32" in files:
            save_with_torch(f32_tree(args.mib * MiB, args.big),
                            {"zip": os.path.join(args.generate, "f32.pt")})
        if "bf16" in files:
            save_with_torch(bf16_tree(args.mib * MiB, args.many),
                            {"zip": os.path.join(args.generate, "bf16.pt")})
        return 0

    work = tempfile.mkdtemp(prefix="torchless-convert-", dir=args.dir)
    try:
        paths = {name: os.path.join(work, f"{name}.pt") for name in files}
        log(f"writing checkpoints into {work}")
        # in a child: this process must stay small, since a child inherits its peak RSS
        subprocess.run([sys.executable, __file__, "--generate", work, "--mib", str(args.mib),
                        "--big", str(args.big), "--many", str(args.many),
                        "--files", ",".join(files)], check=True)
        results: dict[str, Any] = {}
        for name in FILES:
            if name not in paths:
                continue
            src = paths[name]
            warm(src)
            size = os.path.getsize(src)
            log(f"{name}: {human(size)}")
            samples: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
            for rep in range(args.reps):
                for method in METHODS:  # interleaved, so drift hits every method alike
                    dst = os.path.join(work, f"out-{method}")
                    os.sync()  # no writeback of an earlier output left to slow this one
                    samples[method].append(run(method, src, dst))
                    os.unlink(dst)
                log(f"  rep {rep + 1}/{args.reps} done")
            med = {m: {k: statistics.median(s[k] for s in samples[m])
                       for k in ("seconds", "process", "rss")} for m in METHODS}
            results[name] = {"bytes": size, "median": med, "samples": samples}
        print_results(results, args.json)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def print_results(results: dict[str, Any], as_json: bool) -> None:
    for r in results.values():
        med = r["median"]
        tl = med["torchless"]["seconds"]
        fast = med["torchless-nofsync"]["seconds"]
        r["ratios"] = {"torchless/cp": tl / med["cp"]["seconds"],
                       "torchless/cp+sync": tl / med["cp+sync"]["seconds"],
                       "torchless-nofsync/cp": fast / med["cp"]["seconds"],
                       "torch/torchless-nofsync": med["torch"]["seconds"] / fast,
                       "torch/torchless-nofsync (process)":
                           med["torch"]["process"] / med["torchless-nofsync"]["process"]}
        r["targets"] = {"<= 1.3x cp (durable: vs cp+sync)": r["ratios"]["torchless/cp+sync"]
                        <= 1.3,
                        "<= 1.3x cp (page cache: nofsync vs cp)":
                            r["ratios"]["torchless-nofsync/cp"] <= 1.3,
                        ">= 3x faster than torch (in-process)":
                            r["ratios"]["torch/torchless-nofsync"] >= 3,
                        ">= 3x faster than torch (whole process)":
                            r["ratios"]["torch/torchless-nofsync (process)"] >= 3,
                        "peak RSS <= 100 MB": med["torchless"]["rss"] <= 100e6}
    if as_json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'file':<6} {'method':<18} {'seconds':>8} {'process':>8} {'peak RSS':>10}  GB/s")
    for name, r in results.items():
        for m in METHODS:
            s = r["median"][m]
            print(f"{name:<6} {m:<18} {s['seconds']:8.3f} {s['process']:8.3f} "
                  f"{human(s['rss']):>10}  {r['bytes'] / s['seconds'] / 1e9:5.2f}")
        ratios = ", ".join(f"{k} {v:.2f}" for k, v in r["ratios"].items())
        met = ", ".join(f"{k}: {'yes' if ok else 'NO'}" for k, ok in r["targets"].items())
        print(f"{name:<6} {human(r['bytes'])}: {ratios}; targets {met}")


if __name__ == "__main__":
    sys.exit(main())
