#!/usr/bin/env python
"""Read benchmark: torchless against torch.load on the same files, in one run.

Usage::

    python benchmarks/bench_read.py                  # defaults: ~1 GiB files, 5 repetitions
    python benchmarks/bench_read.py --big-mib 64 --many-tensors 3000 --reps 3
    python benchmarks/bench_read.py --json > results.json
    python benchmarks/bench_read.py --quick          # tiny files, 1 repetition: a smoke run

It writes three checkpoints into a temporary directory:

* ``big``     a state dict of ``--big-tensors`` float32/bfloat16 matrices, ``--big-mib`` in all;
* ``many``    an Adam-like optimizer state of ``--many-tensors`` small tensors
              (``state.<i>.step|exp_avg|exp_avg_sq`` and ``param_groups``);
* ``legacy``  the ``big`` dict again, saved with ``_use_new_zipfile_serialization=False``.

and measures, for every file and every reader:

* ``list``  open the file and list its tensors (name, dtype, shape): metadata only;
* ``read``  open the file and read every byte of every tensor (``--touch full``: an XOR of
            all 8-byte words of each tensor; ``--touch page``: one byte per 4 KiB page);

with the readers ``torchless`` (``torchless.open``), ``torch-mmap``
(``torch.load(mmap=True)``, ZIP files only), ``torch`` (``torch.load``), the drop-in
``dropin`` (``torchless.torch.load``) and ``dropin-mmap`` (``torchless.torch.load(mmap=True)``,
ZIP files only, as torch), plus ``copy``: ``shutil.copyfileobj`` of the file into a null sink,
the floor for reading the bytes at all. ``--readers`` picks some of them; the drop-in's peak
RSS against torch's, each in a fresh process of the same run::

    python benchmarks/bench_read.py --files big --big-mib 64 --reps 1 \
        --readers torch,torch-mmap,dropin,dropin-mmap

Every measurement runs in a fresh process. By default (``--isolation fork``) that process is
forked from a per-reader server that has already imported the reader's libraries and has
done nothing else, so each measurement starts in the state of a process that has just run
``import torch`` (or ``import torchless``) and import time stays out of the figures
(it is reported once on its own). ``--isolation exec`` starts a new interpreter per
measurement instead (slower: ``import torch`` takes seconds). Peak RSS is
``getrusage(RUSAGE_SELF).ru_maxrss`` of that process; it counts pages of the file mapped
into the process, which the kernel can drop, as well as anonymous memory, so the RSS made of
anonymous and file pages at the end of the operation is reported too.

The page cache cannot be dropped without root, so each file is read once before anything
is measured: every figure is warm-cache.

All readers must agree on the tensor count and the checksum of every file; the run ends
with an error if they do not. Without torch installed, the files are written by a small
built-in writer of the same layouts, and only torchless and the copy floor are measured.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import io
import json
import math
import os
import platform
import random
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

MiB = 1 << 20
#: What --quick sets (options given explicitly still win): seconds, not figures.
QUICK = {"big_mib": 1, "big_tensors": 4, "many_tensors": 30, "reps": 1}
READERS = ("torchless", "torch-mmap", "torch", "dropin", "dropin-mmap", "copy")
OPS = ("list", "read")
FILES = ("big", "many", "legacy")
#: Which server process runs a reader (the libraries it has imported).
SERVER = {"torchless": "torchless", "torch-mmap": "torch", "torch": "torch",
          "dropin": "dropin", "dropin-mmap": "dropin", "copy": "plain"}
#: The readers that give torch objects, and whether they map the file.
TORCH_READERS = {"torch": False, "torch-mmap": True, "dropin": False, "dropin-mmap": True}
COPY_CHUNK = 1 << 20
PAGE = 4096


# ---------------------------------------------------------------------------------------
# The files: one description, written by torch.save or by the built-in writer
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """One tensor to write: dtype name, shape (contiguous) and the seed of its values."""

    dtype: str
    shape: tuple[int, ...]
    seed: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


ITEMSIZE = {"float32": 4, "bfloat16": 2}
STORAGE_CLASS = {"float32": "FloatStorage", "bfloat16": "BFloat16Storage"}


_POOL: list[Any] = []


def values(spec: Spec) -> Any:
    """The tensor's values as a NumPy array (bfloat16 as its uint16 bit patterns): a pool of
    random floats repeated from an offset that depends on the seed (fast to make)."""
    import numpy as np

    if not _POOL:
        f32 = np.random.default_rng(0).random(1 << 22, dtype=np.float32) - 0.5
        _POOL.extend([f32, (f32.view(np.uint32) >> 16).astype(np.uint16)])
    pool = _POOL[0] if spec.dtype == "float32" else _POOL[1]
    start, n = (spec.seed * 7919) % (pool.size // 2), spec.numel
    flat = pool[start:start + n].copy() if start + n <= pool.size else np.resize(pool[start:], n)
    return flat.reshape(spec.shape)


def big_tree(total_bytes: int, count: int) -> dict[str, Any]:
    """A flat state dict of ``count`` matrices, alternating float32 and bfloat16."""
    weights = [1.0 + ((i * 37) % 11) / 10.0 for i in range(count)]
    scale = total_bytes / sum(weights)
    tree: dict[str, Any] = {}
    for i, w in enumerate(weights):
        dtype = "float32" if i % 2 == 0 else "bfloat16"
        nbytes = w * scale
        cols = 1024 if nbytes >= 1024 * ITEMSIZE[dtype] else 16
        rows = max(1, round(nbytes / (cols * ITEMSIZE[dtype])))
        tree[f"layers.{i // 2}.{'attn' if i % 2 == 0 else 'mlp'}.weight"] = \
            Spec(dtype, (rows, cols), 1000 + i)
    return tree


def many_tree(count: int) -> dict[str, Any]:
    """An Adam-like optimizer state: per parameter a 0-d ``step`` and two moment tensors."""
    sizes = [(8,), (64,), (16, 32), (2048,), (32, 48)]
    nparams = max(1, count // 3)
    state: dict[int, Any] = {}
    for i in range(nparams):
        shape = sizes[i % len(sizes)]
        state[i] = {"step": Spec("float32", (), 3 * i),
                    "exp_avg": Spec("float32", shape, 3 * i + 1),
                    "exp_avg_sq": Spec("float32", shape, 3 * i + 2)}
    groups = [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0,
               "amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
               "differentiable": False, "fused": None, "params": list(range(nparams))}]
    return {"state": state, "param_groups": groups}


def tree_specs(tree: Any) -> Iterator[Spec]:
    if isinstance(tree, Spec):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from tree_specs(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from tree_specs(v)


def save_with_torch(tree: Any, paths: dict[str, str]) -> None:
    import torch

    def build(node: Any) -> Any:
        if isinstance(node, Spec):
            arr = values(node)
            if node.dtype == "bfloat16":
                return torch.from_numpy(arr.view("int16")).view(torch.bfloat16)
            return torch.from_numpy(arr)
        if isinstance(node, dict):
            return {k: build(v) for k, v in node.items()}
        if isinstance(node, list):
            return [build(v) for v in node]
        if isinstance(node, tuple):
            return tuple(build(v) for v in node)
        return node

    obj = build(tree)
    if "zip" in paths:
        torch.save(obj, paths["zip"])
    if "legacy" in paths:
        torch.save(obj, paths["legacy"], _use_new_zipfile_serialization=False)


class PickleWriter:
    """Emits protocol-2 pickle opcodes for a tree of Specs the way torch.save pickles it,
    without torch (torch's globals cannot be pickled by reference when torch is absent)."""

    def __init__(self, legacy: bool) -> None:
        self.out = bytearray(b"\x80\x02")
        self.memo: dict[tuple[str, str], int] = {}
        self.legacy = legacy
        self.storages: list[Spec] = []

    def op_global(self, module: str, name: str) -> None:
        idx = self.memo.get((module, name))
        if idx is not None:
            self.out += b"h" + bytes([idx]) if idx < 256 else b"j" + struct.pack("<I", idx)
            return
        self.out += f"c{module}\n{name}\n".encode()
        idx = self.memo[(module, name)] = len(self.memo)
        self.out += b"q" + bytes([idx]) if idx < 256 else b"r" + struct.pack("<I", idx)

    def value(self, v: Any) -> None:
        out = self.out
        if isinstance(v, Spec):
            self.tensor(v)
        elif v is None:
            out += b"N"
        elif isinstance(v, bool):
            out += b"\x88" if v else b"\x89"
        elif isinstance(v, int):
            if 0 <= v < 256:
                out += b"K" + bytes([v])
            elif 0 <= v < 65536:
                out += b"M" + struct.pack("<H", v)
            elif -(1 << 31) <= v < (1 << 31):
                out += b"J" + struct.pack("<i", v)
            else:
                raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
                out += b"\x8a" + bytes([len(raw)]) + raw
        elif isinstance(v, float):
            out += b"G" + struct.pack(">d", v)
        elif isinstance(v, str):
            raw = v.encode()
            out += b"X" + struct.pack("<I", len(raw)) + raw
        elif isinstance(v, tuple):
            out += b"("
            for x in v:
                self.value(x)
            out += b"t"
        elif isinstance(v, list):
            out += b"]("
            for x in v:
                self.value(x)
            out += b"e"
        elif isinstance(v, dict):
            out += b"}"
            items = list(v.items())
            for i in range(0, len(items), 1000):
                out += b"("
                for k, x in items[i:i + 1000]:
                    self.value(k)
                    self.value(x)
                out += b"u"
        else:
            raise TypeError(f"cannot write {type(v).__name__}")

    def tensor(self, spec: Spec) -> None:
        key = str(len(self.storages))
        self.storages.append(spec)
        self.op_global("torch._utils", "_rebuild_tensor_v2")
        self.out += b"(("
        self.value("storage")
        self.op_global("torch", STORAGE_CLASS[spec.dtype])
        for v in (key, "cpu", spec.numel):
            self.value(v)
        if self.legacy:
            self.value(None)
        self.out += b"tQ"  # persistent id
        stride, acc = [], 1
        for s in reversed(spec.shape):
            stride.append(acc)
            acc *= s
        self.value(0)
        self.value(spec.shape)
        self.value(tuple(reversed(stride)))
        self.value(False)
        self.op_global("collections", "OrderedDict")
        self.out += b")R"  # OrderedDict()
        self.out += b"tR"

    def finish(self) -> bytes:
        return bytes(self.out + b".")


def save_builtin(tree: Any, paths: dict[str, str]) -> None:
    """The same layouts as torch.save: ZIP with 64-byte aligned stored records, legacy stream."""
    if "zip" in paths:
        w = PickleWriter(legacy=False)
        w.value(tree)
        with open(paths["zip"], "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as zf:
            records: list[tuple[str, Callable[[], bytes]]] = [
                ("archive/data.pkl", lambda: w.finish()),
                ("archive/byteorder", lambda: b"little")]

            def data_of(spec: Spec) -> Callable[[], bytes]:
                return lambda: values(spec).tobytes()

            records += [(f"archive/data/{i}", data_of(s)) for i, s in enumerate(w.storages)]
            records.append(("archive/version", lambda: b"3\n"))
            for name, data in records:
                info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
                here = f.tell() + 30 + len(name.encode()) + 4
                pad = -here % 64
                info.extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad
                zf.writestr(info, data())
    if "legacy" in paths:
        import pickle

        w = PickleWriter(legacy=True)
        w.value(tree)
        with open(paths["legacy"], "wb") as f:
            sys_info = {"protocol_version": 1001, "little_endian": sys.byteorder == "little",
                        "type_sizes": {"short": 2, "int": 4, "long": 8}}
            for header in (0x1950A86A20F9469CFC6C, 1001, sys_info):
                pickle.dump(header, f, protocol=2)
            f.write(w.finish())
            pickle.dump([str(i) for i in range(len(w.storages))], f, protocol=2)
            for s in w.storages:
                f.write(struct.pack("<q", s.numel))
                f.write(values(s).tobytes())


def generate(cfg: dict[str, Any]) -> dict[str, Any]:
    """Write the requested files; return what was written (runs in its own process)."""
    out: dict[str, Any] = {}
    save = save_with_torch if cfg["writer"] == "torch" else save_builtin
    d = cfg["dir"]
    wanted = set(cfg["files"])
    t0 = time.perf_counter()
    if wanted & {"big", "legacy"}:
        tree = big_tree(cfg["big_mib"] * MiB, cfg["big_tensors"])
        paths = {}
        if "big" in wanted:
            paths["zip"] = os.path.join(d, "big.pt")
        if "legacy" in wanted:
            paths["legacy"] = os.path.join(d, "big-legacy.pt")
        save(tree, paths)
        tensor_bytes = sum(s.numel * ITEMSIZE[s.dtype] for s in tree_specs(tree))
        for key, name in (("zip", "big"), ("legacy", "legacy")):
            if key in paths:
                out[name] = {"path": paths[key], "tensors": len(tree),
                             "tensor_bytes": tensor_bytes}
    if "many" in wanted:
        tree = many_tree(cfg["many_tensors"])
        path = os.path.join(d, "many.pt")
        save(tree, {"zip": path})
        specs = list(tree_specs(tree))
        out["many"] = {"path": path, "tensors": len(specs),
                       "tensor_bytes": sum(s.numel * ITEMSIZE[s.dtype] for s in specs)}
    for v in out.values():
        v["file_bytes"] = os.path.getsize(v["path"])
    out["_seconds"] = time.perf_counter() - t0
    return out


# ---------------------------------------------------------------------------------------
# Measurements (run in a fresh process)
# ---------------------------------------------------------------------------------------


def import_reader(server: str) -> float:
    """Import what a reader needs; return the seconds it took."""
    t0 = time.perf_counter()
    if server in ("torchless", "torch", "dropin"):
        import numpy  # noqa: F401
    if server in ("torchless", "dropin"):
        import torchless
    if server in ("torch", "dropin"):
        import torch  # noqa: F401
    if server == "dropin":
        # what its first call imports (``import torchless.torch`` alone stays cheap), as
        # ``import torch`` imports all of torch.load: import time stays out of the figures
        import torchless.containers.dcp
        import torchless.containers.zero
        import torchless.inert.store
        import torchless.reader.checkpoint
        import torchless.torch  # noqa: F401
    return time.perf_counter() - t0


def memory() -> dict[str, float | None]:
    """Peak RSS of this process and its current anonymous/file RSS, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak_mib = peak / MiB if sys.platform == "darwin" else peak / 1024
    out: dict[str, float | None] = {"peak_mib": peak_mib, "rss_mib": None, "anon_mib": None,
                                    "file_mib": None}
    with contextlib.suppress(OSError):
        with open("/proc/self/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                field = {"VmRSS": "rss_mib", "RssAnon": "anon_mib", "RssFile": "file_mib"}.get(key)
                if field:
                    out[field] = int(rest.split()[0]) / 1024
    return out


def reset_peak() -> bool:
    """Lower this process's peak RSS to its current RSS (Linux >= 4.0), so that ru_maxrss
    measures the operation and not what the interpreter did before it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def digest(u8: Any, touch: str) -> int:
    """A checksum of one tensor's bytes (a contiguous 1-D uint8 array)."""
    import numpy as np

    if touch == "page":
        return int(u8[::PAGE].sum(dtype=np.uint64))
    n8 = u8.size // 8 * 8
    words = int(np.bitwise_xor.reduce(u8[:n8].view(np.uint64))) if n8 else 0
    return words ^ int(u8[n8:].sum(dtype=np.uint64))


def flatten_torch(obj: Any, prefix: str, out: dict[str, Any]) -> None:
    import torch

    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            flatten_torch(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            flatten_torch(v, f"{prefix}.{i}" if prefix else str(i), out)


class NullSink:
    def write(self, b: Any) -> int:
        return len(b)


def run_op(reader: str, op: str, path: str, touch: str, weights_only: bool) -> dict[str, Any]:
    """One measurement: the operation timed, then memory while its result is still alive."""
    result: dict[str, Any] = {"peak_reset": reset_peak(), "base_mib": memory()["rss_mib"]}
    keep: Any = None
    t0 = time.perf_counter()
    if reader == "copy":
        with open(path, "rb", buffering=0) as f:
            sink = NullSink()
            shutil.copyfileobj(f, sink, COPY_CHUNK)  # type: ignore[misc,unused-ignore]
            result["bytes"] = f.tell()
    elif reader == "torchless":
        import numpy as np

        import torchless

        with torchless.open(path) as ckpt:
            if op == "list":
                keep = [(n, t.dtype, t.shape) for n, t in ckpt.tensors.items()]
                result["count"] = len(keep)
            else:
                total, keep = 0, []
                for t in ckpt.tensors.values():
                    arr = t.numpy()
                    keep.append(arr)
                    total += digest(arr.reshape(-1).view(np.uint8), touch)
                result["count"] = len(keep)
                result["checksum"] = total % (1 << 64)
    else:
        import torch

        if reader.startswith("dropin"):
            import torchless.torch

            load = torchless.torch.load
        else:
            load = torch.load
        obj = load(path, map_location="cpu", weights_only=weights_only,
                   mmap=TORCH_READERS[reader])
        flat: dict[str, Any] = {}
        flatten_torch(obj, "", flat)
        if op == "list":
            keep = [(n, t.dtype, tuple(t.shape)) for n, t in flat.items()]
        else:
            total = 0
            for t in flat.values():
                total += digest(t.detach().reshape(-1).view(torch.uint8).numpy(), touch)
            result["checksum"] = total % (1 << 64)
        result["count"] = len(flat)
        keep = (obj, keep)
    result["seconds"] = time.perf_counter() - t0
    result.update(memory())
    if result["base_mib"] is not None:
        result["op_mib"] = result["peak_mib"] - result["base_mib"]
    del keep
    return result


def run_task(task: dict[str, Any]) -> dict[str, Any]:
    try:
        return run_op(task["reader"], task["op"], task["path"], task["touch"],
                      task["weights_only"])
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}


def serve(server: str) -> None:
    """Import once, then fork one fresh child per task read from stdin (one JSON per line)."""
    print(json.dumps({"import_s": import_reader(server), **memory()}), flush=True)
    for line in sys.stdin:
        task = json.loads(line)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: measure, report through the pipe, leave at once
            os.close(r)
            try:
                data = json.dumps(run_task(task)).encode()
                with os.fdopen(w, "wb") as f:
                    f.write(data)
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            data = f.read()
        _, status = os.waitpid(pid, 0)
        if data:
            print(data.decode(), flush=True)
        else:
            print(json.dumps({"error": f"worker died (wait status {status})"}), flush=True)


class Server:
    """A long-lived process that has imported one reader's libraries."""

    def __init__(self, name: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--_serve", name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = self._reply()

    def _reply(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("benchmark server exited")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def run(self, task: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(task) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait()


def run_in_new_interpreter(task: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--_task", json.dumps(task)],
        capture_output=True, text=True, check=False)
    if out.returncode != 0 or not out.stdout.strip():
        return {"error": f"worker exited with {out.returncode}: {out.stderr[-2000:]}"}
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def task_main(task: dict[str, Any]) -> None:
    import_s = import_reader(SERVER[task["reader"]])
    print(json.dumps({**run_task(task), "import_s": import_s}))


# ---------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_present() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def environment(have_torch: bool) -> dict[str, Any]:
    try:
        affinity: int | None = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": affinity,
        "numpy": version("numpy"),
        "ml_dtypes": version("ml_dtypes"),
        "torch": version("torch") if have_torch else None,
        "torchless": version("torchless"),
        "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def stats(samples: list[float]) -> dict[str, float]:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples)}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def plan(files: dict[str, Any], readers: list[str]) -> list[tuple[str, str, str]]:
    combos = []
    for name in files:
        for op in OPS:
            for reader in readers:
                if reader == "copy" and op == "list":
                    continue
                if TORCH_READERS.get(reader) and name == "legacy":
                    continue  # torch: mmap needs the ZIP layout
                combos.append((name, op, reader))
    return combos


def check(results: dict[str, Any]) -> list[str]:
    """Every reader must see the same tensors and bytes."""
    problems = []
    for name, info in results["files"].items():
        for op in OPS:
            seen: dict[str, set[tuple[int, int | None]]] = {}
            for r in results["runs"]:
                if r["file"] != name or r["op"] != op or "error" in r:
                    continue
                if r["reader"] == "copy":
                    if r["bytes"] != info["file_bytes"]:
                        problems.append(f"{name}: copy read {r['bytes']} bytes")
                    continue
                seen.setdefault(r["reader"], set()).add((r["count"], r.get("checksum")))
            for reader, values_ in seen.items():
                counts = {c for c, _ in values_}
                if counts != {info["tensors"]}:
                    problems.append(f"{name} {op} {reader}: tensor count {sorted(counts)}, "
                                    f"expected {info['tensors']}")
            sums = {s for v in seen.values() for _, s in v}
            if op == "read" and len(sums) > 1:
                problems.append(f"{name} read: readers disagree on the checksum: "
                                f"{ {k: sorted(v) for k, v in seen.items()} }")
        for r in results["runs"]:
            if r["file"] == name and "error" in r:
                problems.append(f"{name} {r['op']} {r['reader']}: {r['error']}")
    return problems


def summarize(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name in results["files"]:
        for op in OPS:
            by_reader: dict[str, list[dict[str, Any]]] = {}
            for r in results["runs"]:
                if r["file"] == name and r["op"] == op and "error" not in r:
                    by_reader.setdefault(r["reader"], []).append(r)
            for reader in READERS:
                runs = by_reader.get(reader)
                if not runs:
                    continue
                row: dict[str, Any] = {"file": name, "op": op, "reader": reader,
                                       "n": len(runs), **stats([r["seconds"] for r in runs])}
                for key in ("base_mib", "peak_mib", "op_mib", "anon_mib", "file_mib"):
                    vals = [r[key] for r in runs if r.get(key) is not None]
                    row[key] = statistics.median(vals) if vals else None
                rows.append(row)
            base = {row["reader"]: row["median"] for row in rows
                    if row["file"] == name and row["op"] == op}
            copy = next((row["median"] for row in rows if row["file"] == name
                         and row["reader"] == "copy"), None)
            for row in rows:
                if row["file"] != name or row["op"] != op:
                    continue
                tl = base.get("torchless")
                row["torchless_over_this"] = (tl / row["median"] if tl is not None
                                              and row["reader"] in TORCH_READERS
                                              else None)
                row["over_copy"] = (row["median"] / copy if copy and op == "read"
                                    and row["reader"] != "copy" else None)
    return rows


def table(results: dict[str, Any]) -> str:
    env = results["environment"]
    cfg = results["config"]
    out = io.StringIO()
    p = out.write
    p("environment\n")
    for key in ("python", "implementation", "platform", "cpu_count", "cpus_usable", "numpy",
                "ml_dtypes", "torch", "torchless", "loadavg_start", "loadavg_end"):
        p(f"  {key:14} {env.get(key) if env.get(key) is not None else 'absent'}\n")
    p(f"  {'isolation':14} {cfg['isolation']}; {cfg['reps']} repetitions; touch={cfg['touch']};"
      f" torch.load weights_only={cfg['weights_only']}\n")
    imports = results.get("imports", {})
    if imports:
        p("  import time    " + ", ".join(
            f"{k} {v['import_s']:.2f} s"
            + (f" (RSS {v['rss_mib']:.0f} MiB)" if v.get("rss_mib") is not None else "")
            for k, v in imports.items()) + "\n")
    p("\nfiles (warm page cache: each was read once before measuring)\n")
    for name, info in results["files"].items():
        p(f"  {name:7} {info['tensors']:6} tensors, {human(info['tensor_bytes'])} of tensor "
          f"data, file {human(info['file_bytes'])}  ({os.path.basename(info['path'])}, "
          f"written by {cfg['writer']})\n")
    p("\n  tl/this  torchless median / this median (below 1: torchless is faster)\n"
      "  xcopy    median / median of the copy floor\n"
      "  base     RSS of the fresh process before the op (its imports done)\n"
      "  peak     its ru_maxrss after the op (high-water mark reset to base at the start)\n"
      "  +op      peak - base: the memory the op needed at its height\n"
      "  anon     anonymous RSS at the end of the op, its result still alive\n"
      "  file     file-backed RSS then (mapped checkpoint pages: the kernel can drop them)\n\n")
    head = (f"  {'file':7} {'op':4} {'reader':11} {'median s':>9} {'min s':>8} {'max s':>8} "
            f"{'tl/this':>7} {'xcopy':>6} {'base MiB':>8} {'peak MiB':>8} {'+op MiB':>8} "
            f"{'anon MiB':>8} {'file MiB':>8}\n")
    p(head)
    p("  " + "-" * (len(head) - 3) + "\n")

    def num(v: float | None, fmt: str) -> str:
        width = int(fmt.split(".")[0])
        return format(v, fmt) if v is not None else "-".rjust(width)

    last = None
    for row in results["summary"]:
        if last is not None and (row["file"], row["op"]) != last:
            p("\n")
        last = (row["file"], row["op"])
        p(f"  {row['file']:7} {row['op']:4} {row['reader']:11} {row['median']:9.4f} "
          f"{row['min']:8.4f} {row['max']:8.4f} {num(row['torchless_over_this'], '7.2f')} "
          f"{num(row['over_copy'], '6.2f')} {num(row['base_mib'], '8.0f')} "
          f"{num(row['peak_mib'], '8.0f')} {num(row['op_mib'], '8.0f')} "
          f"{num(row['anon_mib'], '8.0f')} {num(row['file_mib'], '8.0f')}\n")
    for note in results["notes"]:
        p(f"\nnote: {note}")
    p("\n")
    return out.getvalue()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    doc = __doc__ or ""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                 epilog=doc.split("\n\n", 1)[-1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--big-mib", type=int, default=1024, help="size of the big file (1024)")
    ap.add_argument("--big-tensors", type=int, default=200, help="tensors in it (200)")
    ap.add_argument("--many-tensors", type=int, default=20000,
                    help="tensors in the many-tensor file (20000)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions per measurement (5)")
    ap.add_argument("--files", default=",".join(FILES),
                    help=f"comma-separated subset of {','.join(FILES)}")
    ap.add_argument("--readers", default="",
                    help=f"comma-separated subset of {','.join(READERS)} (default: all)")
    ap.add_argument("--touch", choices=("full", "page"), default="full",
                    help="read every byte (full, default) or one byte per 4 KiB page")
    ap.add_argument("--isolation", choices=("fork", "exec"), default="fork",
                    help="fresh process per measurement: forked from a server that has "
                         "imported the reader (default) or a new interpreter")
    ap.add_argument("--weights-only", choices=("true", "false"), default="true",
                    help="torch.load's weights_only (true: torch's default since 2.6)")
    ap.add_argument("--no-torch", action="store_true",
                    help="behave as if torch were not installed")
    ap.add_argument("--writer", choices=("auto", "torch", "builtin"), default="auto",
                    help="who writes the files: torch.save if torch is there (auto), or the "
                         "built-in writer of the same layouts")
    ap.add_argument("--dir", help="write the files here and keep them (default: a temporary "
                                  "directory, removed at the end)")
    ap.add_argument("--json", action="store_true",
                    help="print the results as JSON instead of the table")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run in seconds: "
                         + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items())
                         + " unless given (its figures mean nothing)")
    ap.add_argument("--_serve", help=argparse.SUPPRESS)
    ap.add_argument("--_task", help=argparse.SUPPRESS)
    ap.add_argument("--_generate", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        ap.set_defaults(**QUICK)
        args = ap.parse_args(argv)
    if args.isolation == "fork" and not hasattr(os, "fork"):
        args.isolation = "exec"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args._serve:
        serve(args._serve)
        return 0
    if args._task:
        task_main(json.loads(args._task))
        return 0
    if args._generate:
        print(json.dumps(generate(json.loads(args._generate))))
        return 0

    started = time.perf_counter()
    files_wanted = [f for f in args.files.split(",") if f]
    unknown = set(files_wanted) - set(FILES)
    if unknown:
        raise SystemExit(f"unknown file kinds {sorted(unknown)}; choose from {FILES}")
    have_torch = torch_present() and not args.no_torch
    readers = [r for r in READERS if have_torch or r in ("torchless", "copy")]
    if args.readers:
        wanted = [r for r in args.readers.split(",") if r]
        unknown = set(wanted) - set(READERS)
        if unknown:
            raise SystemExit(f"unknown readers {sorted(unknown)}; choose from {READERS}")
        readers = [r for r in readers if r in wanted]
    notes = ["all figures are warm-cache: the page cache cannot be dropped without root, so "
             "every file was read once before measuring."]
    if not have_torch:
        notes.append("torch is not installed (or --no-torch): only torchless and the copy "
                     "floor were measured; the files were written by the built-in writer "
                     "of torch's layouts.")
    if "legacy" in files_wanted and have_torch:
        notes.append("torch.load(mmap=True) refuses the legacy stream, so torch-mmap (and "
                     "dropin-mmap, which refuses it as torch does) has no legacy rows.")
    weights_only = args.weights_only == "true"
    if have_torch:
        notes.append("torch.load without mmap reads every tensor's bytes into memory, even "
                     "to list the tensors; with weights_only=True (torch's default) it "
                     "unpickles in Python, with weights_only=False in C but runs the pickle's "
                     "code.")
    if args.isolation == "fork":
        notes.append("each measurement ran in a process forked from a server that had only "
                     "imported the reader: import time is left out (see 'import time'), and "
                     "library pages the op never touches are not in its RSS, so 'base' is "
                     "lower than in a new interpreter (--isolation exec).")
    tmp = None
    workdir = args.dir
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="torchless-bench-")
        workdir = tmp.name
    else:
        os.makedirs(workdir, exist_ok=True)
    env = environment(have_torch)
    cfg = {"dir": workdir, "files": files_wanted, "big_mib": args.big_mib,
           "big_tensors": args.big_tensors, "many_tensors": args.many_tensors,
           "writer": args.writer if args.writer != "auto" else
           ("torch" if have_torch else "builtin"), "reps": args.reps,
           "touch": args.touch, "isolation": args.isolation, "weights_only": weights_only}
    servers: dict[str, Server] = {}
    try:
        log(f"writing {', '.join(files_wanted)} into {workdir} ({cfg['writer']} writer) ...")
        gen = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--_generate", json.dumps(cfg)],
            capture_output=True, text=True, check=False)
        if gen.returncode != 0:
            raise SystemExit(f"writing the files failed:\n{gen.stderr}")
        files = json.loads(gen.stdout)
        log(f"  written in {files.pop('_seconds'):.1f} s")
        files = {k: files[k] for k in FILES if k in files}

        log("warm-up: reading every file once ...")
        for info in files.values():
            with open(info["path"], "rb", buffering=0) as f:
                shutil.copyfileobj(f, NullSink(), COPY_CHUNK)  # type: ignore[misc,unused-ignore]

        imports: dict[str, Any] = {}
        if args.isolation == "fork":
            for name in sorted({SERVER[r] for r in readers}):
                servers[name] = Server(name)
                imports[name] = servers[name].ready
                log(f"  {name} server ready (import {servers[name].ready['import_s']:.2f} s)")

        combos = plan(files, readers)
        runs = []
        total = len(combos) * args.reps
        done = 0
        for rep in range(args.reps):
            order = combos[:]
            random.Random(rep).shuffle(order)  # spread the machine's noise over every reader
            for name, op, reader in order:
                task = {"reader": reader, "op": op, "path": files[name]["path"],
                        "touch": args.touch, "weights_only": weights_only}
                if args.isolation == "fork":
                    res = servers[SERVER[reader]].run(task)
                else:
                    res = run_in_new_interpreter(task)
                if "traceback" in res:
                    log(res.pop("traceback"))
                runs.append({"file": name, "op": op, "reader": reader, "rep": rep, **res})
                done += 1
                shown = f"{res['seconds']:.3f} s" if "seconds" in res else res.get("error")
                log(f"  [{done}/{total}] {time.perf_counter() - started:5.0f} s  rep {rep + 1} "
                    f"{name:6} {op:4} {reader:11} {shown}")
        if args.isolation == "exec":
            for reader in readers:
                samples = [r["import_s"] for r in runs if r["reader"] == reader
                           and "import_s" in r]
                if samples:
                    rss = [r["base_mib"] for r in runs
                           if r["reader"] == reader and r.get("base_mib") is not None]
                    imports[reader] = {"import_s": statistics.median(samples),
                                       "rss_mib": statistics.median(rss) if rss else None}
    finally:
        for s in servers.values():
            s.close()
        if tmp is not None:
            tmp.cleanup()

    env["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    results: dict[str, Any] = {"environment": env, "config": cfg, "files": files,
                               "imports": imports, "runs": runs, "notes": notes}
    results["summary"] = summarize(results)
    problems = check(results)
    results["problems"] = problems
    results["seconds_total"] = time.perf_counter() - started
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(table(results))
        print(f"whole run: {results['seconds_total']:.0f} s")
    for problem in problems:
        log(f"PROBLEM: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
