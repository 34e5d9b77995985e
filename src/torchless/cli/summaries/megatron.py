"""Megatron-LM checkpoints, as ``save_checkpoint`` and ``generate_state_dict``
(``megatron/training/checkpointing.py``) write them: ``args`` (the run's Namespace, with
``tensor_model_parallel_size`` and ``pipeline_model_parallel_size``),
``checkpoint_version``, ``iteration``, ``model`` (``model0``, ``model1`` … with virtual
pipeline stages), ``optimizer``, ``opt_param_scheduler``, ``rng_state``; one file per rank
at ``iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt``."""

from __future__ import annotations

import os
import re

from torchless.cli.summaries.seen import Found, Seen
from torchless.cli.summaries.text import fields, pairs

__all__ = ["summary"]

_RANK = re.compile(r"^mp_rank_(\d+)(?:_(\d+))?$")


def summary(seen: Seen) -> list[Found]:
    top = seen.top
    if "checkpoint_version" not in top or not ("iteration" in top or "args" in top):
        return []
    args = fields(top.get("args")) or {}
    keep = {"iteration": top.get("iteration"),
            "TP": args.get("tensor_model_parallel_size"),
            "PP": args.get("pipeline_model_parallel_size")}
    line = (f"Megatron checkpoint (version {top['checkpoint_version']}): "
            + pairs({k: v for k, v in keep.items() if v is not None}))
    rank = _RANK.match(os.path.basename(os.path.dirname(seen.path))) if seen.path else None
    if rank is not None:
        line += f"; this file: tensor rank {int(rank.group(1))}"
        if rank.group(2) is not None:
            line += f", pipeline rank {int(rank.group(2))}"
    return [("megatron", line)]
