#!/usr/bin/env python
"""Remote reads and batch throughput, measured in one run (issue 7's benchmark lines).

Usage::

    python benchmarks/remote_batch.py                 # 512 MiB remote file, 24 x 16 MiB batch
    python benchmarks/remote_batch.py --mib 1024 --files 48 --reps 3
    python benchmarks/remote_batch.py --quick         # tiny files, 1 repetition: a smoke run

* **remote**: a checkpoint written by ``torch.save`` is served by a local HTTP server with
  real ``Range`` support that counts requests and bytes sent. Reported: requests and bytes
  for ``torchless.open`` + listing every tensor (what ``torchless inspect`` does), and the
  time of ``torchless.convert`` from the URL against ``torchless.convert`` of the local file
  (same output bytes, checked).
* **batch**: ``torchless.batch(dir, "convert", executor)`` over a directory of checkpoints
  with no executor (1), a ``ProcessPoolExecutor`` of 2, and of N = ``os.cpu_count()``
  workers; files/s and MB/s, and the speed-up over 1. Outputs are deleted between runs
  (outside the timing); the page cache is warm. Medians of ``--reps`` runs.
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
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from range_server import serve  # beside this script

import torchless

MiB = 1 << 20
#: What --quick sets (options given explicitly still win): seconds, not figures.
QUICK = {"mib": 1, "files": 2, "mib_each": 1, "reps": 1}


_WRITE = """
import json, sys, torch
for mib, count, path in json.loads(sys.argv[1]):
    g = torch.Generator().manual_seed(0)
    per = max(1, mib * (1 << 20) // count // 4)
    sd = {f"layers.{i}.weight": torch.randn(per, generator=g) for i in range(count)}
    torch.save({"model": sd, "epoch": 3, "optimizer": {"lr": 0.1}}, path)
"""


def write(jobs: list[tuple[int, int, Path]]) -> None:
    """torch.save each (MiB, tensor count, path), all in one child (one import of torch)."""
    spec = json.dumps([(mib, count, str(path)) for mib, count, path in jobs])
    subprocess.run([sys.executable, "-c", _WRITE, spec], check=True)


def remote(work: Path, reps: int) -> None:
    src = work / "big.pt"
    size = src.stat().st_size
    for server in serve(work):  # one server, shut down when the loop ends
        url = server.url + "big.pt"
        server.requests = server.sent = 0
        t0 = time.perf_counter()
        with torchless.open(url) as ckpt:
            n = len(ckpt.tensors)
        opened = time.perf_counter() - t0
        print(f"remote inspect of {size / MiB:.0f} MiB ({n} tensors): {server.requests} "
              f"requests, {server.sent:,} bytes = {100 * server.sent / size:.3f} % of the "
              f"file, {opened:.3f} s")
        local_t, remote_t = [], []
        for _ in range(reps):
            for dst in (work / "l.safetensors", work / "r.safetensors"):
                dst.unlink(missing_ok=True)
            t0 = time.perf_counter()
            torchless.convert(src, work / "l.safetensors")
            local_t.append(time.perf_counter() - t0)
            server.requests = server.sent = 0
            t0 = time.perf_counter()
            torchless.convert(url, work / "r.safetensors")
            remote_t.append(time.perf_counter() - t0)
        same = (work / "l.safetensors").read_bytes() == (work / "r.safetensors").read_bytes()
        lm, rm = statistics.median(local_t), statistics.median(remote_t)
        print(f"convert: local {lm:.2f} s, over HTTP {rm:.2f} s ({rm / lm:.2f}x local), "
              f"{server.requests} requests, {server.sent / size:.3f} x the file read; "
              f"outputs identical: {same}")


def batch(work: Path, files: int, reps: int) -> None:
    d = work / "many"
    total = sum(p.stat().st_size for p in d.glob("*.pt"))
    cpus = os.cpu_count() or 1
    base = None
    for workers in sorted({1, 2, cpus}):
        times = []
        for _ in range(reps):
            for p in d.glob("*.safetensors"):
                p.unlink()
            t0 = time.perf_counter()
            if workers == 1:
                results = torchless.batch([d], "convert")
            else:
                with ProcessPoolExecutor(workers) as pool:
                    results = torchless.batch([d], "convert", pool)
            times.append(time.perf_counter() - t0)
            assert all(r.status == "done" for r in results)
        med = statistics.median(times)
        base = base or med
        print(f"batch convert, {workers} worker(s): {files / med:.1f} files/s, "
              f"{total / med / 1e6:.0f} MB/s, {base / med:.2f}x one worker ({med:.2f} s)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=512, help="size of the remote checkpoint")
    p.add_argument("--files", type=int, default=24, help="checkpoints in the batch")
    p.add_argument("--mib-each", type=int, default=16, help="size of each batch checkpoint")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--quick", action="store_true",
                   help="a smoke run in seconds: "
                        + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items())
                        + " unless given (its figures mean nothing)")
    args = p.parse_args()
    if args.quick:
        p.set_defaults(**QUICK)
        args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="torchless-remote-"))
    try:
        (work / "many").mkdir()
        write([(args.mib, 128, work / "big.pt"),
               *((args.mib_each, 8, work / "many" / f"m{i:03d}.pt") for i in range(args.files))])
        remote(work, args.reps)
        batch(work, args.files, args.reps)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
