"""Writes tests/data/megatron_core_tp2/ with Megatron-Core itself (not part of the suite).

Needs a venv of its own with torch and megatron-core (plus psutil, which megatron-core's
writer imports without declaring it)::

    python -m venv VENV && VENV/bin/pip install torch==2.13.0
    VENV/bin/pip install megatron-core torch==2.13.0 psutil
    VENV/bin/python -m tests.gen_megatron_core tests/data/megatron_core_tp2   # from the repo root

Two CPU processes (gloo) build a two-layer GPTModel with tensor_model_parallel_size=2 and
save its ``sharded_state_dict()`` with ``dist_checkpointing.save`` (the torch_dist
backend). Megatron-Core's writer calls ``torch.cuda.synchronize()`` and
``torch.cuda.current_device()`` unconditionally; on a CPU-only torch both are replaced by
no-ops that keep its tensors on the CPU (nothing else is changed). Then
``expected.json`` records, by dtype, shape and the sha256 of its bytes, every tensor as
torch's own DCP reader assembles it (``dcp_to_torch_save``, under its ShardedTensor key:
``tensors``) and as Megatron's own ``dist_checkpointing.load`` gives it to the same model
built with TP=1 (``megatron_load_tp1``: under the model's state-dict key, with the
ShardedTensor key and the layer index it was read from).

Megatron-Core cannot write the legacy ``mp_rank_XX/model_optim_rng.pt`` layout: that writer
is Megatron-LM's ``megatron/training/checkpointing.py``, not part of the megatron-core wheel.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from typing import Any

import torch
import torch.multiprocessing as mp


def _digest(t: torch.Tensor) -> dict[str, Any]:
    raw = t.contiguous().view(torch.uint8).numpy().tobytes()
    return {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "sha256": hashlib.sha256(raw).hexdigest(),
    }


def _model(tp: int) -> Any:
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    ps.initialize_model_parallel(tensor_model_parallel_size=tp)
    torch.manual_seed(0)
    cfg = TransformerConfig(
        num_layers=2,
        hidden_size=16,
        ffn_hidden_size=32,
        num_attention_heads=2,
        use_cpu_initialization=True,
    )
    return GPTModel(
        config=cfg,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=16,
        max_sequence_length=4,
    )


def _worker(rank: int, out: str, port: int, world: int, load_json: str) -> None:
    if not torch.cuda.is_available():
        torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
        torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.strategies.torch import (
        TorchDistSaveShardedStrategy,
    )

    model = _model(world)
    if world == 2:  # the TP=2 save
        dist_checkpointing.save(
            model.sharded_state_dict(),
            out,
            sharded_strategy=TorchDistSaveShardedStrategy("torch_dist", 1, thread_count=1),
        )
    else:  # Megatron's own load into a TP=1 model: what expected.json records
        sharded = model.sharded_state_dict()
        where = {
            name: (st.key, list(st.global_offset[: st.prepend_axis_num]))
            for name, st in sharded.items()
            if hasattr(st, "prepend_axis_num")
        }
        loaded = dist_checkpointing.load(sharded, out)
        tensors = {}
        for name, t in sorted(loaded.items()):
            if isinstance(t, torch.Tensor):
                tensors[name] = dict(_digest(t), key=where[name][0], index=where[name][1])
        with open(load_json, "w") as f:
            json.dump(tensors, f)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def _expected(out: str) -> dict[str, Any]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(out, f"{tmp}/full.pt")
        full = torch.load(f"{tmp}/full.pt", weights_only=False)
    tensors = {name: _digest(t) for name, t in sorted(full.items()) if isinstance(t, torch.Tensor)}
    objects = sorted(k for k, v in full.items() if not isinstance(v, torch.Tensor))
    return {"tensors": tensors, "objects": objects}


def main(out: str) -> None:
    import megatron.core

    os.makedirs(out, exist_ok=True)
    port = 29000 + os.getpid() % 1000
    mp.spawn(_worker, args=(out, port, 2, ""), nprocs=2)
    expected = _expected(out)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(out, port + 1, 1, f"{tmp}/load.json"), nprocs=1)
        with open(f"{tmp}/load.json") as f:
            expected["megatron_load_tp1"] = json.load(f)
    expected["provenance"] = (
        f"megatron-core {megatron.core.__version__}, torch {torch.__version__}: "
        f"python -m tests.gen_megatron_core {out}"
    )
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")
    with open(os.path.join(out, "PROVENANCE"), "w") as f:
        f.write(expected["provenance"] + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
