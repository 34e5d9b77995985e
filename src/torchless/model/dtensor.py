"""One rank's piece of a distributed tensor, as ``torch.save`` of a ``DTensor`` (FSDP2,
verl's ``model_world_size_W_rank_R.pt``) leaves it in a rank file: the local tensor, the
global shape, the placements on each mesh dimension and the rank's coordinate on the mesh.

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

__all__ = ["REPLICATE", "DTensorShard", "local_box"]

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
        offsets[d] += start
    return tuple(offsets), tuple(sizes)


class DTensorShard(UnsupportedTensor):
    """A rank's piece of a ``DTensor`` (read as data: nothing of torch.distributed runs)."""

    __slots__ = ("coordinate", "local", "mesh", "placements", "shape")

    def __init__(self, local: Tensor, shape: tuple[int, ...], placements: tuple[int, ...],
                 mesh: tuple[int, ...], coordinate: tuple[int, ...]) -> None:
        shown = ", ".join("Replicate()" if d == REPLICATE else f"Shard({d})"
                          for d in placements)
        super().__init__(f"DTensor piece ([{shown}] of {list(shape)} on a {list(mesh)} mesh, "
                         f"coordinate {list(coordinate)}: one rank's part; open the "
                         "directory of every rank's file to read the whole)")
        self.local = local
        self.shape = shape
        self.placements = placements
        self.mesh = mesh
        self.coordinate = coordinate

    @property
    def primary(self) -> bool:
        """Whether this piece is the one read (coordinate 0 on every replicated dimension)."""
        return all(c == 0 for c, d in zip(self.coordinate, self.placements, strict=True)
                   if d == REPLICATE)

    def box(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return local_box(self.shape, self.placements, self.mesh, self.coordinate)
