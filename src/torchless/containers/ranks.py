"""A directory of per-rank ``torch.save`` files of distributed tensors, as verl's FSDP
checkpointer writes them (``verl/utils/checkpoint/fsdp_checkpoint_manager.py``)::

    DIR/model_world_size_W_rank_R.pt        model.state_dict() on rank R (DTensors)
    DIR/optim_world_size_W_rank_R.pt        optimizer.state_dict() on rank R (optional)
    DIR/extra_state_world_size_W_rank_R.pt  scheduler and RNG state of rank R (optional)

FSDP1's ``SHARDED_STATE_DICT`` saved with ``torch.save`` per rank under the same names
(``ShardedTensor`` values) reads the same way.

Under any other naming, a directory is one by its files' content (:func:`rank_groups`): a
*group* is the files whose names differ only in their last number (``rank0.pt``,
``rank1.pt``; ``model_rank_0.pt``; ``shard_00.pt`` …: the name with its last run of digits
taken out is the group's pattern, ``rank{R}.pt``), the numbers exactly ``0 .. W-1`` for
some ``W >= 2``, and every file of it a ``torch.save`` archive whose pickle names
torch.distributed's ``DTensor`` or ``ShardedTensor``. One such group is the checkpoint, its
tree the joined object; several (``model_rank{R}.pt`` and ``optim_rank{R}.pt``) must have one
world size, the tree then holds each under its pattern and ``Checkpoint.tensors`` are the
group's whose pattern starts with ``model`` (every group's when none or several do). Reading
checks the world size each piece records against the number of files: a DTensor's mesh
holds ``W`` ranks, a ShardedTensor's shards lie on ranks below ``W``.

Every file is a ``torch.save`` archive read
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
from torchless.containers.torchzip import TorchZip
from torchless.core.limits import Limits
from torchless.errors import (
    CheckpointError,
    FormatError,
    LimitError,
    StorageError,
    type_phrase,
)
from torchless.io.source import Source
from torchless.model.dtensor import DistributedPiece, DTensorShard, ShardedTensorPiece
from torchless.model.graph import ModuleHook, module_state_dict
from torchless.model.tensor import Storage, Tensor, UnsupportedTensor
from torchless.rules.resolver import TorchResolver

__all__ = ["RankDirectory", "is_rank_dir", "rank_groups"]

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


_LAST_NUMBER = re.compile(r"(\d+)(\D*)\Z")
#: What a pickle naming DTensor or ShardedTensor holds (its GLOBAL / STACK_GLOBAL strings).
_MARKS = (b"torch.distributed", (b"DTensor", b"ShardedTensor"))
_SNIFF = Limits()


def _names_by_pattern(path: str) -> dict[str, dict[int, str]]:
    """pattern (the name, its last number as ``{R}``) -> number -> name, of the visible
    regular files; a pattern two names give one number (``rank1``, ``rank01``) is dropped."""
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return {}
    out: dict[str, dict[int, str]] = {}
    clashes: set[str] = set()
    for name in names:
        m = _LAST_NUMBER.search(name)
        if m is None or name.startswith(".") or not os.path.isfile(os.path.join(path, name)):
            continue
        pattern = f"{name[:m.start()]}{{R}}{m.group(2)}"
        group = out.setdefault(pattern, {})
        if int(m.group(1)) in group:
            clashes.add(pattern)
        group[int(m.group(1))] = name
    return {k: v for k, v in out.items() if k not in clashes}


def _holds_distributed(path: str) -> bool:
    """Whether ``path`` is a torch.save archive whose pickle names DTensor or
    ShardedTensor (its bytes searched, nothing run; reading checks every piece)."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"PK\x03\x04":
                return False
        src = Source(path)
        try:
            data = TorchZip(src, _SNIFF).record("data.pkl")
        finally:
            src.close()
    except (CheckpointError, OSError):
        return False
    return _MARKS[0] in data and any(m in data for m in _MARKS[1])


def rank_groups(path: str) -> dict[str, dict[int, str]]:
    """The groups of per-rank files of distributed tensors in ``path`` under a naming of
    their own (the module's rule), by pattern; empty when there is none, or groups of
    different world sizes."""
    patterns = _names_by_pattern(path)
    if any(_FILE.match(n) for v in patterns.values() for n in v.values()):
        return {}  # verl's naming: its own rule (every rank's model file) decides

    def complete(v: dict[int, str]) -> bool:
        return len(v) >= 2 and sorted(v) == list(range(len(v)))

    def distributed(v: dict[int, str]) -> bool:
        return all(_holds_distributed(os.path.join(path, n)) for n in v.values())

    found = {k: v for k, v in patterns.items() if complete(v) and distributed(v)}
    if len({len(v) for v in found.values()}) != 1:
        return {}
    # a group with a rank missing (model_rank1.pt gone beside optim_rank0/1.pt) is no
    # checkpoint: the others alone would pass for it
    if any(not complete(v) and any(_holds_distributed(os.path.join(path, n))
                                   for n in v.values())
           for v in patterns.values()):
        return {}
    return found


def is_rank_dir(path: str) -> bool:
    """A directory holding ``model_world_size_W_rank_R.pt`` for every rank R < W, or per-rank
    files of distributed tensors under another naming (:func:`rank_groups`)."""
    return bool(_ranks(path)) or bool(rank_groups(path))


class RankDirectory:
    """Reads a directory of per-rank files and puts their distributed tensors together."""

    format = "ranks"
    remote = False
    size = 0

    def __init__(self, path: str, limits: Limits, *, verify_crc: bool = False) -> None:
        self.path = path
        self.limits = limits
        self.verify_crc = verify_crc
        verl = _ranks(path)
        #: tree key -> rank -> file name
        self.files = {_KEYS[k]: v for k, v in verl.items()} if verl else rank_groups(path)
        if not self.files:  # pragma: no cover - the registry sniffed it
            raise StorageError("not a directory of rank files", path=path)
        self.naming = "verl" if verl else "by content"
        self.world_size = len(next(iter(self.files.values())))
        self._ranks = RankFiles(self.limits, self.verify_crc)
        self.placed = 0

    def _read(self, name: str, resolver: TorchResolver) -> Any:
        return self._ranks.read(os.path.join(self.path, name), name, resolver)

    def persistent_load(self, pid: Any, offset: int) -> Storage:
        return self._ranks.persistent_load(pid, offset)

    def load(self, resolver: TorchResolver) -> Any:
        tree: dict[str, Any] = {}
        for key, files in self.files.items():
            names = [files[r] for r in range(self.world_size)]
            trees = [self._read(n, resolver) for n in names]
            tree[key] = self._joined(trees, names, ())
        if self.naming != "verl" and len(tree) == 1:
            return next(iter(tree.values()))
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
        world = self.world_size
        if isinstance(first, DTensorShard) and math.prod(first.mesh) != world:
            raise FormatError(f"{fqn!r} was saved on a mesh of {math.prod(first.mesh)} "
                              f"ranks {list(first.mesh)}; the directory holds {world} rank "
                              "files", hint=_HINT)
        for v, name in zip(values, names, strict=True):
            if isinstance(v, ShardedTensorPiece) and v.identity[0] >= world:
                raise FormatError(f"{name} holds shards of {fqn!r} placed on rank "
                                  f"{v.identity[0]}; the directory holds {world} rank "
                                  "files", member=name, hint=_HINT)
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
        if self.naming == "verl":
            return tree.get("model", {}) if isinstance(tree, dict) else {}
        if len(self.files) == 1:
            return tree
        models = [k for k in self.files if k.startswith("model")]
        return tree[models[0]] if len(models) == 1 and isinstance(tree, dict) else tree

    def describe(self, resolver: TorchResolver) -> dict[str, Any]:
        return {"world_size": self.world_size, "distributed_tensors": self.placed,
                "naming": self.naming,
                "files": {k: [v[r] for r in sorted(v)] for k, v in self.files.items()}}

    def module_hook(self) -> ModuleHook:
        return module_state_dict

    def release(self, offset: int, n: int) -> None:
        """Nothing: each piece hands back its own file's pages as it is streamed."""

    def close(self) -> None:
        self._ranks.close()
