"""Megatron-LM's legacy checkpoint (``--ckpt-format torch``): one ``torch.save`` file per
model-parallel rank (megatron/training/checkpointing.py ``get_checkpoint_name``)::

    DIR/latest_checkpointed_iteration.txt      the last iteration ("10") or "release"
    DIR/iter_0000010/mp_rank_TT[_PPP]/model_optim_rng.pt   tensor rank TT (pipeline PPP):
                                               args, iteration, model, optimizer, rng_state

Each rank's file is its own state dict: its ``model`` holds that rank's tensor-parallel
partition of every split weight, the whole of every replicated one. The file records no
split axis (Megatron keeps ``partition_dim`` on the live parameters, never in the save), so
the partitions are not merged: the tree is ``{"mp_rank_00": ..., "mp_rank_01": ...}``, each
rank as saved, and ``describe`` lists each model tensor's shape on every tensor rank, with
the ones that cannot be placed (on several tensor ranks: split along an axis the file does
not name, or replicated).
"""

from __future__ import annotations

import os
import re
from typing import Any

from torchless.containers.megatron import tracked_dir
from torchless.containers.rankfiles import RankFiles
from torchless.core.limits import Limits
from torchless.errors import NotACheckpointError
from torchless.model.graph import ModuleHook, module_state_dict
from torchless.model.tensor import Storage, Tensor
from torchless.rules.resolver import TorchResolver

__all__ = ["MegatronLegacyDirectory", "is_megatron_legacy_dir"]

FILE = "model_optim_rng.pt"
_RANK = re.compile(r"mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?\Z")


def _rank_dirs(path: str) -> list[str]:
    try:
        names = os.listdir(path)
    except OSError:
        return []
    return sorted(n for n in names
                  if _RANK.match(n) and os.path.isfile(os.path.join(path, n, FILE)))


def _iteration_dir(path: str) -> str | None:
    """The directory holding the rank directories: ``path`` itself, or the save the tracker
    file names."""
    if _rank_dirs(path):
        return path
    inner = tracked_dir(path)
    return inner if inner is not None and _rank_dirs(inner) else None


def is_megatron_legacy_dir(path: str) -> bool:
    """A Megatron checkpoint directory (the tracker file naming an iteration) or an
    iteration directory holding ``mp_rank_*/model_optim_rng.pt``."""
    return _iteration_dir(path) is not None


class MegatronLegacyDirectory:
    """Reads every model-parallel rank's file of a legacy Megatron checkpoint."""

    format = "megatron-legacy"
    remote = False
    size = 0

    def __init__(self, path: str, limits: Limits, *, verify_crc: bool = False) -> None:
        found = _iteration_dir(path)
        if found is None:  # pragma: no cover - the registry sniffed it
            raise NotACheckpointError("not a Megatron checkpoint directory", path=path)
        self.path = found
        self.limits = limits
        self.verify_crc = verify_crc
        self.ranks = _rank_dirs(found)
        self._ranks = RankFiles(self.limits, self.verify_crc)
        self._tree: dict[str, Any] = {}

    def persistent_load(self, pid: Any, offset: int) -> Storage:
        return self._ranks.persistent_load(pid, offset)

    def load(self, resolver: TorchResolver) -> Any:
        for rank in self.ranks:
            self._tree[rank] = self._ranks.read(os.path.join(self.path, rank, FILE),
                                                f"{rank}/{FILE}", resolver)
        return self._tree

    def describe(self, resolver: TorchResolver) -> dict[str, Any]:
        stages: dict[int, dict[int, str]] = {}
        for rank in self.ranks:
            m = _RANK.match(rank)
            assert m is not None
            stages.setdefault(int(m.group(2) or 0), {})[int(m.group(1))] = rank
        partitions: dict[str, list[list[int] | None]] = {}
        for stage in stages.values():
            order = [stage[t] for t in sorted(stage)]
            models = [_tensors(self._tree[r].get("model"), "") if isinstance(
                self._tree.get(r), dict) else {} for r in order]
            for name in sorted({k for m in models for k in m}):
                partitions[name] = [list(m[name].shape) if name in m else None
                                    for m in models]
        first = self._tree.get(self.ranks[0]) if self.ranks else None
        return {"iteration": first.get("iteration") if isinstance(first, dict) else None,
                "ranks": self.ranks,
                "tensor_parallel": max((len(s) for s in stages.values()), default=0),
                "pipeline_parallel": len(stages),
                "partitions": partitions,
                "unplaced": sorted(n for n, shapes in partitions.items() if len(shapes) > 1)}

    def module_hook(self) -> ModuleHook:
        return module_state_dict

    def release(self, offset: int, n: int) -> None:
        """Nothing: each rank's file is its own map."""

    def close(self) -> None:
        self._ranks.close()


def _tensors(value: Any, prefix: str, depth: int = 0) -> dict[str, Tensor]:
    """The tensors of a (nested) model state dict by dotted name."""
    if isinstance(value, Tensor):
        return {prefix[:-1]: value}
    out: dict[str, Tensor] = {}
    if isinstance(value, dict) and depth < 64:
        for k, v in value.items():
            out.update(_tensors(v, f"{prefix}{k}.", depth + 1))
    return out
