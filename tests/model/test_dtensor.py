"""Where a DTensor piece lies: :func:`local_box` against torch's own
``_compute_local_shape_and_global_offset`` (the function DTensor uses), over even and uneven
sizes, empty pieces, 1-D and 2-D meshes, one dimension sharded twice and replicated mesh
dimensions; and malformed DTensor records left unsupported with the reason."""

from __future__ import annotations

import itertools
import math
from typing import Any

from torchless.core import dtypes
from torchless.model.dtensor import REPLICATE, DTensorShard, local_box, local_runs
from torchless.model.tensor import Storage, Tensor, UnsupportedTensor
from torchless.pickle.values import Global, Opaque
from torchless.rules.dtensor import dtensor_piece


def test_local_box_is_torchs(torch: Any) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    checked = 0
    for shape in [(7,), (1,), (0,), (6, 4), (5, 3), (3, 7), (2, 5, 3)]:
        for mesh in [(1,), (2,), (3,), (4,), (2, 2), (2, 3), (3, 2)]:
            choices = [REPLICATE, *range(len(shape))]
            for placements in itertools.product(choices, repeat=len(mesh)):
                theirs_p = [Replicate() if d == REPLICATE else Shard(d) for d in placements]
                for coord in itertools.product(*(range(n) for n in mesh)):
                    sizes, offsets = _compute_local_shape_and_global_offset(
                        shape, mesh, list(coord), theirs_p)
                    ours = local_box(shape, placements, mesh, coord)
                    assert ours == (tuple(offsets), tuple(sizes)), (shape, mesh,
                                                                     placements, coord)
                    checked += 1
    assert checked > 1000


def test_strided_shard_is_torchs(torch: Any) -> None:
    """``_StridedShard`` (and ``Shard``) pieces: the elements each rank holds, in order, as
    torch's own ``_split_tensor`` cuts a tensor of its indices (what ``distribute_tensor``
    scatters), and the box ``_compute_local_shape_and_global_offset`` reports."""
    import numpy as np
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
    from torch.distributed.tensor.placement_types import _StridedShard

    checked = 0
    for shape in [(7,), (9,), (2,), (0,), (8, 3), (5, 6), (3, 10)]:
        for mesh in [(2,), (3,), (4,), (2, 2), (2, 3)]:
            choices: list[Any] = [REPLICATE, *range(len(shape)),
                                  *((d, f) for d in range(len(shape)) for f in (2, 3))]
            for placements in itertools.product(choices, repeat=len(mesh)):
                theirs_p = [Replicate() if p == REPLICATE else Shard(p) if isinstance(p, int)
                            else _StridedShard(p[0], split_factor=p[1]) for p in placements]
                whole = torch.arange(math.prod(shape)).reshape(shape)
                for coord in itertools.product(*(range(n) for n in mesh)):
                    local = whole
                    for n, c, p in zip(mesh, coord, theirs_p, strict=True):
                        if not isinstance(p, Replicate):
                            local = p._split_tensor(local, n, with_padding=False)[0][c]
                    runs = local_runs(shape, placements, mesh, coord)
                    index = [np.concatenate([np.arange(a, a + k) for a, k in r] or
                                            [np.zeros(0, dtype=np.int64)]) for r in runs]
                    ours = whole.numpy()[np.ix_(*index)]
                    key = (shape, mesh, placements, coord)
                    assert ours.shape == tuple(local.shape), key
                    assert (ours == local.numpy()).all(), key
                    sizes, offsets = _compute_local_shape_and_global_offset(
                        shape, mesh, list(coord), theirs_p)
                    assert local_box(shape, placements, mesh, coord) == (
                        tuple(offsets), tuple(sizes)), key
                    checked += 1
    assert checked > 1000


def _local(*shape: int) -> Tensor:
    f32 = dtypes.by_torch_name("float32")
    assert f32 is not None
    n = math.prod(shape)
    storage = Storage("0", f32, 4 * n, lambda: bytes(4 * n))
    return Tensor(storage, f32, shape, tuple(math.prod(shape[i + 1:])
                                             for i in range(len(shape))), 0)


def _record(module: str, name: str, state: Any = None, args: tuple[Any, ...] = ()) -> Opaque:
    value = Opaque(Global(module, name), args, newobj=True)
    if state is not None:
        value.state = state
    return value


def _state(local: Tensor, shape: tuple[int, ...], dim: Any, mesh: int,
           coord: Any) -> dict[str, Any]:
    flat = _record("torch.distributed._mesh_layout", "_FlatLayout",
                   {"shape": (mesh,), "stride": (1,)})
    layout = _record("torch.distributed._mesh_layout", "_MeshLayout", {"axes": (flat,)})
    device_mesh = _record("torch.distributed.device_mesh", "DeviceMesh",
                          {"_layout": layout, "_coordinate_on_dim": coord})
    placement = _record("torch.distributed.tensor.placement_types", "Shard", {"dim": dim})
    meta = _record("torch.distributed.tensor._dtensor_spec", "TensorMeta", None,
                   (shape, (1,), Global("torch", "float32")))
    spec = _record("torch.distributed.tensor._dtensor_spec", "DTensorSpec",
                   {"mesh": device_mesh, "placements": (placement,), "tensor_meta": meta})
    return {"_local_tensor": local, "_spec": spec}


def test_a_well_formed_record_is_a_piece() -> None:
    piece = dtensor_piece((None, _state(_local(3, 6), (7, 6), 0, 2, (1,))))
    assert isinstance(piece, DTensorShard)
    assert piece.box((7, 6)) == ((4, 0), (3, 6))


def test_malformed_records_stay_unsupported_with_the_reason() -> None:
    cases = {
        "placement Shard is not Shard(dim)": _state(_local(3, 6), (7, 6), 5, 2, (1,)),
        "coordinate [2] and 1 placements do not match": _state(_local(3, 6), (7, 6), 0, 2,
                                                               (2,)),
        "its local tensor is [2, 6]; its placements give [3, 6]":
            _state(_local(2, 6), (7, 6), 0, 2, (1,)),
        "not on its mesh": _state(_local(3, 6), (7, 6), 0, 2, None),
        "holds no local tensor": {"_spec": None},
    }
    for why, state in cases.items():
        got = dtensor_piece(state)
        assert type(got) is UnsupportedTensor and why in got.kind, (why, got.kind)
    assert type(dtensor_piece("junk")) is UnsupportedTensor
