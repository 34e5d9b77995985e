"""A directory of per-rank ``torch.save`` files of distributed tensors, as verl's FSDP
checkpointer writes them (``verl/utils/checkpoint/fsdp_checkpoint_manager.py``)::

    DIR/model_world_size_W_rank_R.pt        model.state_dict() on rank R (DTensors)
    DIR/optim_world_size_W_rank_R.pt        optimizer.state_dict() on rank R (optional)
    DIR/extra_state_world_size_W_rank_R.pt  scheduler and RNG state of rank R (optional)

FSDP1's ``SHARDED_STATE_DICT`` saved with ``torch.save`` per rank under the same names
(``ShardedTensor`` values) reads the same way. Every file is a ``torch.save`` archive read
with the caller's rules; each ``DTensor`` or ``ShardedTensor`` in it is one rank's piece
(:mod:`torchless.model.dtensor`). The object is rank 0's tree with every
piece replaced by the global tensor put together from all ranks' pieces at the same place
(:func:`~.dcpchunks.assembled`: a lazy tensor streamed chunk by chunk, coverage checked), as
``DTensor.full_tensor()`` gathers it: ``{"model": ..., "optimizer": ..., "extra_state":
...}``; ``Checkpoint.tensors`` are the model's.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from torchless.containers.dcpchunks import Piece, assembled, coverage
from torchless.containers.dcpmeta import Chunk, TensorMeta
from torchless.containers.rankfiles import RankFiles
from torchless.core.limits import Limits
from torchless.errors import (
    FormatError,
    LimitError,
    StorageError,
    type_phrase,
)
from torchless.model.dtensor import DistributedPiece, DTensorShard
from torchless.model.graph import ModuleHook, module_state_dict
from torchless.model.tensor import Storage, Tensor, UnsupportedTensor
from torchless.rules.resolver import TorchResolver

__all__ = ["RankDirectory", "is_rank_dir"]

_FILE = re.compile(r"(model|optim|extra_state)_world_size_(\d+)_rank_(\d+)\.pt\Z")
_KEYS = {"model": "model", "optim": "optimizer", "extra_state": "extra_state"}
_HINT = ("the checkpoint is incomplete or damaged (a rank's file missing?): copy the whole "
         "directory again")


def _ranks(path: str) -> dict[str, dict[int, str]]:
    """kind -> rank -> file name, for the world size of the model files (empty when the
    directory is not such a checkpoint: no model files, or not one for every rank)."""
    try:
        names = os.listdir(path)
    except OSError:
        return {}
    found: dict[str, dict[int, str]] = {}
    sizes: set[int] = set()
    for name in names:
        m = _FILE.match(name)
        if m:
            world, rank = int(m.group(2)), int(m.group(3))
            if m.group(1) == "model":
                sizes.add(world)
            if rank < world:
                found.setdefault(f"{m.group(1)}/{world}", {})[rank] = name
    if len(sizes) != 1:
        return {}
    world = sizes.pop()
    out = {kind: found.get(f"{kind}/{world}", {}) for kind in _KEYS}
    if sorted(out["model"]) != list(range(world)):
        return {}
    return {k: v for k, v in out.items() if sorted(v) == list(range(world))}


def is_rank_dir(path: str) -> bool:
    """A directory holding ``model_world_size_W_rank_R.pt`` for every rank R < W."""
    return bool(_ranks(path))


class RankDirectory:
    """Reads a directory of per-rank files and puts their distributed tensors together."""

    format = "ranks"
    remote = False
    size = 0

    def __init__(self, path: str, limits: Limits, *, verify_crc: bool = False) -> None:
        self.path = path
        self.limits = limits
        self.verify_crc = verify_crc
        self.files = _ranks(path)
        if not self.files:  # pragma: no cover - the registry sniffed it
            raise StorageError("not a directory of rank files", path=path)
        self.world_size = len(self.files["model"])
        self._ranks = RankFiles(self.limits, self.verify_crc)
        self.placed = 0

    def _read(self, name: str, resolver: TorchResolver) -> Any:
        return self._ranks.read(os.path.join(self.path, name), name, resolver)

    def persistent_load(self, pid: Any, offset: int) -> Storage:
        return self._ranks.persistent_load(pid, offset)

    def load(self, resolver: TorchResolver) -> Any:
        tree: dict[str, Any] = {}
        for kind, files in self.files.items():
            names = [files[r] for r in range(self.world_size)]
            trees = [self._read(n, resolver) for n in names]
            tree[_KEYS[kind]] = self._joined(trees, names, ())
        return tree

    def _joined(self, values: list[Any], names: list[str], path: tuple[Any, ...]) -> Any:
        """Rank 0's value with every DTensor piece in it replaced by the global tensor."""
        first = values[0]
        if isinstance(first, DistributedPiece):
            return self._tensor(values, names, path)
        if isinstance(first, dict):
            out = {}
            for k, v in first.items():
                others = [x.get(k) if isinstance(x, dict) else None for x in values[1:]]
                out[k] = self._joined([v, *others], names, (*path, k))
            return out
        if isinstance(first, (list, tuple)):
            items = [self._joined([v, *(x[i] if isinstance(x, (list, tuple)) and
                                        len(x) > i else None for x in values[1:])],
                                  names, (*path, i))
                     for i, v in enumerate(first)]
            return items if isinstance(first, list) else tuple(items)
        return first

    def _tensor(self, values: list[Any], names: list[str], path: tuple[Any, ...]
                ) -> Tensor | UnsupportedTensor:
        fqn = ".".join(str(p) for p in path)
        first: DistributedPiece = values[0]
        for v, name in zip(values, names, strict=True):
            if not isinstance(v, DistributedPiece) or type(v) is not type(first):
                raise FormatError(f"{fqn!r} is a distributed tensor's piece on rank 0 but "
                                  f"{type_phrase(v)} in {name}", member=name, hint=_HINT)
            if v.signature() != first.signature():
                raise FormatError(f"the pieces of {fqn!r} disagree on its global shape, "
                                  "dtype, placements or mesh", member=name, hint=_HINT)
        ids = [v.identity for v in values if v.boxes or isinstance(v, DTensorShard)]
        if len(set(ids)) != len(ids):
            raise FormatError(f"two rank files hold the same piece of {fqn!r} (the same "
                              "mesh coordinate or shards)", hint=_HINT)
        pieces = [Piece(Chunk(offsets, sizes), t, *self._ranks.file(name))
                  for v, name in zip(values, names, strict=True)
                  for offsets, sizes, t in v.boxes]
        dtypes = {p.tensor.dtype for p in pieces}
        if len(dtypes) > 1:
            raise FormatError(f"the pieces of {fqn!r} differ in dtype", hint=_HINT)
        if not pieces:
            return UnsupportedTensor("distributed tensor no rank file holds a piece of")
        meta = TensorMeta(pieces[0].tensor.dtype, first.shape, tuple(p.chunk for p in pieces))
        if len(meta.size) > self.limits.max_ndim:
            raise LimitError("max_ndim", self.limits.max_ndim, len(meta.size), fqn)
        nbytes = math.prod(meta.size) * meta.dtype.itemsize
        if nbytes > self.limits.max_tensor_bytes:
            raise LimitError("max_tensor_bytes", self.limits.max_tensor_bytes, nbytes, fqn)
        missing, overlap = coverage(meta)
        if missing or overlap:
            return UnsupportedTensor(f"distributed tensor whose pieces in the {len(values)} "
                                     f"rank files do not tile it ({missing} elements missing"
                                     f"{', overlapping pieces' if overlap else ''})")
        self.placed += 1
        return assembled(fqn, meta, pieces)

    def weights(self, tree: Any) -> Any:
        """What ``Checkpoint.tensors`` holds: the model's tensors (``convert`` writes
        these; ``load`` gives the optimizer and extra state too)."""
        return tree.get("model", {}) if isinstance(tree, dict) else {}

    def describe(self, resolver: TorchResolver) -> dict[str, Any]:
        return {"world_size": self.world_size, "distributed_tensors": self.placed,
                "files": {_KEYS[k]: [v[r] for r in sorted(v)] for k, v in self.files.items()}}

    def module_hook(self) -> ModuleHook:
        return module_state_dict

    def release(self, offset: int, n: int) -> None:
        """Nothing: each piece hands back its own file's pages as it is streamed."""

    def close(self) -> None:
        self._ranks.close()
