#!/usr/bin/env python
"""Open benchmark: the cost of parsing a checkpoint of many tensors, per tensor, next to the
unpicklers people compare against, in one interleaved run.

Usage::

    python benchmarks/bench_open.py                         # 30,000 and 100,000 tensors
    python benchmarks/bench_open.py --floats 2800           # of 2,800 floats each only
    python benchmarks/bench_open.py --counts 10000,100000,1000000 --readers c-pickle,torchless
    python benchmarks/bench_open.py --big-mib 0             # without the 2 GiB file
    python benchmarks/bench_open.py --quick                 # tiny files, one repetition
    python benchmarks/bench_open.py --json

For each count and each tensor size (``--floats``: 4 and 2,800 float32 elements; at 2,800
the members lie 11 KiB apart, so each local header is a read of its own) it writes (with
``torch.save``) a flat state dict of that many tensors, reads it once (warm page cache),
then measures, interleaved (every reader once per repetition, in turn), each in a process
forked from this one after every import:

* ``c-pickle``     the archive's ``data.pkl`` read by :mod:`zipfile`, unpickled by the C
                   unpickler with stub globals (``find_class`` returns one stub callable,
                   ``persistent_load`` a small object): the floor of any Python reader;
* ``py-pickle``    the same with the pure-Python unpickler (``pickle._Unpickler``);
* ``torch-wo``     ``torch.load(weights_only=True, mmap=True)``: torch's own restricted
                   unpickler, what ``torch.load`` runs by default;
* ``torchless``    ``torchless.open`` (directory, headers, pickle, rules, names), then
                   ``len(ckpt.tensors)``.

A second table opens a file of 256 tensors and ``--big-mib`` MiB (2 GiB) with ``torchless``
and ``torch.load(weights_only=True, mmap=True)``: warm (after reading the file), the RSS the
open adds; cold (its pages evicted with ``posix_fadvise(DONTNEED)``, no root needed), the
time and the bytes the process made the kernel read from storage (``/proc/self/io``).

Time is wall time of the operation alone, CPU its process time (medians; on a shared
machine the CPU ratio is the steadier one). Memory is what the result holds: the
process's resident set after the operation (result alive) minus before, and, for the
Python readers, the bytes ``tracemalloc`` sees alive (torch's tensors live in C++ memory
that ``tracemalloc`` does not see, so its column is the RSS one). Ratios are torchless's time
over each reader's. Without torch only ``c-pickle``, ``py-pickle`` and ``torchless`` run,
on a file written by ``bench_read``'s built-in writer.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
import tracemalloc
import zipfile
from collections.abc import Callable
from typing import Any

READERS = ("c-pickle", "py-pickle", "torch-wo", "torchless")


class _Stub:
    __slots__ = ("args",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        pass


def _stubbed(base: type[Any]) -> type[Any]:
    class Stubbed(base):  # type: ignore[valid-type,misc]
        def find_class(self, module: str, name: str) -> Any:
            return _Stub

        def persistent_load(self, pid: Any) -> Any:
            return pid

    return Stubbed


_C_PICKLE = _stubbed(pickle.Unpickler)
_PY_PICKLE = _stubbed(pickle._Unpickler)  # type: ignore[attr-defined]


def _unpickle(cls: type[Any], path: str) -> Any:
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        data = z.read(name)
    return cls(io.BytesIO(data)).load()


def _count(obj: Any) -> int:
    return len(obj) if isinstance(obj, dict) else 0


def _op(reader: str, path: str) -> Callable[[], tuple[Any, int]]:
    if reader == "c-pickle":
        return lambda: (r := _unpickle(_C_PICKLE, path), _count(r))
    if reader == "py-pickle":
        return lambda: (r := _unpickle(_PY_PICKLE, path), _count(r))
    if reader in ("torch-wo", "torch-mmap"):
        import torch

        return lambda: (r := torch.load(path, weights_only=True, mmap=True), len(r))
    import torchless

    # past a million tensors the default limits refuse the file: raise them for the benchmark
    big = 1 << 21
    limits = torchless.Limits(max_archive_entries=big, max_tensors=big)

    def run() -> tuple[Any, int]:
        c = torchless.open(path, limits=limits)
        return c, len(c.tensors)

    return run


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _measure(reader: str, path: str, traced: bool) -> dict[str, float]:
    op = _op(reader, path)
    gc.collect()
    before = _rss()
    if traced:
        tracemalloc.start()
    t0, c0 = time.perf_counter(), time.process_time()
    result, n = op()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    out = {"seconds": dt, "cpu": cpu, "rss": _rss() - before, "count": n}
    if traced:
        out["traced"] = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
    del result
    return out


def forked(measure: Callable[[], dict[str, Any]], label: str) -> dict[str, Any]:
    """``measure()`` in a process forked from this one (imports done, nothing else), its
    result sent back as JSON; an error in the child is raised here, named by ``label``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.close(r)
        try:
            payload = json.dumps(measure()).encode()
        except BaseException as e:
            payload = json.dumps({"error": repr(e)}).encode()
        os.write(w, payload)
        os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    result: dict[str, Any] = json.loads(b"".join(chunks))
    if "error" in result:
        raise RuntimeError(f"{label}: {result['error']}")
    return result


def _in_child(reader: str, path: str, traced: bool, big: bool | None = None
              ) -> dict[str, float]:
    """One measurement in a forked process."""
    return forked(lambda: _measure(reader, path, traced) if big is None
                  else _open_big(reader, path, big), f"{reader} on {path}")


def _read_bytes() -> int:
    """Bytes this process made the kernel fetch from storage (readahead included)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def _open_big(reader: str, path: str, cold: bool) -> dict[str, float]:
    """Open the big file (its pages evicted from the page cache first if ``cold``) and list
    its tensors: time, RSS added, bytes read from storage."""
    if cold:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    else:
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass
    gc.collect()
    rss, got = _rss(), _read_bytes()
    t0 = time.perf_counter()
    result, n = _op("torch-mmap" if reader == "torch-wo" else reader, path)()
    dt = time.perf_counter() - t0
    out = {"seconds": dt, "rss": _rss() - rss, "read": _read_bytes() - got, "count": n}
    del result
    return out


def run_big(mib: int, reps: int, directory: str, have_torch: bool) -> list[dict[str, Any]]:
    """Open a file of 256 tensors and ``mib`` MiB, warm and cold, torchless and torch."""
    path = os.path.join(directory, "open-big.pt")
    per = max(1, (mib << 20) // 256 // 4)
    if have_torch:
        import torch

        torch.save({f"layers.{i}.weight": torch.ones(per) for i in range(256)}, path)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import bench_read

        bench_read.save_builtin({f"layers.{i}.weight": bench_read.Spec("float32", (per,), i)
                                 for i in range(256)}, {"zip": path})
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)  # dirty pages cannot be evicted
    os.close(fd)
    readers = ["torchless"] + (["torch-mmap"] if have_torch else [])
    rows = []
    for cold in (False, True):
        samples: dict[str, list[dict[str, float]]] = {r: [] for r in readers}
        for _ in range(reps):
            for reader in readers:
                samples[reader].append(_in_child(reader, path, traced=False, big=cold))
        for reader in readers:
            rows.append({"mib": mib, "reader": reader, "cache": "cold" if cold else "warm",
                         **{k: statistics.median(s[k] for s in samples[reader])
                            for k in ("seconds", "rss", "read")}})
    os.unlink(path)
    return rows


def _write(count: int, path: str, have_torch: bool, floats: int = 4) -> None:
    if have_torch:
        import torch

        torch.save({f"layers.{i}.weight": torch.zeros(floats) for i in range(count)}, path)
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_read

    tree = {f"layers.{i}.weight": bench_read.Spec("float32", (floats,), i)
            for i in range(count)}
    bench_read.save_builtin(tree, {"zip": path})


def run(counts: list[int], reps: int, directory: str, have_torch: bool,
        readers: list[str], sizes: tuple[int, ...] = (4,)) -> dict[str, Any]:
    results: dict[str, Any] = {"counts": counts, "floats": list(sizes), "reps": reps,
                               "rows": []}
    for count, floats in ((c, f) for f in sizes for c in counts):
        path = os.path.join(directory, f"open-{count}x{floats}.pt")
        _write(count, path, have_torch, floats)
        with open(path, "rb") as f:  # warm the page cache
            while f.read(1 << 24):
                pass
        for reader in readers:  # lazy imports and one-time set-up happen before the forks
            _op(reader, path)()
        samples: dict[str, list[dict[str, float]]] = {r: [] for r in readers}
        for _ in range(reps):
            for reader in readers:
                samples[reader].append(_in_child(reader, path, traced=False))
        counts_seen = {samples[r][0]["count"] for r in readers}
        if counts_seen != {count}:
            raise SystemExit(f"readers disagree about the tensor count of {path}: "
                             f"{ {r: samples[r][0]['count'] for r in readers} }")
        for reader in readers:
            traced = _in_child(reader, path, traced=True) if reader != "torch-wo" else {}
            seconds = statistics.median(s["seconds"] for s in samples[reader])
            cpu = statistics.median(s["cpu"] for s in samples[reader])
            rss = statistics.median(s["rss"] for s in samples[reader])
            results["rows"].append({
                "count": count, "floats": floats, "reader": reader, "seconds": seconds,
                "cpu": cpu,
                "us_per_tensor": seconds / count * 1e6, "rss_per_tensor": rss / count,
                "traced_per_tensor": traced["traced"] / count if traced else None,
                "tensors": samples[reader][0]["count"]})
        os.unlink(path)
    return results


def big_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| file | cache | reader | open and list | RSS added | read from storage |",
             "|---|---|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['mib']} MiB, 256 tensors | {r['cache']} | {r['reader']} | "
                     f"{r['seconds']:.3f} s | {r['rss'] / 2**20:.1f} MiB | "
                     f"{r['read'] / 2**20:.2f} MiB |")
    return "\n".join(lines)


def table(results: dict[str, Any]) -> str:
    rows = results["rows"]
    lines = [f"| tensors | floats each | reader | time (median of {results['reps']}) | "
             "µs/tensor | CPU | RSS B/tensor | traced B/tensor | torchless time / this (CPU) |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        ours = next((r for r in rows if r["count"] == row["count"]
                     and r["floats"] == row["floats"] and r["reader"] == "torchless"), None)
        ratio = "" if ours is None else (f"{ours['seconds'] / row['seconds']:.2f}x "
                                         f"({ours['cpu'] / row['cpu']:.2f}x)")
        traced = "" if row["traced_per_tensor"] is None else f"{row['traced_per_tensor']:,.0f}"
        lines.append(f"| {row['count']:,} | {row['floats']:,} | {row['reader']} | "
                     f"{row['seconds']:.3f} s | "
                     f"{row['us_per_tensor']:.1f} | {row['cpu']:.3f} s | "
                     f"{row['rss_per_tensor']:,.0f} | {traced} | "
                     f"{ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # type: ignore[union-attr]
    ap.add_argument("--counts", default="30000,100000",
                    help="tensor counts, comma-separated (30000,100000)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions per reader (5)")
    ap.add_argument("--floats", default="4,2800",
                    help="float32 elements per tensor, comma-separated (4,2800)")
    ap.add_argument("--no-torch", action="store_true", help="leave torch out")
    ap.add_argument("--readers", default=",".join(READERS),
                    help=f"which readers, comma-separated ({','.join(READERS)})")
    ap.add_argument("--dir", help="where to write the files (default: a temporary directory)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--big-mib", type=int, default=None,
                    help="size of the 256-tensor file opened warm and cold (2048; 0: skip)")
    ap.add_argument("--quick", action="store_true",
                    help="300 tensors, a 4 MiB file, one repetition")
    args = ap.parse_args(argv)
    counts = [300] if args.quick else [int(c) for c in args.counts.split(",")]
    reps = 1 if args.quick else args.reps
    have_torch = not args.no_torch
    if have_torch:
        try:
            import torch  # noqa: F401 - imported before the forks
        except ImportError:
            have_torch = False
    import torchless  # noqa: F401 - imported before the forks

    big = args.big_mib if args.big_mib is not None else 4 if args.quick else 2048
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        readers = [r for r in args.readers.split(",") if have_torch or r != "torch-wo"]
        sizes = (4,) if args.quick else tuple(int(f) for f in args.floats.split(","))
        results = run(counts, reps, d, have_torch, readers, sizes)
        results["big"] = run_big(big, reps, d, have_torch) if big else []
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        print(table(results))
        if results["big"]:
            print()
            print(big_table(results["big"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
