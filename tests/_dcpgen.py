"""Writes the DCP checkpoints the DCP tests read, with torch itself: run as
``python -m tests._dcpgen OUT`` (a subprocess: torch.distributed state stays out of the
test process). One spawn of two CPU (gloo) processes writes every multi-process case, to
keep the suite's cost to a few seconds; each case's oracle is written beside it.

    OUT/single/         dcp.save(no_dist=True) of a model, Adam state and plain values
    OUT/fsdp/           FSDP2 fully_shard over 2 ranks, get_state_dict (model + optimizer)
    OUT/dtensor/        DTensors sharded by rows, columns, unevenly, on a middle
                        dimension, replicated; bfloat16 and int64; plain values
    OUT/st/             the DTensors again, serialization_format=SAFETENSORS
    OUT/hf/             the DTensors again, HuggingFaceStorageWriter(save_distributed=True):
                        one safetensors file per rank, no .metadata (its oracle: st.full.pt)
    OUT/<case>.pt       dcp_to_torch_save of the case (torch_save cases)
    OUT/<case>.full.pt  the full tensors and values each rank saved (every case)
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

WORLD = 2


def _values(rank: int) -> dict[str, Any]:
    return {"epoch": 3, "name": "run-7", "sched": {"milestones": [2, 4], "gamma": 0.5}}


def _dtensors(mesh: Any) -> dict[str, Any]:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    g = torch.Generator().manual_seed(0)

    def full(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if dtype == torch.int64:
            return torch.randint(-1000, 1000, shape, generator=g)
        return torch.randn(*shape, generator=g).to(dtype)

    return {
        "rows": distribute_tensor(full(6, 4), mesh, [Shard(0)]),
        "cols": distribute_tensor(full(4, 6), mesh, [Shard(1)]),
        "uneven_rows": distribute_tensor(full(5, 3), mesh, [Shard(0)]),
        "uneven_cols": distribute_tensor(full(3, 7), mesh, [Shard(1)]),
        "middle": distribute_tensor(full(2, 5, 3), mesh, [Shard(1)]),
        "bf16_cols": distribute_tensor(full(4, 6, dtype=torch.bfloat16), mesh, [Shard(1)]),
        "ints": distribute_tensor(full(7, dtype=torch.int64), mesh, [Shard(0)]),
        "replicated": distribute_tensor(full(3, 2), mesh, [Replicate()]),
    }


def _full(sd: Any) -> Any:
    from torch.distributed.tensor import DTensor

    if isinstance(sd, DTensor):
        return sd.full_tensor()
    if isinstance(sd, dict):
        return {k: _full(v) for k, v in sd.items()}
    if isinstance(sd, list):
        return [_full(v) for v in sd]
    return sd


def _worker(rank: int, out: str, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        from torch.distributed.checkpoint.filesystem import SerializationFormat
        from torch.distributed.checkpoint.state_dict import get_state_dict
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (WORLD,))
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optim = torch.optim.Adam(model.parameters(), lr=0.01)
        model(torch.randn(4, 6)).sum().backward()
        optim.step()
        msd, osd = get_state_dict(model, optim)
        state = {"model": msd, "optim": osd, **_values(rank)}
        dcp.save(state, checkpoint_id=f"{out}/fsdp")
        full = _full(state)
        tensors = {**_dtensors(mesh), **_values(rank)}
        dcp.save(tensors, checkpoint_id=f"{out}/dtensor")
        st = {k: v for k, v in _dtensors(mesh).items()}
        dcp.save(st, storage_writer=dcp.FileSystemWriter(
            f"{out}/st", serialization_format=SerializationFormat.SAFETENSORS))
        from torch.distributed.checkpoint import HuggingFaceStorageWriter

        dcp.save(_dtensors(mesh), storage_writer=HuggingFaceStorageWriter(
            f"{out}/hf", save_distributed=True))
        full_tensors, full_st = _full(tensors), _full(st)
        if rank == 0:
            torch.save(full, f"{out}/fsdp.full.pt")
            torch.save(full_tensors, f"{out}/dtensor.full.pt")
            torch.save(full_st, f"{out}/st.full.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _single(out: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    optim = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optim.step()
    state = {"model": model.state_dict(), "optim": optim.state_dict(),
             "half": torch.arange(6, dtype=torch.float16).reshape(2, 3),
             "view": torch.arange(12.0).reshape(3, 4)[:, 1:3], **_values(0)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=f"{out}/single", no_dist=True)
    torch.save(state, f"{out}/single.full.pt")


def main(out: str) -> None:
    import socket

    import torch.multiprocessing as mp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    _single(out)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    mp.spawn(_worker, args=(out, port), nprocs=WORLD, join=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in ("single", "fsdp", "dtensor"):
            dcp_to_torch_save(f"{out}/{case}", f"{out}/{case}.pt")
    Path(out, "done").write_text("ok\n")


if __name__ == "__main__":
    main(sys.argv[1])
