#!/usr/bin/env python
"""Conversion and start-up benchmark: torchless against the copy floor, cp, the torch path
and peer converters, in one interleaved run.

Usage::

    python benchmarks/convert.py                     # 512 MiB f32 and bf16, 20,000 small
    python benchmarks/convert.py --mib 512,2048 --big 256 --reps 5
    python benchmarks/convert.py --mib 8192 --files f32 --reps 1 --methods torchless,floor,cp+sync
    python benchmarks/convert.py --peers /path/to/venv   # + ptloader, pt-safe-loader from it
    python benchmarks/convert.py --json > results.json
    python benchmarks/convert.py --quick             # tiny files, 1 repetition: a smoke run

It writes checkpoints into a temporary directory (``torch.save``; above 2 GiB the built-in
writer of ``bench_read.py``, the same layout, tensor by tensor so that making the file does
not need its size in memory):

* ``f32``    ``--big`` float32 matrices, ``--mib`` MiB in all (one file per size);
* ``bf16``   ``--many`` bfloat16 tensors of mixed sizes, ``--mib`` MiB in all;
* ``small``  ``--small`` float32 tensors of 2,800 values (20,000: 214 MiB), whatever
             ``--mib``: the per-tensor cost (optimizer states, MoE models);

and measures, for each file, every way of producing a file of the same size beside it:

* ``torchless``  ``torchless.convert(src, dst)`` (kernel copies, fsync, atomic link);
* ``torchless-nofsync``  the same with ``os.fsync`` made a no-op in that child: the
                 like-for-like figure against ``cp``, ``floor-nofsync`` and the torch path,
                 which leave their output in the page cache;
* ``torchless-certificate``  ``torchless.convert(src, dst, certificate=True)``: the
                 same, every tensor hashed (BLAKE2b) and the source file's sha256 taken;
* ``floor``      the floor script: a Python process that copies the whole file with
                 ``os.copy_file_range`` (else ``os.sendfile``) and fsyncs it: no parsing, no
                 header, the least a durable conversion can cost;
* ``floor-nofsync``  the same without the fsync;
* ``cp``, ``cp+sync``  the ``cp`` command, and ``cp`` then ``sync DST`` (fsync);
* ``torch``      ``torch.load(src, mmap=True, weights_only=True)`` then
                 ``safetensors.torch.save_file`` (the usual recipe);
* ``c-pickle``   not a converter anyone should run, a bound: what a converter costs that
                 does only the least work per tensor, at C speed where Python allows it.
                 :mod:`zipfile` reads the directory, the C unpickler (stub globals: no
                 torch, nothing checked) reads ``data.pkl``, and each tensor's member is
                 found by its local header and copied with one ``pread`` into a 4 MiB
                 buffer written out whole, then fsync. It shows how far the per-tensor
                 targets are from what C ``pickle`` itself reaches;
* ``ptloader``   with ``--peers VENV`` (a virtual environment holding ``ptloader`` and
                 ``safetensors``): ``ptloader.load(src)`` (C ``pickle``) then
                 ``safetensors.numpy.save_file``;
* ``pt-safe-loader``  with ``--peers VENV`` holding it:
                 ``PtCheckpoint.load(src).export(..., format="safetensors")``.

Every measurement runs in a fresh process started by this small process (the files are
written by another child, so that no child inherits torch's memory), the methods
interleaved within each repetition so that drift on a shared machine hits them alike.
``seconds`` is the wall time of the whole process, interpreter start and imports included:
what a user waits for. ``op`` is the time of the operation itself, taken inside that
process after its imports (for ``cp``, the whole process). Peak RSS is the child's
``VmHWM``; for ``cp`` it is ``ru_maxrss`` from ``wait4`` (an upper bound: it also counts
this launcher's peak, inherited across fork and exec). Each file is read once before
anything is measured, so every figure is warm-cache (the page cache cannot be dropped
without root). The output is deleted and ``sync`` run between measurements, outside the
timing. Reported figures are medians.

``--startup N`` (default 15) also times, interleaved, whole processes: ``python -c pass``,
``python -c "import numpy"``, ``torchless --version`` and ``torchless inspect`` of the
bundled ``examples/tiny.pt`` (through ``python -m torchless``), and prints each as a ratio
to ``import numpy``.

Targets (issue 16): durable conversion <= 1.15x ``cp+sync`` and <= 1.3x the floor for large
files, <= 3x the floor and faster than ptloader for 20,000 small tensors, peak RSS <= 64 MiB
flat in size; ``--version`` and ``inspect`` <= 1.5x ``import numpy``. Durable is judged
against durable (torchless / floor, cp+sync), page cache against page cache
(torchless-nofsync / floor-nofsync, cp).
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
from bench_read import Spec, human, log, save_builtin, save_with_torch

MiB = 1 << 20
#: What --quick sets (options given explicitly still win): seconds, not figures.
QUICK = {"mib": "1", "big": 2, "many": 16, "small": 200, "reps": 1, "startup": 3}
METHODS = ("torchless", "torchless-nofsync", "torchless-certificate", "floor", "floor-nofsync",
           "c-pickle", "cp", "cp+sync", "torch", "ptloader", "pt-safe-loader")
PEERS = ("ptloader", "pt-safe-loader")
FILES = ("f32", "bf16", "small")
#: Above this size the files are written by the built-in writer (bounded memory).
TORCH_WRITER_MAX = 2048 * MiB
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "examples", "tiny.pt")

_CHILD = {
    "torchless": (
        "import torchless",
        "torchless.convert(SRC, DST)",
    ),
    "torchless-nofsync": (
        "import os, torchless\nos.fsync = lambda fd: None",
        "torchless.convert(SRC, DST)",
    ),
    "torchless-certificate": (
        "import torchless",
        "torchless.convert(SRC, DST, certificate=True)",
    ),
    "floor": ("import os\nSYNC = True", "FLOOR"),
    "floor-nofsync": ("import os\nSYNC = False", "FLOOR"),
    "c-pickle": ("import json, os, pickle, struct, zipfile", "CPICKLE"),
    "torch": (
        "import torch, safetensors.torch",
        "sd = torch.load(SRC, mmap=True, weights_only=True)\n"
        "safetensors.torch.save_file(sd, DST, metadata={'format': 'pt'})",
    ),
    "ptloader": (
        "import ptloader, safetensors.numpy",
        "sd = ptloader.load(SRC)\n"
        "safetensors.numpy.save_file(sd, DST, metadata={'format': 'pt'})",
    ),
    "pt-safe-loader": (
        "import os, pt_loader",
        "pt_loader.PtCheckpoint.load(SRC).export(os.path.basename(DST), "
        "dir=os.path.dirname(DST), format='safetensors', overwrite=True)",
    ),
}
#: The floor script: the whole file copied by the kernel, then (if SYNC) fsynced.
_FLOOR = """\
fi = os.open(SRC, os.O_RDONLY)
fo = os.open(DST, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
size, done = os.fstat(fi).st_size, 0
try:
    while done < size:
        done += os.copy_file_range(fi, fo, size - done, done)
except OSError:
    while done < size:
        done += os.sendfile(fo, fi, done, min(size - done, 1 << 30))
if SYNC:
    os.fsync(fo)
os.close(fo)
os.close(fi)"""
#: The c-pickle bound: the least per-tensor work, unchecked (the benchmark's own files only:
#: contiguous tensors, each its own member). Not safe: never run it on a file you did not make.
_CPICKLE = """\
DTYPES = {"FloatStorage": "F32", "BFloat16Storage": "BF16", "HalfStorage": "F16",
          "DoubleStorage": "F64", "LongStorage": "I64", "IntStorage": "I32"}
WIDTH = {"F32": 4, "BF16": 2, "F16": 2, "F64": 8, "I64": 8, "I32": 4}
class Storage:
    def __init__(self, dtype, key):
        self.dtype, self.key = dtype, key
def rebuild(storage, offset, size, *rest):
    return storage, size
class Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if name == "_rebuild_tensor_v2":
            return rebuild
        if name in DTYPES:
            return DTYPES[name]
        return lambda *a, **k: {}
    def persistent_load(self, pid):
        return Storage(pid[1], pid[2])
with zipfile.ZipFile(SRC) as z:
    infos = {i.filename: i for i in z.infolist()}
    pkl = next(n for n in infos if n.endswith("/data.pkl"))
    base = pkl[:-len("data.pkl")] + "data/"
    with z.open(pkl) as f:
        tree = Unpickler(f).load()
fi = os.open(SRC, os.O_RDONLY)
fo = os.open(DST, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
header, runs, at = {}, [], 0
for name, (storage, size) in tree.items():
    info = infos[base + storage.key]
    n = 1
    for d in size:
        n *= d
    n *= WIDTH[storage.dtype]
    name_len, extra_len = struct.unpack("<HH", os.pread(fi, 4, info.header_offset + 26))
    runs.append((info.header_offset + 30 + name_len + extra_len, n))
    header[name] = {"dtype": storage.dtype, "shape": list(size), "data_offsets": [at, at + n]}
    at += n
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
buf = bytearray(struct.pack("<Q", len(text)) + text)
for offset, n in runs:
    buf += os.pread(fi, n, offset)
    if len(buf) >= 4 << 20:
        os.write(fo, buf)
        buf = bytearray()
os.write(fo, buf)
os.fsync(fo)
os.close(fo)
os.close(fi)"""
#: A child process that times one operation and prints its seconds and peak RSS (JSON).
TIMED_CHILD = """\
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


def small_tree(count: int) -> dict[str, Spec]:
    """``count`` float32 tensors of 2,800 values (11,200 bytes) each."""
    return {f"state.{i}.exp_avg": Spec("float32", (2800,), 20000 + i) for i in range(count)}


def _child_argv(method: str, src: str, dst: str, peers: str | None) -> list[str]:
    if method == "cp":
        return ["cp", src, dst]
    if method == "cp+sync":
        return ["sh", "-c", 'cp "$0" "$1" && sync "$1"', src, dst]
    imports, op = _CHILD[method]
    python = sys.executable
    if method in PEERS:
        assert peers is not None
        python = os.path.join(peers, "bin", "python")
    code = TIMED_CHILD.format(imports=imports,
                              op={"FLOOR": _FLOOR, "CPICKLE": _CPICKLE}.get(op, op))
    return [python, "-c", code, src, dst]


class Failed(Exception):
    """A method that cannot convert this file (a peer without bfloat16 …)."""


def _env() -> dict[str, str]:
    """This checkout's torchless first on the path; bytecode written and used, as an
    installed package has it."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(ROOT, "src"),
                                                    env.get("PYTHONPATH")) if p)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def measure(argv: list[str], what: str) -> dict[str, float]:
    """One process: its wall time, its own figure for the operation, its peak RSS, and the
    CPU time (user + system, all its threads) it used."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    _, status, usage = os.wait4(proc.pid, 0)  # the outputs are a line: no pipe fills up
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    out = proc.stdout.read() if proc.stdout else b""
    err = proc.stderr.read() if proc.stderr else b""
    if proc.returncode != 0:
        raise Failed(f"{what} failed: " + (err.decode(errors="replace").strip().splitlines()
                                           or ["?"])[-1])
    got = json.loads(out.splitlines()[-1]) if out.strip() else {}
    rss = got.get("rss") or usage.ru_maxrss * 1024
    return {"seconds": wall, "op": got.get("seconds", wall), "rss": rss,
            "cpu": usage.ru_utime + usage.ru_stime}


def warm(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(16 * MiB):
            pass


def _available(methods: list[str], peers: str | None) -> list[str]:
    out = []
    for m in methods:
        if m in PEERS:
            module = {"ptloader": "ptloader", "pt-safe-loader": "pt_loader"}[m]
            python = os.path.join(peers, "bin", "python") if peers else None
            if python is None or subprocess.run(
                    [python, "-c", f"import {module}, safetensors"],
                    capture_output=True).returncode != 0:
                log(f"{m}: not measured (give --peers VENV with it and safetensors)")
                continue
        if m == "torch" and subprocess.run(
                [sys.executable, "-c", "import torch, safetensors"],
                capture_output=True).returncode != 0:
            log("torch: not measured (torch and safetensors are not installed)")
            continue
        out.append(m)
    return out


def run_file(src: str, methods: list[str], reps: int, work: str,
             peers: str | None) -> dict[str, Any]:
    warm(src)
    size = os.path.getsize(src)
    samples: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
    failed: dict[str, str] = {}
    for rep in range(reps):
        for method in methods:  # interleaved, so drift hits every method alike
            if method in failed:
                continue
            dst = os.path.join(work, f"out-{method}.safetensors")
            os.sync()  # no writeback of an earlier output left to slow this one
            try:
                samples[method].append(measure(_child_argv(method, src, dst, peers),
                                               f"{method} on {os.path.basename(src)}"))
            except Failed as e:
                if method not in PEERS:
                    raise SystemExit(str(e)) from None
                log(f"  {e}")
                failed[method] = str(e)
            for leftover in os.listdir(work):
                if leftover.startswith("out-"):
                    os.unlink(os.path.join(work, leftover))
        log(f"  rep {rep + 1}/{reps} done")
    med = {m: {k: statistics.median(s[k] for s in samples[m]) for k in ("seconds", "op", "rss")}
           for m in methods if m not in failed}
    return {"bytes": size, "median": med, "samples": samples, "failed": failed}


def startup(reps: int) -> dict[str, Any]:
    py = sys.executable
    cmds = {"python -c pass": [py, "-c", "pass"],
            "import numpy": [py, "-c", "import numpy"],
            "torchless --version": [py, "-m", "torchless", "--version"],
            "torchless inspect tiny.pt": [py, "-m", "torchless", "inspect", TINY]}
    samples: dict[str, list[float]] = {k: [] for k in cmds}
    env = _env()
    for argv in cmds.values():  # compiled bytecode in place, as an installed package has
        subprocess.run(argv, env=env, capture_output=True, check=True)
    for _ in range(reps):
        for k, argv in cmds.items():
            t0 = time.perf_counter()
            subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)
            samples[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in samples.items()}
    return {"median": med, "ratio": {k: v / med["import numpy"] for k, v in med.items()},
            "samples": samples}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", default="512", help="sizes of the f32 and bf16 files (MiB), "
                                                "comma-separated")
    p.add_argument("--big", type=int, default=24, help="float32 matrices in the f32 file")
    p.add_argument("--many", type=int, default=2000, help="tensors in the bf16 file")
    p.add_argument("--small", type=int, default=20000, help="tensors in the small file")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--files", default=",".join(FILES),
                   help=f"comma-separated subset of {','.join(FILES)} (all)")
    p.add_argument("--methods", default=",".join(METHODS),
                   help=f"comma-separated subset of {','.join(METHODS)} (all that run)")
    p.add_argument("--peers", metavar="VENV", help="a virtual environment with ptloader, "
                   "pt-safe-loader and safetensors installed")
    p.add_argument("--startup", type=int, default=15, metavar="N",
                   help="repetitions of the start-up timings (0: none)")
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
    methods = [m for m in args.methods.split(",") if m]
    if not files or set(files) - set(FILES):
        p.error(f"--files: a comma-separated subset of {','.join(FILES)}")
    if set(methods) - set(METHODS):
        p.error(f"--methods: a comma-separated subset of {','.join(METHODS)}")
    sizes = [int(x) for x in args.mib.split(",") if x]
    if args.generate:
        return generate(args.generate, files, sizes, args)

    work = tempfile.mkdtemp(prefix="torchless-convert-", dir=args.dir)
    results: dict[str, Any] = {"files": {}}
    try:
        log(f"writing checkpoints into {work}")
        # in a child: this process must stay small, since a child inherits its peak RSS
        subprocess.run([sys.executable, __file__, "--generate", work, "--mib", args.mib,
                        "--big", str(args.big), "--many", str(args.many), "--small",
                        str(args.small), "--files", ",".join(files)], check=True)
        methods = _available(methods, args.peers)
        out = os.path.join(work, "out")
        os.mkdir(out)
        for name in sorted(os.listdir(work)):
            if not name.endswith(".pt"):
                continue
            src = os.path.join(work, name)
            log(f"{name}: {human(os.path.getsize(src))}")
            results["files"][name[:-3]] = run_file(src, methods, args.reps, out, args.peers)
            os.unlink(src)  # room for the next size
        if args.startup:
            log("start-up")
            results["startup"] = startup(args.startup)
        print_results(results, args.json)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def generate(directory: str, files: list[str], sizes: list[int], args: Any) -> int:
    for mib in sizes:
        save = save_with_torch if mib * MiB <= TORCH_WRITER_MAX else save_builtin
        if "f32" in files:
            save(f32_tree(mib * MiB, args.big), {"zip": os.path.join(directory,
                                                                    f"f32-{mib}M.pt")})
        if "bf16" in files:
            save(bf16_tree(mib * MiB, args.many), {"zip": os.path.join(directory,
                                                                      f"bf16-{mib}M.pt")})
    if "small" in files:
        save_with_torch(small_tree(args.small), {"zip": os.path.join(
            directory, f"small-{args.small}.pt")})
    return 0


def ratios(med: dict[str, dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    pairs = [("torchless", "cp+sync"), ("torchless", "floor"),
             ("torchless-certificate", "torchless"),
             ("torchless-nofsync", "cp"), ("torchless-nofsync", "floor-nofsync"),
             ("torchless", "c-pickle"), ("c-pickle", "floor"),
             ("torch", "torchless-nofsync"), ("ptloader", "torchless-nofsync"),
             ("ptloader", "torchless"), ("pt-safe-loader", "torchless-nofsync")]
    for a, b in pairs:
        if a in med and b in med:
            out[f"{a}/{b}"] = med[a]["seconds"] / med[b]["seconds"]
    return out


def targets(name: str, r: dict[str, Any]) -> dict[str, bool]:
    """Issue 16's targets that this run's methods can judge."""
    q, med = r["ratios"], r["median"]
    out: dict[str, bool] = {}
    if name.startswith("small"):
        if "torchless/floor" in q:
            out["<= 3x floor"] = q["torchless/floor"] <= 3
        if "ptloader/torchless" in q:
            out["faster than ptloader"] = q["ptloader/torchless"] > 1
        return out
    if "torchless/cp+sync" in q:
        out["<= 1.15x cp+sync"] = q["torchless/cp+sync"] <= 1.15
    if "torchless/floor" in q:
        out["<= 1.3x floor"] = q["torchless/floor"] <= 1.3
    if "torchless" in med:
        out["peak RSS <= 64 MiB"] = med["torchless"]["rss"] <= 64 * MiB
    return out


def print_results(results: dict[str, Any], as_json: bool) -> None:
    for name, r in results["files"].items():
        r["ratios"] = ratios(r["median"])
        r["targets"] = targets(name, r)
    if "startup" in results:
        st = results["startup"]
        st["targets"] = {f"{k} <= 1.5x import numpy": st["ratio"][k] <= 1.5
                         for k in ("torchless --version", "torchless inspect tiny.pt")}
    if as_json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'file':<14} {'method':<18} {'seconds':>8} {'op':>8} {'peak RSS':>10}  GB/s")
    for name, r in results["files"].items():
        for m, s in r["median"].items():
            print(f"{name:<14} {m:<18} {s['seconds']:8.3f} {s['op']:8.3f} "
                  f"{human(s['rss']):>10}  {r['bytes'] / s['seconds'] / 1e9:5.2f}")
        print(f"{name:<14} {human(r['bytes'])}: "
              + ", ".join(f"{k} {v:.2f}x" for k, v in r["ratios"].items()))
        for m, why in r["failed"].items():
            print(f"{name:<14} {m}: {why}")
        print(f"{name:<14} targets: " + ", ".join(
            f"{k}: {'yes' if ok else 'NO'}" for k, ok in r["targets"].items()))
    if "startup" in results:
        st = results["startup"]
        print(f"\n{'start-up (whole process)':<28} {'median':>8}  x import numpy")
        for k, v in st["median"].items():
            print(f"{k:<28} {v * 1000:6.0f} ms  {st['ratio'][k]:5.2f}")
        print("targets: " + ", ".join(f"{k}: {'yes' if ok else 'NO'}"
                                      for k, ok in st["targets"].items()))


if __name__ == "__main__":
    sys.exit(main())
