"""One rank's piece of a distributed tensor, as ``torch.save`` of a ``DTensor`` (FSDP2,
verl's ``model_world_size_W_rank_R.pt``) leaves it in a rank file: the local tensor, the
global shape, the placements on each mesh dimension and the rank's coordinate on the mesh;
or of a ``ShardedTensor`` (FSDP1's ``SHARDED_STATE_DICT``): local shards with their offsets.

Alone it is not the tensor (it stands as an unsupported tensor, saying so); a directory of
every rank's file puts the pieces together (:mod:`torchless.containers.ranks`). Where a piece
lies is computed as torch does (``torch/distributed/tensor/_utils.py``
``compute_local_shape_and_global_offset`` with ``Shard._local_shard_size_and_offset``): for
each mesh dimension in order, a ``Shard(d)`` placement cuts the current extent of dimension
``d`` in ``ceil(size / n)`` pieces, the last ones shorter or empty; ``Replicate`` keeps it
whole (the piece of coordinate 0 on that mesh dimension is the one used).
"""

from __future__ import annotations

from torchless.model.tensor import Tensor, UnsupportedTensor

__all__ = ["REPLICATE", "Box", "DTensorShard", "DistributedPiece", "ShardedTensorPiece",
           "local_box"]

#: The placement ``Replicate()`` (a ``Shard(d)`` placement is the int ``d``).
REPLICATE = -1


def local_box(shape: tuple[int, ...], placements: tuple[int, ...], mesh: tuple[int, ...],
              coordinate: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(offsets, sizes) of the piece the rank at ``coordinate`` holds."""
    sizes, offsets = list(shape), [0] * len(shape)
    for n, c, d in zip(mesh, coordinate, placements, strict=True):
        if d == REPLICATE:
            continue
        cur = sizes[d]
        full = -(-cur // n) if n else 0
        start = full * c
        if cur % n == 0:
            size, start = cur // n, (cur // n) * c
        elif cur < start:
            size, start = 0, cur
        else:
            size = min(cur, start + full) - start
        sizes[d] = size
        # an empty piece starts at the end of the dimension, as torch places it
        offsets[d] = shape[d] if size == 0 else offsets[d] + start
    return tuple(offsets), tuple(sizes)


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

    def __init__(self, local: Tensor, shape: tuple[int, ...], placements: tuple[int, ...],
                 mesh: tuple[int, ...], coordinate: tuple[int, ...]) -> None:
        shown = ", ".join("Replicate()" if d == REPLICATE else f"Shard({d})"
                          for d in placements)
        self.local = local
        self.placements = placements
        self.mesh = mesh
        self.coordinate = coordinate
        offsets, sizes = self.box(shape)
        super().__init__(f"DTensor piece ([{shown}] of {list(shape)} on a {list(mesh)} "
                         f"mesh, coordinate {list(coordinate)}: one rank's part; open the "
                         "directory of every rank's file to read the whole)", shape,
                         [(offsets, sizes, local)] if self.primary else [], coordinate)

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
