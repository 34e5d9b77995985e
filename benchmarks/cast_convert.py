#!/usr/bin/env python
"""Casting benchmark (issue 28): a float32 checkpoint converted to bfloat16 safetensors by
``torchless.convert(src, dst, dtype="bf16")``, against ``cp`` of an output of that size and
against torch's recipe, in one interleaved run.

Usage::

    python benchmarks/cast_convert.py                    # 4 GiB f32 -> 2 GiB bf16, 3 reps
    python benchmarks/cast_convert.py --mib 1024 --reps 3
    python benchmarks/cast_convert.py --mib 512 --methods torchless-nofsync,cp
    python benchmarks/cast_convert.py --json > results.json
    python benchmarks/cast_convert.py --quick            # 1 MiB, 1 repetition: a smoke run

The checkpoint holds ``--big`` float32 matrices, ``--mib`` MiB in all, written by a child
(``torch.save``; above 2 GiB the built-in writer of ``bench_read.py``, the same layout). It is
converted once by torchless before anything is measured: that output (half the size) is what
``cp`` copies. The methods, each in a fresh process (the measurement of
``benchmarks/convert.py``: wall time of the whole process, ``op`` the operation inside it,
peak RSS its ``VmHWM``, warm cache, medians):

* ``torchless``          ``torchless.convert(src, dst, dtype="bf16")`` (fsync, atomic link);
* ``torchless-nofsync``  the same with ``os.fsync`` a no-op: like for like against ``cp``;
* ``cp``, ``cp+sync``    ``cp`` of the bfloat16 output, then (``+sync``) ``sync DST``;
* ``torch``              ``torch.load(src, mmap=True, weights_only=True)``, every tensor
                         ``.to(torch.bfloat16)``, ``safetensors.torch.save_file``;
* ``read``               the parts alone: the source's map read in the cast's blocks of
                         :data:`~torchless.write.cast.BLOCK_BYTES`, pages handed back behind;
* ``cast``               that read with ``cast_block`` of every block (one thread, nothing
                         written): what torchless does beyond the write ``cp`` does too.

``CPU`` is the process's user + system time, all threads (``wait4``): on the shared 2-core
machine it varies far less than the wall time, and shows the work each method needs.
``--src FILE`` converts an existing float32 checkpoint instead of writing one.

Targets (issue 28): ``torchless`` <= 1.2x the ``cp`` time (durable against ``cp+sync``, page
cache against ``cp``), peak RSS <= 64 MiB.
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
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_read import human, log, save_builtin, save_with_torch
from convert import TIMED_CHILD, TORCH_WRITER_MAX, _env, f32_tree, measure, warm

MiB = 1 << 20
QUICK = {"mib": 1, "big": 2, "reps": 1}
METHODS = ("torchless", "torchless-nofsync", "cp", "cp+sync", "torch", "read", "cast")
#: The parts of the conversion alone, on the source's bytes (the whole file read as float32:
#: its few KiB of ZIP headers as well): its map read in the cast's blocks, each block's pages
#: handed back behind it (``read``), and that read with torchless's cast of every block, one
#: thread, nothing written (``cast``): what the conversion costs before the write ``cp``
#: does too.
_PARTS_IMPORTS = """\
import mmap, os
import numpy as np
from torchless.core.dtypes import by_torch_name
from torchless.write.cast import BLOCK_BYTES, cast_block
f32, bf16 = by_torch_name("float32"), by_torch_name("bfloat16")"""
_PARTS = """\
fd = os.open(SRC, os.O_RDONLY)
m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
view, size = memoryview(m), len(m) // 4 * 4
for i in range(0, size, BLOCK_BYTES):
    block = view[i:min(size, i + BLOCK_BYTES)]
    {work}
    begin = -(-i // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (i + len(block)) // mmap.PAGESIZE * mmap.PAGESIZE
    if end > begin:
        m.madvise(mmap.MADV_DONTNEED, begin, end - begin)
del block, view
m.close()
os.close(fd)"""
_CHILD = {
    "torchless": ("import torchless", "torchless.convert(SRC, DST, dtype='bf16')"),
    "torchless-nofsync": ("import os, torchless\nos.fsync = lambda fd: None",
                          "torchless.convert(SRC, DST, dtype='bf16')"),
    "torch": ("import torch, safetensors.torch",
              "sd = torch.load(SRC, mmap=True, weights_only=True)\n"
              "sd = {k: v.to(torch.bfloat16) for k, v in sd.items()}\n"
              "safetensors.torch.save_file(sd, DST, metadata={'format': 'pt'})"),
    "read": (_PARTS_IMPORTS, _PARTS.format(work="np.frombuffer(block, '<f4').max()")),
    "cast": (_PARTS_IMPORTS, _PARTS.format(work="cast_block(f32, bf16, block)")),
}
#: (numerator, denominator) of the ratios reported: durable against durable, page cache
#: against page cache.
RATIOS = (("torchless", "cp+sync"), ("torchless-nofsync", "cp"),
          ("torch", "torchless-nofsync"), ("torch", "torchless"))
#: The parts against ``cp``: their ``op`` (no interpreter start-up) over cp's whole process.
PART_RATIOS = (("read", "cp"), ("cast", "cp"))


def _argv(method: str, src: str, copied: str, dst: str) -> list[str]:
    if method == "cp":
        return ["cp", copied, dst]
    if method == "cp+sync":
        return ["sh", "-c", 'cp "$0" "$1" && sync "$1"', copied, dst]
    imports, op = _CHILD[method]
    return [sys.executable, "-c", TIMED_CHILD.format(imports=imports, op=op), src, dst]


def run(src: str, methods: list[str], reps: int, work: str) -> dict[str, Any]:
    copied = os.path.join(work, "ref.safetensors")
    subprocess.run(_argv("torchless-nofsync", src, copied, copied), check=True,
                   capture_output=True, env=_env())
    warm(src)
    warm(copied)
    samples: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
    for rep in range(reps):
        for method in methods:  # interleaved, so drift hits every method alike
            dst = os.path.join(work, f"out-{method}.safetensors")
            os.sync()
            samples[method].append(measure(_argv(method, src, copied, dst), method))
            if os.path.exists(dst):  # read and cast write nothing
                os.unlink(dst)
        log(f"  rep {rep + 1}/{reps} done")
    med = {m: {k: statistics.median(s[k] for s in samples[m])
               for k in ("seconds", "op", "rss", "cpu")} for m in methods}
    ratios = {f"{a}/{b}": med[a]["seconds"] / med[b]["seconds"] for a, b in RATIOS
              if a in med and b in med}
    ratios.update({f"{a} op/{b}": med[a]["op"] / med[b]["seconds"] for a, b in PART_RATIOS
                   if a in med and b in med})
    targets: dict[str, bool] = {}
    for a, b in RATIOS[:2]:
        if f"{a}/{b}" in ratios:
            targets[f"{a} <= 1.2x {b}"] = ratios[f"{a}/{b}"] <= 1.2
    if "torchless" in med:
        targets["peak RSS <= 64 MiB"] = med["torchless"]["rss"] <= 64 * MiB
    return {"source_bytes": os.path.getsize(src), "output_bytes": os.path.getsize(copied),
            "median": med, "samples": samples, "ratios": ratios, "targets": targets}


def print_results(r: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(r, indent=2))
        return
    print(f"f32 {human(r['source_bytes'])} -> bf16 {human(r['output_bytes'])}")
    print(f"{'method':<18} {'seconds':>8} {'op':>8} {'CPU':>8} {'peak RSS':>10}")
    for m, s in r["median"].items():
        print(f"{m:<18} {s['seconds']:8.3f} {s['op']:8.3f} {s['cpu']:8.3f} "
              f"{human(s['rss']):>10}")
    print("ratios: " + ", ".join(f"{k} {v:.2f}x" for k, v in r["ratios"].items()))
    print("targets: " + ", ".join(f"{k}: {'yes' if ok else 'NO'}"
                                  for k, ok in r["targets"].items()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=4096, help="size of the float32 checkpoint (MiB)")
    p.add_argument("--big", type=int, default=32, help="float32 matrices in it")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--methods", default=",".join(METHODS),
                   help=f"comma-separated subset of {','.join(METHODS)} (all)")
    p.add_argument("--dir", help="where to write the files (default: a temporary directory)")
    p.add_argument("--src", help="an existing float32 checkpoint to convert (not written)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: " + ", ".join(f"--{k} {v}" for k, v in QUICK.items())
                        + " unless given (its figures mean nothing)")
    p.add_argument("--generate", metavar="FILE", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        p.set_defaults(**QUICK)
        args = p.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    if not methods or set(methods) - set(METHODS):
        p.error(f"--methods: a comma-separated subset of {','.join(METHODS)}")
    if args.generate:
        save = save_with_torch if args.mib * MiB <= TORCH_WRITER_MAX else save_builtin
        save(f32_tree(args.mib * MiB, args.big), {"zip": args.generate})
        return 0
    work = tempfile.mkdtemp(prefix="torchless-cast-", dir=args.dir)
    try:
        src = args.src or os.path.join(work, f"f32-{args.mib}M.pt")
        if not args.src:
            log(f"writing {src}")
            # in a child: this process must stay small, since a child inherits its peak RSS
            subprocess.run([sys.executable, __file__, "--generate", src, "--mib",
                            str(args.mib), "--big", str(args.big)], check=True)
        print_results(run(src, methods, args.reps, work), args.json)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
