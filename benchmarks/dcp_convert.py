#!/usr/bin/env python
"""Consolidation benchmark: ``torchless convert DIR`` of a rank-sharded checkpoint (DCP or
DeepSpeed ZeRO) against the framework's own recipe and ``cp -r``.

Usage::

    python benchmarks/dcp_convert.py                  # a 2 GiB DCP checkpoint, 3 repetitions
    python benchmarks/dcp_convert.py --mib 4096 --reps 2
    python benchmarks/dcp_convert.py --layout zero3   # a ZeRO-3 run of 2 GiB of weights
    python benchmarks/dcp_convert.py --json > results.json
    python benchmarks/dcp_convert.py --quick          # a few MiB, 1 repetition: a smoke run

It writes one DCP checkpoint with torch itself: two CPU processes (gloo) save ``--tensors``
float32 DTensors of ``--mib`` MiB in all, half sharded by rows (``Shard(0)``, as FSDP does)
and half by columns (``Shard(1)``, as tensor parallelism does), each rank holding only its
local shard. Then, for that directory, three ways of producing one consolidated output:

* ``torchless``  ``torchless.convert(DIR, DST)``: each chunk streamed into its place in
                 the safetensors file (fsync, atomic rename);
* ``torchless-nofsync``  the same with ``os.fsync`` a no-op in that child: like for like with
                 ``cp`` and torch, which leave their output in the page cache;
* ``torch``      ``dcp_to_torch_save(DIR, tmp.pt)``, ``torch.load(tmp.pt, mmap=True)``,
                 ``safetensors.torch.save_file``: the recipe without torchless (the whole
                 model in memory once, written twice);
* ``cp``         ``cp -r DIR DST`` (the floor: no parsing, no reassembly).

With ``--layout zero2`` / ``zero3`` the checkpoint is a DeepSpeed run instead (two CPU
processes, gloo, ``engine.save_checkpoint`` after one AdamW step of ``--tensors`` linear layers
holding ``--mib`` MiB of float32 weights; the directory also holds the two Adam moments and
the module states, so it is three to four times that), and ``torch`` is DeepSpeed's own
``convert_zero_checkpoint_to_fp32_state_dict(DIR, OUT, safe_serialization=True)`` (the
``zero_to_fp32.py`` script every run carries: every rank file ``torch.load``-ed, the model
assembled in memory). Targets (issue 27): <= 1.5x ``cp -r``, peak RSS <= 64 MiB at any size.

Every measurement runs in a fresh process. ``seconds`` is the operation inside that process
after its imports (for ``cp``, the whole process); peak RSS is the child's ``VmHWM`` (for
``cp``, ``ru_maxrss`` from ``wait4``: an upper bound). The checkpoint is read once before
anything is measured (warm cache); outputs are deleted between repetitions, outside the
timing; methods are interleaved so that drift hits them alike. Figures are medians.

Targets (issue 15): torchless peak RSS flat, <= 100 MiB, and <= 1.5x ``cp``.
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
from bench_read import human, log
from convert import TIMED_CHILD

MiB = 1 << 20
QUICK = {"mib": 4, "tensors": 4, "reps": 1}
METHODS = ("torchless", "torchless-nofsync", "torch", "cp")
LAYOUTS = ("dcp", "zero2", "zero3")
_COLUMNS = 4096

_CHILD = {
    "torchless": ("import torchless", "torchless.convert(SRC, DST)"),
    "torchless-nofsync": ("import os, torchless\nos.fsync = lambda fd: None",
                          "torchless.convert(SRC, DST)"),
    "torch": (
        "import os, warnings, torch, safetensors.torch\n"
        "from torch.distributed.checkpoint.format_utils import dcp_to_torch_save\n"
        "warnings.simplefilter('ignore')",
        "tmp = DST + '.pt'\n"
        "dcp_to_torch_save(SRC, tmp)\n"
        "sd = torch.load(tmp, mmap=True, weights_only=True)\n"
        "safetensors.torch.save_file(sd, DST, metadata={'format': 'pt'})\n"
        "del sd\n"
        "os.unlink(tmp)",
    ),
}
#: DeepSpeed's consolidation, for the ZeRO layouts (DST is then a directory it writes
#: model.safetensors into)
_ZERO_CHILD = (
    "import os, warnings\nos.environ.setdefault('DS_ACCELERATOR', 'cpu')\n"
    "warnings.simplefilter('ignore')\n"
    "from deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict",
    "convert_zero_checkpoint_to_fp32_state_dict(SRC, DST, safe_serialization=True)")


def _rank(rank: int, out: str, port: str, mib: int, count: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        rows = max(2, (mib * MiB) // (count * 4 * _COLUMNS)) // 2 * 2
        state: dict[str, Any] = {}
        g = torch.Generator().manual_seed(rank)
        for i in range(count):
            by_rows = i % 2 == 0
            local = (rows // 2, _COLUMNS) if by_rows else (rows, _COLUMNS // 2)
            state[f"layers.{i}.weight"] = DTensor.from_local(
                torch.randn(*local, generator=g), mesh, [Shard(0 if by_rows else 1)],
                run_check=False, shape=torch.Size((rows, _COLUMNS)),
                stride=(_COLUMNS, 1))
        dcp.save(state, checkpoint_id=out)
    finally:
        dist.destroy_process_group()


def _zero_rank(rank: int, out: str, port: str, mib: int, count: int, stage: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE="2", DS_ACCELERATOR="cpu")
    import deepspeed
    import torch

    # the CPU accelerator's shared-memory all-reduce is a C++ build; gloo does the work
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    width = 1024
    rows = max(2, (mib * MiB) // (count * 4 * width))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, rows, bias=False) if i % 2 == 0
                                  else torch.nn.Linear(rows, width, bias=False)
                                  for i in range(count)])
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": stage},
              "zero_allow_untested_optimizer": True, "steps_per_print": 1 << 30}
    engine, *_ = deepspeed.initialize(model=model, optimizer=optim, config=config)
    x = torch.randn(1, width)
    engine.backward(engine(x).float().pow(2).mean())
    engine.step()
    engine.save_checkpoint(out)
    engine.destroy()


def generate(out: str, mib: int, count: int, layout: str = "dcp") -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    if layout == "dcp":
        mp.spawn(_rank, args=(out, port, mib, count), nprocs=2, join=True)
    else:
        count += count % 2  # pairs of layers: the output width comes back to the input's
        mp.spawn(_zero_rank, args=(out, port, mib, count, int(layout[-1])), nprocs=2,
                 join=True)


def run(method: str, src: str, dst: str, layout: str = "dcp") -> dict[str, float]:
    """One measurement in a fresh process: op seconds, process seconds, peak RSS bytes."""
    if method == "cp":
        argv = ["cp", "-r", src, dst]
    else:
        imports, op = _ZERO_CHILD if method == "torch" and layout != "dcp" else _CHILD[method]
        argv = [sys.executable, "-c", TIMED_CHILD.format(imports=imports, op=op), src, dst]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    out = proc.stdout.read() if proc.stdout else b""
    err = proc.stderr.read() if proc.stderr else b""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{method} failed on {src}:\n{err.decode(errors='replace')}")
    if method == "cp":
        return {"seconds": wall, "process": wall, "rss": usage.ru_maxrss * 1024}
    got = json.loads(out.splitlines()[-1])  # the child's last line (DeepSpeed logs on stdout)
    rss = got["rss"] if got["rss"] is not None else usage.ru_maxrss * 1024
    return {"seconds": got["seconds"], "process": wall, "rss": rss}


def _files(path: str) -> list[str]:
    return sorted(os.path.join(d, n) for d, _, names in os.walk(path) for n in names)


def _size(path: str) -> int:
    return sum(os.path.getsize(f) for f in _files(path))


def _warm(path: str) -> None:
    for name in _files(path):
        with open(name, "rb") as f:
            while f.read(16 * MiB):
                pass


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.unlink(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=2048, help="size of the checkpoint (MiB)")
    p.add_argument("--tensors", type=int, default=16, help="tensors in the checkpoint")
    p.add_argument("--layout", choices=LAYOUTS, default="dcp",
                   help="a DCP checkpoint (FSDP2-style DTensors) or a DeepSpeed ZeRO-2/3 run")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dir", help="where to write (default: a temporary directory)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run in seconds: " + ", ".join(
                       f"--{k} {v}" for k, v in QUICK.items()) + " unless given")
    p.add_argument("--generate", metavar="DIR", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        p.set_defaults(**QUICK)
        args = p.parse_args(argv)
    if args.generate:
        generate(args.generate, args.mib, args.tensors, args.layout)
        return 0
    work = tempfile.mkdtemp(prefix=f"torchless-{args.layout}-", dir=args.dir)
    try:
        src = os.path.join(work, "ckpt")
        log(f"writing a {args.layout} checkpoint into {src}")
        subprocess.run([sys.executable, __file__, "--generate", src, "--mib", str(args.mib),
                        "--tensors", str(args.tensors), "--layout", args.layout],
                       check=True, stdout=subprocess.DEVNULL if args.layout != "dcp" else None)
        _warm(src)
        size = _size(src)
        log(f"checkpoint: {human(size)} in {len(_files(src))} files")
        samples: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
        for rep in range(args.reps):
            for method in METHODS:
                dst = os.path.join(work, f"out-{method}" + ("" if method == "cp" else
                                                            ".safetensors"))
                os.sync()
                samples[method].append(run(method, src, dst, args.layout))
                _remove(dst)
            log(f"  rep {rep + 1}/{args.reps} done")
        med = {m: {k: statistics.median(s[k] for s in samples[m])
                   for k in ("seconds", "process", "rss")} for m in METHODS}
        results = {"layout": args.layout, "bytes": size, "median": med, "samples": samples}
        print_results(results, args.json)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def print_results(r: dict[str, Any], as_json: bool) -> None:
    med = r["median"]
    r["ratios"] = {
        "torchless/cp": med["torchless"]["seconds"] / med["cp"]["seconds"],
        "torchless-nofsync/cp": med["torchless-nofsync"]["seconds"] / med["cp"]["seconds"],
        "torch/torchless-nofsync": med["torch"]["seconds"]
        / med["torchless-nofsync"]["seconds"],
        "torch rss/torchless rss": med["torch"]["rss"] / med["torchless"]["rss"]}
    cap = 100 if r.get("layout", "dcp") == "dcp" else 64  # issue 15's target; issue 27's
    r["targets"] = {"<= 1.5x cp (page cache: nofsync vs cp)":
                    r["ratios"]["torchless-nofsync/cp"] <= 1.5,
                    f"peak RSS <= {cap} MiB": med["torchless"]["rss"] <= cap * MiB}
    if as_json:
        print(json.dumps(r, indent=2))
        return
    print(f"{'method':<18} {'seconds':>8} {'process':>8} {'peak RSS':>10}  GB/s")
    for m in METHODS:
        s = med[m]
        print(f"{m:<18} {s['seconds']:8.3f} {s['process']:8.3f} {human(s['rss']):>10}  "
              f"{r['bytes'] / s['seconds'] / 1e9:5.2f}")
    ratios = ", ".join(f"{k} {v:.2f}" for k, v in r["ratios"].items())
    met = ", ".join(f"{k}: {'yes' if ok else 'NO'}" for k, ok in r["targets"].items())
    print(f"{human(r['bytes'])}: {ratios}; targets {met}")


if __name__ == "__main__":
    sys.exit(main())
