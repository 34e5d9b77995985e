#!/usr/bin/env python
"""Which way of copying a file's bytes into another is fastest here: the choice behind the
safetensors writer's ``KERNEL_COPY`` (``src/torchless/write/safetensors.py``).

Usage::

    python benchmarks/copy_methods.py                      # 512 MiB and 2 GiB, 5 repetitions
    python benchmarks/copy_methods.py --mib 8192 --reps 1  # check free disk space first
    python benchmarks/copy_methods.py --sync               # each copy fsynced, as convert does
    python benchmarks/copy_methods.py --json
    python benchmarks/copy_methods.py --quick              # 1 MiB, 1 repetition: a smoke run

For each size it writes one file of that size, reads it once (warm page cache), then copies
it whole, the methods interleaved in each repetition, each in a fresh process:

* ``map``              ``os.write`` from a read-only map in 1 MiB blocks, the map's pages
                       released (``MADV_DONTNEED``) every 16 MiB: the writer without a kernel
                       copy;
* ``copy_file_range``  ``os.copy_file_range`` in one loop;
* ``copy_file_range+writeback``  the same in 64 MiB calls, each followed by
                       ``posix_fadvise(DONTNEED)`` on what it wrote, which starts writing
                       it to the disk (the writer's ``WRITEBACK_BYTES``): with ``--sync``,
                       the disk works while the copy goes on;
* ``sendfile``         ``os.sendfile`` in blocks of 1 GiB;
* ``gather``           the file in 11,200-byte pieces (a 2,800-float tensor each), copied
                       from the map into a 4 MiB buffer written when full: how the writer
                       sends small tensors;
* ``sendfile-pieces``  the same pieces, one ``os.sendfile`` each.

Seconds are the copy itself (and the fsync with ``--sync``), medians; peak RSS is the
child's ``VmHWM``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_read import human

MiB = 1 << 20
QUICK = {"mib": "1", "reps": 1}
METHODS = ("map", "copy_file_range", "copy_file_range+writeback", "sendfile", "gather",
           "sendfile-pieces")

_CHILD = r"""
import mmap, os, sys, time
src, dst, method, sync = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
fi = os.open(src, os.O_RDONLY)
fo = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
size = os.fstat(fi).st_size
PIECE = 11200
t0 = time.perf_counter()
if method == "copy_file_range":
    done = 0
    while done < size:
        done += os.copy_file_range(fi, fo, size - done, done)
elif method == "copy_file_range+writeback":
    done = flushed = 0
    while done < size:
        done += os.copy_file_range(fi, fo, min(size - done, 64 << 20), done)
        os.posix_fadvise(fo, flushed, done - flushed, os.POSIX_FADV_DONTNEED)
        flushed = done
elif method == "sendfile":
    done = 0
    while done < size:
        done += os.sendfile(fo, fi, done, min(size - done, 1 << 30))
elif method == "sendfile-pieces":
    for off in range(0, size, PIECE):
        n, done = min(PIECE, size - off), 0
        while done < n:
            done += os.sendfile(fo, fi, off + done, n - done)
else:
    m = mmap.mmap(fi, 0, access=mmap.ACCESS_READ)
    view = memoryview(m)
    if method == "map":
        pos = released = 0
        while pos < size:
            pos += os.write(fo, view[pos:min(size, pos + (1 << 20))])
            if pos - released >= 16 << 20 or pos == size:
                m.madvise(mmap.MADV_DONTNEED, released, (pos - released) // 4096 * 4096)
                released = pos // 4096 * 4096
    else:
        buf = bytearray(4 << 20)
        out = memoryview(buf)
        fill = mapped = 0
        for off in range(0, size, PIECE):
            piece = view[off:off + PIECE]
            if fill + len(piece) > len(buf):
                os.write(fo, out[:fill])
                fill = 0
            buf[fill:fill + len(piece)] = piece
            fill += len(piece)
            mapped += len(piece)
            if mapped >= 16 << 20:
                m.madvise(mmap.MADV_DONTNEED)
                mapped = 0
        os.write(fo, out[:fill])
        del piece
    view.release()
    m.close()
if sync:
    os.fsync(fo)
seconds = time.perf_counter() - t0
with open("/proc/self/status") as f:
    hwm = [int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:")]
print(seconds, hwm[0] if hwm else 0)
"""


def make_file(path: str, size: int) -> None:
    block = os.urandom(4 * MiB)
    with open(path, "wb") as f:
        left = size
        while left > 0:
            left -= f.write(block[:left])



def run(src: str, dst: str, method: str, sync: bool) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _CHILD, src, dst, method, "1" if sync else "0"],
                         capture_output=True, text=True, check=True).stdout.split()
    os.unlink(dst)
    return {"seconds": float(out[0]), "rss": float(out[1])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", default="512,2048", help="file sizes in MiB, comma-separated")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--sync", action="store_true", help="fsync each copy (timed)")
    p.add_argument("--dir", help="where to write the files (default: a temporary directory)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quick", action="store_true", help="1 MiB, 1 repetition: a smoke run")
    args = p.parse_args(argv)
    if args.quick:
        p.set_defaults(**QUICK)
        args = p.parse_args(argv)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="torchless-copy-", dir=args.dir) as work:
        for mib in (int(x) for x in args.mib.split(",") if x):
            src = os.path.join(work, f"{mib}M.bin")
            make_file(src, mib * MiB)
            with open(src, "rb") as f:
                while f.read(16 * MiB):
                    pass
            samples: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
            for _ in range(args.reps):
                for method in METHODS:
                    os.sync()
                    samples[method].append(run(src, os.path.join(work, "out"), method,
                                               args.sync))
            os.unlink(src)
            results[f"{mib} MiB"] = {
                m: {k: statistics.median(s[k] for s in v) for k in ("seconds", "rss")}
                for m, v in samples.items()}
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{'size':<10} {'method':<26} {'seconds':>8} {'peak RSS':>10}  x copy_file_range")
    for size, r in results.items():
        base = r["copy_file_range"]["seconds"]
        for m, s in r.items():
            print(f"{size:<10} {m:<26} {s['seconds']:8.3f} {human(s['rss']):>10}  "
                  f"{s['seconds'] / base:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
