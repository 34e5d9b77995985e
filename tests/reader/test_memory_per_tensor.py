"""What opening costs per tensor in memory, bounded (issue 16): optimizer states, MoE models and
DCP metadata hold 10^5-10^6 small tensors, and each one's records (its storage, loader, ZIP
entry, geometry, name) are what such a file costs. A bound on bytes ``tracemalloc`` counts,
not a timing: deterministic for a given Python.

Measured on CPython 3.11 with 2,000 four-element tensors: 1,264 B kept and 1,749 B at the
peak per tensor; before issue 30 (a member name and its case-folded key two bytes objects)
1,310 B and 1,796 B, and before the per-tensor work of issue 16 (two closures and a dict per
storage, the memo a dict of int keys) 1,684 B and 2,569 B, which these bounds refuse. Figures at
30,000 and 100,000 tensors, and the time per tensor next to C pickle and torch, are in
``benchmarks/bench_open.py``.
"""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path
from types import ModuleType

import torchless

N = 2000
#: Bytes per tensor alive while the checkpoint is open.
KEPT = 1295
#: Bytes per tensor at the peak of opening (the pickle, its memo, the ZIP directory).
PEAK = 1785


def test_memory_per_tensor_is_bounded(torch: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "many.pt"
    sd = {f"layers.{i}.weight": torch.full((4,), float(i)) for i in range(N)}
    torch.save(sd, path)
    torchless.open(path).close()  # imports and one-time tables out of the count
    gc.collect()
    tracemalloc.start()
    try:
        ckpt = torchless.open(path)
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    with ckpt:
        assert len(ckpt.tensors) == N
        assert ckpt.numpy(f"layers.{N - 1}.weight").tolist() == [float(N - 1)] * 4
    assert kept / N <= KEPT, f"{kept / N:.0f} bytes kept per tensor"
    assert peak / N <= PEAK, f"{peak / N:.0f} bytes per tensor at the peak"
