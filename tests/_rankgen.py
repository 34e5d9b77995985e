"""Writes the per-rank checkpoints the rank-file and Megatron tests read, with torch itself:
run as ``python -m tests._rankgen OUT`` (a subprocess: torch.distributed state stays out of
the test process). One spawn of two CPU (gloo) processes writes every case; each oracle is
torch's own assembly of the full tensors (``DTensor.full_tensor()``,
``ShardedTensor.gather``), saved beside the case:

    OUT/megatron/      what Megatron-Core's ``dist_checkpointing.save`` writes with the
                       ``torch_dist`` backend and TP=2 (Megatron-Core is not installed here;
                       written with torch's DCP the way megatron/core/dist_checkpointing/
                       serialization.py ``save``, strategies/torch.py ``MCoreSavePlanner``
                       and ``mcore_to_pyt_state_dict``, strategies/common.py ``save_common``
                       and core.py ``save_config`` do): the sharded tensors under their
                       ShardedTensor keys (flat, ``flatten_state_dict=False``), the
                       ShardedObject ``rng_state`` as each rank's ``torch.save`` of the list
                       of its data (MCoreSavePlanner leaves the BytesIO untransformed),
                       ``common.pt`` (rank 0's ``torch.save`` of the non-sharded state:
                       iteration, args as an ``argparse.Namespace``, checkpoint_version,
                       the scheduler) and ``metadata.json``
    OUT/megatron_mcore_metadata/  the same save with Megatron-Core 0.15's ``MCoreMetadata``
                       (DCP's Metadata subclass with ``mcore_data``) as its ``.metadata``
    OUT/megatron.full.pt   the full tensors by key (``full_tensor()``)
    OUT/megatron_run/  the run's directory: ``latest_checkpointed_iteration.txt`` ("10") and
                       ``iter_0000010/``, a copy of ``megatron/``
    OUT/verl/          verl's FSDP2 checkpoint: ``model_world_size_2_rank_R.pt``, each
                       ``torch.save(model.state_dict())`` of a ``fully_shard`` model
                       (DTensors, ``Shard(0)``), plus a ``Replicate`` DTensor and a
                       ``Shard(1)`` one in the same files; ``optim_world_size_2_rank_R.pt``
                       (the optimizer's state dict: DTensor moments) and
                       ``extra_state_world_size_2_rank_R.pt`` beside them, as verl saves
    OUT/verl.ref.safetensors  the full tensors (``full_tensor()``)
    OUT/verl.optim.ref.safetensors  the full moments by ``<param index>.<name>``
    OUT/fsdp1/         FSDP1 ``SHARDED_STATE_DICT`` (ShardedTensors) saved with
                       ``torch.save`` per rank: ``model_world_size_2_rank_R.pt``
    OUT/megatron_legacy/  Megatron-LM's legacy ``--ckpt-format torch`` save, TP=2:
                       ``latest_checkpointed_iteration.txt`` and
                       ``iter_0000010/mp_rank_0T/model_optim_rng.pt``
    OUT/fsdp1.ref.safetensors the full tensors (``ShardedTensor.gather``)
    OUT/placements/    ``rank{R}.pt``: DTensors distributed with ``_StridedShard`` (uneven
                       sizes, dims 0 and 1, split factors 2 and 3), one ``Shard(0)`` and one
                       ``Partial()`` (``DTensor.from_local``), saved per rank
    OUT/placements.ref.safetensors  their ``full_tensor()`` (but the Partial one)
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import socket
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

WORLD = 2


def fake_megatron() -> Any:
    """Megatron-Core's ``AttnBackend`` (megatron/core/transformer/enums.py: a plain
    ``enum.Enum``) under its own module name, so that pickle writes what a real run's args
    hold (``GLOBAL 'megatron.core.transformer.enums AttnBackend'``) and torch.load reads it
    back, without Megatron installed."""
    import enum
    import types

    found = sys.modules.get("megatron.core.transformer.enums")
    if found is not None:
        return found.AttnBackend
    names = ("megatron", "megatron.core", "megatron.core.transformer",
             "megatron.core.transformer.enums")
    for name in names:
        sys.modules.setdefault(name, types.ModuleType(name))
    module = sys.modules[names[-1]]
    backend = enum.Enum("AttnBackend", {"flash": 1, "fused": 2, "unfused": 3, "local": 4,
                                        "auto": 5}, module=names[-1])
    module.AttnBackend = backend  # type: ignore[attr-defined]
    return backend


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(7, 6)
        self.body = nn.Linear(6, 5)
        self.head = nn.Linear(5, 3)
        self.register_buffer("scale", torch.full((3,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(self.emb(x)))) * self.scale


def fake_megatron_metadata() -> Any:
    """Megatron-Core 0.15's ``MCoreMetadata`` (a dataclass subclass of DCP's ``Metadata``
    with ``mcore_data``) under its own module name, as :func:`fake_megatron` does."""
    import dataclasses
    import types

    from torch.distributed.checkpoint.metadata import Metadata

    name = "megatron.core.dist_checkpointing.strategies.torch"
    module = sys.modules.get(name)
    if module is not None:
        return module.MCoreMetadata
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    module = sys.modules[name]

    @dataclasses.dataclass
    class MCoreMetadata(Metadata):
        mcore_data: dict[str, Any] = dataclasses.field(default_factory=dict)

    MCoreMetadata.__module__, MCoreMetadata.__qualname__ = name, "MCoreMetadata"
    module.MCoreMetadata = MCoreMetadata  # type: ignore[attr-defined]
    return MCoreMetadata


def _megatron(rank: int, out: str, mesh: Any) -> None:
    from torch.distributed.checkpoint import DefaultSavePlanner
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    class MCoreSavePlanner(DefaultSavePlanner):
        """Megatron's planner: ShardedObjects are already torch.save'd into a BytesIO; with
        ``mcore_metadata``, the global metadata is an ``MCoreMetadata``."""

        def __init__(self, *args: Any, mcore_metadata: bool = False, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.mcore_metadata = mcore_metadata

        def transform_object(self, write_item: Any, obj: Any) -> Any:
            return obj

        def create_global_plan(self, all_plans: Any) -> Any:
            plans, metadata = super().create_global_plan(all_plans)
            if self.mcore_metadata:
                metadata = fake_megatron_metadata()(mcore_data={}, **vars(metadata))
            return plans, metadata

    g = torch.Generator().manual_seed(1)
    # TP=2: column-parallel weights split on dim 0, row-parallel on dim 1, layernorms
    # replicated; the layers stacked on a leading axis (Megatron's prepended layer axis)
    sharded = {
        "embedding.word_embeddings.weight": (torch.randn(10, 8, generator=g), Shard(0)),
        "decoder.layers.self_attention.linear_qkv.weight":
            (torch.randn(2, 12, 8, generator=g), Shard(1)),
        "decoder.layers.self_attention.linear_proj.weight":
            (torch.randn(2, 8, 4, generator=g).to(torch.bfloat16), Shard(2)),
        "decoder.layers.mlp.linear_fc1.layer_norm_weight":
            (torch.randn(2, 8, generator=g), Replicate()),
        "decoder.final_layernorm.weight": (torch.randn(8, generator=g), Replicate()),
    }
    state: dict[str, Any] = {k: distribute_tensor(t, mesh, [p])
                             for k, (t, p) in sharded.items()}
    rng = io.BytesIO()
    torch.save([[{"random_rng_state": (3, tuple(range(4)), None),
                  "torch_rng_state": torch.arange(4, dtype=torch.uint8) + rank}]], rng)
    state[f"rng_state/shard_0.{rank}_1.{WORLD}"] = rng
    dcp.save(state, checkpoint_id=f"{out}/megatron",
             planner=MCoreSavePlanner(flatten_state_dict=False))
    # Megatron-Core 0.15's planner writes its own Metadata subclass with ``mcore_data``
    # (every rank knows the class: the plans and metadata travel between them pickled)
    fake_megatron_metadata()
    dcp.save(state, checkpoint_id=f"{out}/megatron_mcore_metadata",
             planner=MCoreSavePlanner(flatten_state_dict=False, mcore_metadata=True))
    if rank == 0:
        args = argparse.Namespace(num_layers=2, hidden_size=8, tensor_model_parallel_size=2,
                                  params_dtype=torch.bfloat16, ckpt_format="torch_dist",
                                  attention_backend=fake_megatron().auto)
        common = {"args": args, "checkpoint_version": 3.0, "iteration": 10,
                  "opt_param_scheduler": {"max_lr": 0.001, "num_steps": 40},
                  "num_floating_point_operations_so_far": 123456789}
        torch.save(common, f"{out}/megatron/common.pt")
        with open(f"{out}/megatron/metadata.json", "w") as f:
            json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                       "common_backend": "torch", "common_backend_version": 1}, f)
        torch.save({k: t for k, (t, _) in sharded.items()}, f"{out}/megatron.full.pt")


def _verl(rank: int, out: str, mesh: Any) -> None:
    from safetensors.torch import save_file
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    torch.manual_seed(0)
    model = Tiny()
    for layer in (model.emb, model.body, model.head):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randint(0, 7, (4,))).sum().backward()
    optim.step()
    sd = model.state_dict()
    g = torch.Generator().manual_seed(2)
    sd["extra.replicated"] = distribute_tensor(torch.randn(3, 2, generator=g), mesh,
                                               [Replicate()])
    sd["extra.cols"] = distribute_tensor(torch.randn(3, 5, generator=g).to(torch.bfloat16),
                                         mesh, [Shard(1)])
    os.makedirs(f"{out}/verl", exist_ok=True)
    torch.save(sd, f"{out}/verl/model_world_size_{WORLD}_rank_{rank}.pt")
    osd = optim.state_dict()
    torch.save(osd, f"{out}/verl/optim_world_size_{WORLD}_rank_{rank}.pt")
    torch.save({"lr_scheduler": {"last_epoch": 1}, "rng": {"cpu": torch.get_rng_state()}},
               f"{out}/verl/extra_state_world_size_{WORLD}_rank_{rank}.pt")
    full = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in sd.items()}
    moments = {f"{i}.{k}": v.full_tensor() for i, state in osd["state"].items()
               for k, v in state.items() if hasattr(v, "full_tensor")}
    if rank == 0:
        save_file({k: v.contiguous() for k, v in full.items()}, f"{out}/verl.ref.safetensors")
        save_file(moments, f"{out}/verl.optim.ref.safetensors")


def _fsdp1(rank: int, out: str) -> None:
    from safetensors.torch import save_file
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType

    torch.manual_seed(0)
    model = FSDP(Tiny(), use_orig_params=True, device_id=torch.device("cpu"))
    optim = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randint(0, 7, (4,))).sum().backward()
    optim.step()
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        sd = model.state_dict()
    os.makedirs(f"{out}/fsdp1", exist_ok=True)
    torch.save(sd, f"{out}/fsdp1/model_world_size_{WORLD}_rank_{rank}.pt")
    full = {}
    for name, value in sd.items():  # ShardedTensor.gather: torch's own assembly
        if isinstance(value, ShardedTensor):
            whole = torch.empty(value.size(), dtype=value.dtype) if rank == 0 else None
            value.gather(dst=0, out=whole)
            value = whole
        full[name] = value
    if rank == 0:
        save_file({k: v.contiguous() for k, v in full.items()}, f"{out}/fsdp1.ref.safetensors")


def _placements(rank: int, out: str, mesh: Any) -> None:
    from safetensors.torch import save_file
    from torch.distributed.tensor import DTensor, Partial, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    g = torch.Generator().manual_seed(5)
    cases = {"strided0": (torch.randn(7, 3, generator=g), _StridedShard(0, split_factor=2)),
             "strided1": (torch.randn(2, 11, generator=g), _StridedShard(1, split_factor=3)),
             "strided_even": (torch.randn(8, 2, generator=g), _StridedShard(0, split_factor=2)),
             "shard": (torch.randn(5, 2, generator=g), Shard(0))}
    sd: dict[str, Any] = {}
    full = {}
    for name, (whole, placement) in cases.items():
        d = distribute_tensor(whole, mesh, [placement], src_data_rank=None)
        sd[name] = d
        full[name] = d.full_tensor()
        assert torch.equal(full[name], whole), name
    sd["partial"] = DTensor.from_local(torch.full((2, 3), float(rank + 1)), mesh, [Partial()])
    os.makedirs(f"{out}/placements", exist_ok=True)
    torch.save(sd, f"{out}/placements/rank{rank}.pt")
    if rank == 0:
        save_file({k: v.contiguous() for k, v in full.items()},
                  f"{out}/placements.ref.safetensors")


def _megatron_legacy(out: str) -> None:
    """Megatron-LM's ``--ckpt-format torch`` save with TP=2 (no processes needed: each
    rank's file is a plain torch.save): ``get_checkpoint_name``'s
    ``iter_{:07d}/mp_rank_{:02d}/model_optim_rng.pt`` and the tracker file."""
    g = torch.Generator().manual_seed(3)
    full = {"embedding.word_embeddings.weight": (torch.randn(10, 8, generator=g), 0),
            "decoder.layers.0.self_attention.linear_qkv.weight":
                (torch.randn(12, 8, generator=g), 0),
            "decoder.layers.0.self_attention.linear_proj.weight":
                (torch.randn(8, 12, generator=g), 1),
            "decoder.final_layernorm.weight": (torch.randn(8, generator=g), None)}
    for tp in range(WORLD):
        model = {k: t.clone() if axis is None else t.chunk(WORLD, axis)[tp].clone()
                 for k, (t, axis) in full.items()}
        state = {"args": argparse.Namespace(tensor_model_parallel_size=WORLD,
                                            pipeline_model_parallel_size=1),
                 "checkpoint_version": 3.0, "iteration": 10, "model": model,
                 "rng_state": [{"torch_rng_state": torch.get_rng_state()}]}
        where = Path(out, "megatron_legacy", "iter_0000010", f"mp_rank_{tp:02d}")
        where.mkdir(parents=True)
        torch.save(state, where / "model_optim_rng.pt")
    Path(out, "megatron_legacy", "latest_checkpointed_iteration.txt").write_text("10")


def _worker(rank: int, out: str, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (WORLD,))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _megatron(rank, out, mesh)
            _verl(rank, out, mesh)
            _fsdp1(rank, out)
            _placements(rank, out, mesh)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(out: str) -> None:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    # the ranks forked from this process, which imported torch once for both
    mp.start_processes(_worker, args=(out, port), nprocs=WORLD, join=True,
                       start_method="fork")
    _megatron_legacy(out)
    # a run's directory: the tracker file naming the torch_dist save
    shutil.copytree(f"{out}/megatron", f"{out}/megatron_run/iter_0000010")
    Path(out, "megatron_run", "latest_checkpointed_iteration.txt").write_text("10")
    Path(out, "done").write_text("ok\n")


if __name__ == "__main__":
    main(sys.argv[1])
