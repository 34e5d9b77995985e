"""Writes the DeepSpeed ZeRO checkpoints the ZeRO tests read, with DeepSpeed itself on CPU:
run as ``python -m tests._zerogen OUT`` (a subprocess: torch.distributed and DeepSpeed state
stay out of the test process). One spawn of two gloo processes trains a tiny model two steps
and saves it for every case, then DeepSpeed's own ``zero_to_fp32`` writes each oracle.
``python -m tests._zerogen OUT --world 4 CASE ...`` writes the named cases with four ranks
(the sizes are no multiple of 4 or of ZeRO-2's alignment 8 either); its ``z2`` is saved
after each step (``latest`` names ``global_step2``; ``global_step1`` is the older tag, with
its own oracle ``z2.global_step1.ref.safetensors``, zero_to_fp32's ``-t global_step1``):

    OUT/<case>/                 engine.save_checkpoint (``latest``, ``global_step2/``)
    OUT/<case>.ref.safetensors  zero_to_fp32's consolidation (its lazy state dict, floats
                                as float32: convert_zero_checkpoint_to_fp32_state_dict's
                                steps) saved with safetensors' save_file, as
                                ``zero_to_fp32 --safe_serialization`` writes it, each name
                                its own copy (zero_to_fp32 itself refuses the tied weight:
                                "Some tensors share memory")

Cases: ``z1``, ``z2``, ``z3`` (fp32) and ``z1_bf16``, ``z2_bf16``, ``z3_bf16``. The model has
a tied weight (``head.weight`` is ``emb.weight``: DeepSpeed's ``shared_params``), frozen
parameters, an int64 and a float buffer, two parameter groups, and sizes that are no
multiple of the world size (ZeRO-2's alignment padding, ZeRO-3's per-rank padding).
"""

from __future__ import annotations

import os
import socket
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import nn

CASES = {"z1": (1, False), "z2": (2, False), "z3": (3, False),
         "z1_bf16": (1, True), "z2_bf16": (2, True), "z3_bf16": (3, True)}


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.body = nn.Linear(6, 7)
        self.frozen = nn.Linear(7, 6)
        self.frozen.requires_grad_(False)
        self.norm = nn.LayerNorm(6)
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("steps", torch.tensor([3, 4], dtype=torch.int64))
        self.register_buffer("scale", torch.full((5,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        h = self.norm(self.frozen(torch.relu(self.body(h))))
        return self.head(h)


def _quiet_deepspeed() -> Any:
    import deepspeed
    import deepspeed.comm.torch

    # DeepSpeed's CPU accelerator compiles a shared-memory all-reduce at start-up (a C++
    # build with ninja: half a minute idle, over ten minutes on a loaded machine); gloo does
    # the same work for a tiny model. ``import deepspeed.comm.torch as m`` would bind torch
    # itself (deepspeed.comm has an attribute ``torch``), so take the module by its name.
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    return deepspeed


def _worker(rank: int, out: str, port: str, world: int, cases: list[str]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    deepspeed = _quiet_deepspeed()
    deepspeed.init_distributed(dist_backend="gloo")
    for case in cases:
        stage, bf16 = CASES[case]
        torch.manual_seed(0)
        model = Tiny()
        trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        groups = [{"params": [p for n, p in trainable if n.endswith("weight")],
                   "weight_decay": 0.1},
                  {"params": [p for n, p in trainable if not n.endswith("weight")],
                   "weight_decay": 0.0}]
        optim = torch.optim.AdamW(groups, lr=1e-2)
        config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                  "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
                  "bf16": {"enabled": bf16}, "steps_per_print": 1000}
        engine, *_ = deepspeed.initialize(model=model, optimizer=optim, config=config)
        g = torch.Generator().manual_seed(rank)
        for step in range(2):
            loss = engine(torch.randint(0, 11, (2, 3), generator=g)).float().pow(2).mean()
            engine.backward(loss)
            engine.step()
            if step == 1 or (world != 2 and case == "z2"):
                engine.save_checkpoint(f"{out}/{case}",
                                       client_state={"epoch": 1, "note": "tiny"})
        engine.destroy()


def main(out: str, world: int = 2, cases: list[str] | None = None) -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # read when DeepSpeed is imported
    cases = list(CASES) if not cases else cases
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    # DeepSpeed and torch imported once, here, and the ranks forked from this process:
    # each rank importing them anew costs more than the training (4 ranks, 2 cores)
    _quiet_deepspeed()
    mp.start_processes(_worker, args=(out, port, world, cases), nprocs=world, join=True,
                       start_method="fork")
    from deepspeed.utils.zero_to_fp32 import (
        get_fp32_state_dict_from_zero_checkpoint,
        to_torch_tensor,
    )
    from safetensors.torch import save_file

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in cases:
            for tag in [None] if world == 2 or case != "z2" else [None, "global_step1"]:
                # convert_zero_checkpoint_to_fp32_state_dict's steps: the lazy state dict,
                # then every floating tensor as float32
                lazy = get_fp32_state_dict_from_zero_checkpoint(f"{out}/{case}", tag=tag,
                                                                lazy_mode=True)
                state = to_torch_tensor(lazy, dtype=torch.float32)
                ref = f"{out}/{case}" + (f".{tag}" if tag else "") + ".ref.safetensors"
                save_file({k: v.clone() for k, v in state.items()}, ref,
                          metadata={"format": "pt"})
    Path(out, "done").write_text("ok\n")


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) > 2 and args[1] == "--world":
        main(args[0], int(args[2]), args[3:])
    else:
        main(args[0])
