"""A pickled ``DTensor`` read as data: ``_rebuild_from_type_v2(_rebuild_wrapper_subclass,
DTensor, args, state)`` whose state holds ``_local_tensor`` (the rank's piece) and ``_spec``,
a ``DTensorSpec`` record (``torch/distributed/tensor/_dtensor_spec.py``); torch's
``_get_obj_state`` pickles them as a ``(__dict__, slots)`` pair (DTensor has slots)::

    DTensorSpec.__dict__ = {mesh: DeviceMesh, placements: (Shard(dim) | Replicate(), ...),
                            tensor_meta: TensorMeta(shape, stride, dtype), ...}
    DeviceMesh.__dict__  = {_layout: _MeshLayout(axes=(_FlatLayout(shape, stride), ...))
                            (torch >= 2.9; before: mesh, a tensor of the mesh's ranks),
                            _coordinate_on_dim: (c0, c1, ...), ...}

Placements are ``Shard(dim)``, ``Replicate()`` and ``_StridedShard(dim, split_factor)``
(FSDP2 with tensor parallelism; placed as :mod:`torchless.model.dtensor` says). Every field
is checked; anything else leaves the tensor unsupported with the reason, never guessed:
``Partial`` above all, whose ranks each hold a part of the value (the tensor is their sum,
or their max …: a reduction across ranks, not a placement of elements).
"""

from __future__ import annotations

import math
from typing import Any

from torchless.core import dtypes as _dtypes
from torchless.model.dtensor import REPLICATE, Box, DTensorShard, Placement, ShardedTensorPiece
from torchless.model.tensor import Tensor, UnsupportedTensor
from torchless.pickle.values import Global, Opaque

__all__ = ["DTENSOR_CLASSES", "SHARDED_TENSOR_CLASSES", "dtensor_piece",
           "sharded_tensor_piece"]

DTENSOR_CLASSES = frozenset({("torch.distributed.tensor", "DTensor"),
                             ("torch.distributed.tensor._api", "DTensor"),
                             ("torch.distributed._tensor.api", "DTensor"),
                             ("torch.distributed._tensor", "DTensor")})
SHARDED_TENSOR_CLASSES = frozenset({
    ("torch.distributed._shard.sharded_tensor.api", "ShardedTensor"),
    ("torch.distributed._shard.sharded_tensor", "ShardedTensor")})
_PLACEMENTS = ("torch.distributed.tensor.placement_types",
               "torch.distributed._tensor.placement_types")


class _Bad(Exception):
    pass


def _attributes(state: Any) -> Any:
    """A state as a dict of attributes: ``_get_obj_state``'s ``(__dict__, slots)`` pair
    (classes with slots) merged, any other value as it is."""
    if type(state) is tuple and len(state) == 2 and all(p is None or isinstance(p, dict)
                                                        for p in state):
        return {k: v for p in state if p is not None for k, v in p.items()}
    return state


def _fields(value: Any, name: str) -> dict[str, Any]:
    state = _attributes(value.state) if isinstance(value, Opaque) else None
    if not (isinstance(value, Opaque) and isinstance(value.callable, Global)
            and value.callable.name == name and isinstance(state, dict)):
        raise _Bad(f"its {name} is not the record torch writes")
    return state


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not all(type(v) is int and v >= 0
                                                       for v in value):
        raise _Bad(f"its {what} is not a tuple of sizes")
    return tuple(value)


def _placement(value: Any, ndim: int) -> Placement:
    if not (isinstance(value, Opaque) and isinstance(value.callable, Global)
            and value.callable.module in _PLACEMENTS):
        raise _Bad("a placement is not a torch placement record")
    name = value.callable.name
    state = _attributes(value.state)
    if name == "Replicate":
        return REPLICATE
    if name == "Partial":
        op = state.get("reduce_op") if isinstance(state, dict) else None
        shown = f"Partial({op})" if isinstance(op, str) and op.isidentifier() else "Partial"
        raise _Bad(f"its placement {shown} is a partial value on each rank: the tensor is "
                   f"their {op if shown != 'Partial' else 'reduction'} across ranks, a "
                   "reduction torchless does not do (redistribute it to Replicate() or "
                   "Shard() in torch before saving)")
    if name in ("Shard", "_StridedShard") and isinstance(state, dict):
        dim = state.get("dim")
        if type(dim) is int and -ndim <= dim < ndim:
            if name == "Shard":
                return dim % ndim
            split = state.get("split_factor")
            if type(split) is int and split >= 1:
                return (dim % ndim, split)
            raise _Bad(f"its placement _StridedShard has split_factor {split!r:.40}, not "
                       "a positive int")
    raise _Bad(f"its placement {name} is not Shard(dim), _StridedShard(dim, "
               "split_factor) or Replicate()")


def _mesh(state: dict[str, Any]) -> tuple[int, ...]:
    layout = state.get("_layout")
    if layout is not None:
        axes = _fields(layout, "_MeshLayout").get("axes")
        if not isinstance(axes, (tuple, list)):
            raise _Bad("its mesh layout holds no axes")
        return tuple(math.prod(_ints(_fields(a, "_FlatLayout").get("shape"), "mesh axis"))
                     for a in axes)
    mesh = state.get("mesh")
    if isinstance(mesh, Tensor):
        return mesh.shape
    raise _Bad("its device mesh records no shape")


def _piece(state: Any) -> DTensorShard:
    state = _attributes(state)
    if not isinstance(state, dict) or not isinstance(state.get("_local_tensor"), Tensor):
        raise _Bad("its state holds no local tensor")
    local: Tensor = state["_local_tensor"]
    spec = _fields(state.get("_spec"), "DTensorSpec")
    meta = spec.get("tensor_meta")
    if not (isinstance(meta, Opaque) and isinstance(meta.callable, Global)
            and meta.callable.name == "TensorMeta" and len(meta.args) == 3):
        raise _Bad("its tensor_meta is not the record torch writes")
    shape = _ints(meta.args[0], "global shape")
    dtype = meta.args[2]
    if isinstance(dtype, Global):
        dtype = _dtypes.by_torch_name(dtype.name)
    if dtype != local.dtype:
        raise _Bad(f"its global dtype {dtype!r:.40} is not its local tensor's "
                   f"{local.dtype.name}")
    placements = spec.get("placements")
    if not isinstance(placements, (tuple, list)) or not placements:
        raise _Bad("it records no placements")
    dims = tuple(_placement(p, len(shape)) for p in placements)
    mesh_state = _fields(spec.get("mesh"), "DeviceMesh")
    mesh = _mesh(mesh_state)
    coordinate = mesh_state.get("_coordinate_on_dim")
    if coordinate is None:
        raise _Bad("the rank that saved it is not on its mesh")
    coordinate = _ints(coordinate, "mesh coordinate")
    if not (len(mesh) == len(coordinate) == len(dims)) or any(
            c >= n for c, n in zip(coordinate, mesh, strict=True)):
        raise _Bad(f"its mesh {list(mesh)}, coordinate {list(coordinate)} and "
                   f"{len(dims)} placements do not match")
    piece = DTensorShard(local, shape, dims, mesh, coordinate)
    if piece.box(shape)[1] != local.shape:
        raise _Bad(f"its local tensor is {list(local.shape)}; its placements give "
                   f"{list(piece.box(shape)[1])}")
    return piece


def dtensor_piece(state: Any) -> UnsupportedTensor:
    """The rank's piece of a DTensor from its pickled state, or an unsupported tensor
    saying why it cannot be placed."""
    try:
        return _piece(state)
    except _Bad as e:
        return UnsupportedTensor(f"DTensor ({e})")


def _shards(args: Any, state: Any) -> ShardedTensorPiece:
    if not isinstance(args, tuple) or len(args) < 3:
        raise _Bad("its wrapper arguments are not the ones torch writes")
    shape = _ints(args[2], "global shape")
    # ShardedTensor.__getstate__: (local_shards, metadata, pg_state, sharding_spec, rrefs)
    if type(state) is not tuple or len(state) != 5 or not isinstance(state[0], list):
        raise _Bad("its state is not the one ShardedTensor.__getstate__ writes")
    boxes: list[Box] = []
    rank = -1
    for shard in state[0]:
        fields = _fields(shard, "Shard")
        tensor, meta = fields.get("tensor"), _fields(fields.get("metadata"), "ShardMetadata")
        if not isinstance(tensor, Tensor):
            raise _Bad("a local shard holds no tensor")
        offsets = _ints(meta.get("shard_offsets"), "shard offsets")
        sizes = _ints(meta.get("shard_sizes"), "shard sizes")
        if len(offsets) != len(shape) or sizes != tensor.shape or any(
                o + n > d for o, n, d in zip(offsets, sizes, shape, strict=True)):
            raise _Bad(f"a local shard of {list(tensor.shape)} at {list(offsets)} does not "
                       f"lie inside {list(shape)}")
        placement = meta.get("placement")
        if isinstance(placement, Opaque) and isinstance(_attributes(placement.state), dict):
            found = _attributes(placement.state).get("_rank")
            rank = found if type(found) is int else rank
        boxes.append((offsets, sizes, tensor))
    return ShardedTensorPiece(shape, boxes, rank)


def sharded_tensor_piece(args: Any, state: Any) -> UnsupportedTensor:
    """A rank's local shards of a ShardedTensor from its pickled wrapper arguments and
    state, or an unsupported tensor saying why they cannot be placed."""
    try:
        return _shards(args, state)
    except _Bad as e:
        return UnsupportedTensor(f"ShardedTensor ({e})")
