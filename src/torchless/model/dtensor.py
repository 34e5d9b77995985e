"""One rank's piece of a distributed tensor, as ``torch.save`` of a ``DTensor`` (FSDP2,
verl's ``model_world_size_W_rank_R.pt``) leaves it in a rank file: the local tensor, the
global shape, the placements on each mesh dimension and the rank's coordinate on the mesh;
or of a ``ShardedTensor`` (FSDP1's ``SHARDED_STATE_DICT``): local shards with their offsets.

Alone it is not the tensor (it stands as an unsupported tensor, saying so); a directory of
every rank's file puts the pieces together (:mod:`torchless.containers.ranks`). Where a piece
lies is computed as torch splits a tensor for ``distribute_tensor``
(``torch/distributed/tensor/placement_types.py``, ``Shard._split_tensor`` and
``_StridedShard._split_tensor``; ``_utils.py`` ``_compute_local_shape_and_global_offset``
walks them the same way): for each mesh dimension in order, with ``n`` ranks on it and the
rank at coordinate ``c``, the elements the piece holds so far along the sharded dimension
``d`` (in order, global indices) are cut as ``torch.chunk`` cuts:

* ``Shard(d)``: in chunks of ``ceil(size / n)`` elements; the rank keeps chunk ``c`` (the
  last chunks shorter or empty);
* ``_StridedShard(d, split_factor=f)`` (FSDP2 with tensor parallelism: the right-to-left
  sharding written left to right): first in ``f`` chunks, then each of those in ``n``
  chunks; the rank keeps chunk ``c`` of every one of the ``f``, end to end;
* ``Replicate()`` keeps them all (the piece of coordinate 0 on that mesh dimension is the
  one used).

So a piece holds, along each dimension, runs of consecutive global indices: one run for
``Shard`` alone, several after ``_StridedShard``. It is placed as the boxes of every
combination of its runs, each a view of the local tensor. ``Partial`` placements (a value
each rank holds a part of, to be summed or otherwise reduced across ranks) are no
placement of elements: such a DTensor is refused (:mod:`torchless.rules.dtensor`).
"""

from __future__ import annotations

import itertools

from torchless.model.tensor import Tensor, UnsupportedTensor

__all__ = ["REPLICATE", "Box", "DTensorShard", "DistributedPiece", "Placement", "Run",
           "ShardedTensorPiece", "local_box", "local_runs"]

#: The placement ``Replicate()`` (a ``Shard(d)`` placement is the int ``d``).
REPLICATE = -1

#: A placement on one mesh dimension: ``Shard(d)`` is ``d``, ``Replicate()``
#: :data:`REPLICATE`, ``_StridedShard(d, split_factor=f)`` the pair ``(d, f)``.
Placement = int | tuple[int, int]
#: Consecutive global indices along one dimension: (first, count).
Run = tuple[int, int]


def _positions(runs: list[Run], a: int, b: int) -> list[Run]:
    """The runs of the elements at positions ``a:b`` of ``runs`` taken end to end."""
    out: list[Run] = []
    pos = 0
    for start, count in runs:
        lo, hi = max(a, pos), min(b, pos + count)
        if lo < hi:
            out.append((start + lo - pos, hi - lo))
        pos += count
    return out


def _merged(runs: list[Run]) -> list[Run]:
    out: list[Run] = []
    for start, count in runs:
        if out and out[-1][0] + out[-1][1] == start:
            out[-1] = (out[-1][0], out[-1][1] + count)
        else:
            out.append((start, count))
    return out


def local_runs(shape: tuple[int, ...], placements: tuple[Placement, ...],
               mesh: tuple[int, ...], coordinate: tuple[int, ...]) -> list[list[Run]]:
    """For each dimension, the runs of global indices the piece of the rank at
    ``coordinate`` holds along it, in the local tensor's order (the module's rule)."""
    runs = [[(0, n)] if n else [] for n in shape]
    for n, c, p in zip(mesh, coordinate, placements, strict=True):
        if p == REPLICATE:
            continue
        d, split = (p, 1) if isinstance(p, int) else p
        cur = sum(count for _, count in runs[d])
        outer = -(-cur // split)
        kept: list[Run] = []
        for j in range(split):
            lo, hi = j * outer, min(cur, (j + 1) * outer)
            inner = -(-(hi - lo) // n) if hi > lo else 0
            a, b = lo + c * inner, min(hi, lo + (c + 1) * inner)
            if a < b:
                kept += _positions(runs[d], a, b)
        runs[d] = _merged(kept)
    return runs


def local_box(shape: tuple[int, ...], placements: tuple[Placement, ...],
              mesh: tuple[int, ...], coordinate: tuple[int, ...]
              ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(offsets, sizes) of the piece the rank at ``coordinate`` holds, as torch's
    ``_compute_local_shape_and_global_offset`` gives them: the local sizes, and along each
    dimension the first global index held (the dimension's size when none is)."""
    runs = local_runs(shape, placements, mesh, coordinate)
    return (tuple(r[0][0] if r else n for r, n in zip(runs, shape, strict=True)),
            tuple(sum(count for _, count in r) for r in runs))


def _boxes(local: Tensor, runs: list[list[Run]]) -> list[Box]:
    """The piece's boxes of the global tensor: every combination of its runs, each a view of
    the local tensor (one box, the local tensor itself, when every dimension is one run)."""
    if all(len(r) == 1 for r in runs) or not runs:
        return [(tuple(r[0][0] for r in runs), tuple(r[0][1] for r in runs), local)]
    boxes: list[Box] = []
    along = [[(start, count, sum(c for _, c in r[:i])) for i, (start, count) in enumerate(r)]
             for r in runs]
    for combo in itertools.product(*along):
        offset = local.storage_offset + sum(at * st for (_, _, at), st
                                            in zip(combo, local.stride, strict=True))
        sizes = tuple(count for _, count, _ in combo)
        view = Tensor(local.storage, local.dtype, sizes, local.stride, offset)
        boxes.append((tuple(start for start, _, _ in combo), sizes, view))
    return boxes


#: One box of a distributed tensor a rank holds: (offsets, sizes, the values).
Box = tuple[tuple[int, ...], tuple[int, ...], Tensor]


class DistributedPiece(UnsupportedTensor):
    """What one rank file holds of a distributed tensor: its boxes of the global tensor.
    ``identity`` tells the ranks' pieces apart (two files with the same one are copies)."""

    __slots__ = ("boxes", "identity", "shape")

    def __init__(self, kind: str, shape: tuple[int, ...], boxes: list[Box],
                 identity: tuple[int, ...]) -> None:
        super().__init__(kind)
        self.shape = shape
        self.boxes = boxes
        self.identity = identity

    def signature(self) -> tuple[object, ...]:
        """What every rank's piece of one tensor agrees on."""
        return (self.shape,)


class DTensorShard(DistributedPiece):
    """A rank's piece of a ``DTensor`` (read as data: nothing of torch.distributed runs)."""

    __slots__ = ("coordinate", "local", "mesh", "placements")

    def __init__(self, local: Tensor, shape: tuple[int, ...],
                 placements: tuple[Placement, ...], mesh: tuple[int, ...],
                 coordinate: tuple[int, ...]) -> None:
        shown = ", ".join("Replicate()" if p == REPLICATE else f"Shard({p})"
                          if isinstance(p, int) else f"_StridedShard({p[0]}, split_factor="
                          f"{p[1]})" for p in placements)
        self.local = local
        self.placements = placements
        self.mesh = mesh
        self.coordinate = coordinate
        runs = local_runs(shape, placements, mesh, coordinate)
        held = tuple(sum(count for _, count in r) for r in runs)
        boxes = _boxes(local, runs) if self.primary and held == local.shape else []
        super().__init__(f"DTensor piece ([{shown}] of {list(shape)} on a {list(mesh)} "
                         f"mesh, coordinate {list(coordinate)}: one rank's part; open the "
                         "directory of every rank's file to read the whole)", shape,
                         boxes, coordinate)

    @property
    def primary(self) -> bool:
        """Whether this piece is the one read (coordinate 0 on every replicated dimension)."""
        return all(c == 0 for c, d in zip(self.coordinate, self.placements, strict=True)
                   if d == REPLICATE)

    def box(self, shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return local_box(shape, self.placements, self.mesh, self.coordinate)

    def signature(self) -> tuple[object, ...]:
        return (self.shape, self.local.dtype, self.placements, self.mesh)


class ShardedTensorPiece(DistributedPiece):
    """A rank's local shards of a ``ShardedTensor`` (FSDP1's ``SHARDED_STATE_DICT``), each
    with the offsets its ``ShardMetadata`` records."""

    __slots__ = ()

    def __init__(self, shape: tuple[int, ...], boxes: list[Box], rank: int) -> None:
        super().__init__(f"ShardedTensor piece (rank {rank}'s {len(boxes)} local shard(s) of "
                         f"{list(shape)}: one rank's part; open the directory of every "
                         "rank's file to read the whole)", shape, boxes, (rank,))
