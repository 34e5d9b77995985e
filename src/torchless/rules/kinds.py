"""Rebuild rules for the tensor kinds that are not one strided array: each checks the
arguments torch pickled (``torch/_tensor.py`` ``_reduce_ex_internal``, the
``torch._utils._rebuild_*`` functions) and keeps them as a :class:`TensorRecord`.

A component that is itself not readable (a storage a plain pickle does not hold) makes the
whole tensor that unreadable tensor: a record is lossless or not made.
"""

from __future__ import annotations

from typing import Any

from torchless.core import dtypes as _dtypes
from torchless.core.dtypes import DType
from torchless.core.limits import Limits
from torchless.errors import PickleError, type_phrase
from torchless.model.kinds import TensorRecord
from torchless.model.tensor import (
    DATALESS,
    MissingStorage,
    Storage,
    Tensor,
    UnsupportedTensor,
    make_tensor,
)
from torchless.pickle.values import Global

__all__ = ["jagged", "meta", "nested", "quantized", "sparse"]

_SPARSE = ("sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc")
#: quantized dtype -> the integer dtype of its values (None: packed, several per byte)
_INT_REPR = {"qint8": "int8", "quint8": "uint8", "qint32": "int32", "quint4x2": None,
             "quint2x4": None}
_QSCHEMES = ("per_tensor_affine", "per_channel_affine", "per_channel_affine_float_qparams")


def _unreadable(*values: Any) -> UnsupportedTensor | None:
    return next((v for v in values if isinstance(v, UnsupportedTensor)), None)


def _tensor(what: str, value: Any) -> Tensor:
    if not isinstance(value, Tensor):
        raise PickleError(f"{what} is {type_phrase(value)}, not a tensor")
    return value


def _ints(what: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or any(type(x) is not int for x in value):
        raise PickleError(f"{what} is not a sequence of ints")
    return tuple(value)


def _flag(what: str, value: Any) -> bool:
    if type(value) is not bool:
        raise PickleError(f"{what} is {type_phrase(value)}, not a bool")
    return value


def sparse(a: tuple[Any, ...]) -> Any:
    """``_rebuild_sparse_tensor(layout, data)``."""
    if len(a) != 2 or not isinstance(a[1], tuple):
        raise PickleError("_rebuild_sparse_tensor takes (layout, data tuple)")
    layout, data = a
    kind = layout.name if isinstance(layout, Global) and layout.module == "torch" else None
    if kind not in _SPARSE:
        raise PickleError(f"_rebuild_sparse_tensor of layout {layout!r}")
    if kind == "sparse_coo":
        if len(data) not in (3, 4):
            raise PickleError("a sparse_coo tensor is (indices, values, size[, coalesced])")
        bad = _unreadable(*data[:2])
        if bad is not None:
            return bad
        indices, values = _tensor("indices", data[0]), _tensor("values", data[1])
        shape = _ints("size", data[2])
        coalesced = data[3] if len(data) == 4 else None
        if coalesced is not None:
            _flag("is_coalesced", coalesced)
        if indices.ndim != 2 or values.ndim < 1 or indices.shape[1] != values.shape[0] \
                or indices.shape[0] + values.ndim - 1 != len(shape):
            raise PickleError(f"sparse_coo indices {list(indices.shape)} and values "
                              f"{list(values.shape)} do not fit size {list(shape)}")
        return TensorRecord(kind, {"indices": indices, "values": values, "shape": shape,
                                   "is_coalesced": coalesced, "requires_grad": False})
    if len(data) != 4:
        raise PickleError(f"a {kind} tensor is (compressed, plain indices, values, size)")
    bad = _unreadable(*data[:3])
    if bad is not None:
        return bad
    names = (("crow_indices", "col_indices") if kind in ("sparse_csr", "sparse_bsr")
             else ("ccol_indices", "row_indices"))
    fields: dict[str, Any] = {names[0]: _tensor(names[0], data[0]),
                              names[1]: _tensor(names[1], data[1]),
                              "values": _tensor("values", data[2]),
                              "shape": _ints("size", data[3]), "requires_grad": False}
    return TensorRecord(kind, fields)


def quantized(a: tuple[Any, ...], limits: Limits) -> Any:
    """``_rebuild_qtensor(storage, offset, size, stride, quantizer_params, requires_grad,
    backward_hooks)``."""
    if len(a) != 7:
        raise PickleError(f"_rebuild_qtensor takes 7 arguments, got {len(a)}")
    storage, offset, size, stride, params, requires_grad, hooks = a
    if isinstance(storage, MissingStorage):
        return DATALESS
    if not isinstance(storage, Storage) or storage.dtype.name not in _INT_REPR:
        raise PickleError(f"a quantized tensor's storage is {type_phrase(storage)}, not a "
                          "quantized storage")
    _flag("requires_grad", requires_grad)
    if hooks is not None and not isinstance(hooks, dict):
        raise PickleError(f"backward hooks are {type_phrase(hooks)}")
    if not isinstance(params, tuple) or not params or not isinstance(params[0], Global) \
            or params[0].module != "torch" or params[0].name not in _QSCHEMES:
        raise PickleError("quantizer parameters are not (qscheme, …)")
    qscheme = params[0].name
    shape, strides = _ints("size", size), _ints("stride", stride)
    if type(offset) is not int or offset < 0:
        raise PickleError(f"invalid storage offset {offset!r}")
    fields: dict[str, Any] = {"dtype": storage.dtype.name, "qscheme": qscheme,
                              "shape": shape, "stride": strides, "storage_offset": offset,
                              "requires_grad": requires_grad, "axis": None}
    if qscheme == "per_tensor_affine":
        if len(params) != 3 or type(params[1]) is not float or type(params[2]) is not int:
            raise PickleError("per-tensor quantizer parameters are not (qscheme, float "
                              "scale, int zero point)")
        fields["scale"], fields["zero_point"] = params[1], params[2]
    else:
        if len(params) != 4 or type(params[3]) is not int:
            raise PickleError("per-channel quantizer parameters are not (qscheme, scales, "
                              "zero points, int axis)")
        scales, zeros, axis = params[1], params[2], params[3]
        bad = _unreadable(scales, zeros)
        if bad is not None:
            return bad
        if not 0 <= axis < len(shape):
            raise PickleError(f"per-channel axis {axis} is outside size {list(shape)}")
        for what, v in (("scales", scales), ("zero points", zeros)):
            n = v.numel if isinstance(v, Tensor) else len(v) if isinstance(v, list) else -1
            if n != shape[axis]:
                raise PickleError(f"per-channel {what} are {type_phrase(v)}, not "
                                  f"{shape[axis]} values (size[axis])")
        if isinstance(zeros, Tensor) and zeros.dtype.name.startswith(("float", "bfloat")):
            # torch writes per_channel_affine for both; float zero points make the tensor
            # per_channel_affine_float_qparams again when it is rebuilt
            fields["qscheme"] = "per_channel_affine_float_qparams"
        fields.update(scale=scales, zero_point=zeros, axis=axis)
    int_name = _INT_REPR[storage.dtype.name]
    if int_name is None:
        fields["packed"] = Tensor(storage, _dtypes.UINT8, (storage.nbytes,), (1,), 0)
    else:
        int_dtype = _dtypes.by_torch_name(int_name)
        assert int_dtype is not None
        fields["int_repr"] = make_tensor(storage, offset, shape, strides, int_dtype, limits)
    return TensorRecord("quantized", fields)


def nested(a: tuple[Any, ...]) -> Any:
    """``_rebuild_nested_tensor(buffer, sizes, strides, storage_offsets)``."""
    if len(a) != 4:
        raise PickleError(f"_rebuild_nested_tensor takes 4 arguments, got {len(a)}")
    bad = _unreadable(*a)
    if bad is not None:
        return bad
    values, sizes, strides, offsets = (_tensor(w, v) for w, v in zip(
        ("buffer", "sizes", "strides", "offsets"), a, strict=True))
    if values.ndim != 1 or sizes.ndim not in (1, 2) or strides.shape != sizes.shape \
            or offsets.ndim != 1 or offsets.shape[0] != sizes.shape[0]:
        raise PickleError("a nested tensor's buffer, sizes, strides and offsets do not fit")
    return TensorRecord("nested", {"values": values, "sizes": sizes, "strides": strides,
                                   "offsets": offsets, "requires_grad": False})


def jagged(a: tuple[Any, ...]) -> Any:
    """``_rebuild_njt(constructor_kwargs)``: ``NestedTensor(**kwargs)``."""
    if len(a) != 1 or not isinstance(a[0], dict):
        raise PickleError("_rebuild_njt takes one dict of constructor arguments")
    kw = a[0]
    unknown = set(kw) - {"values", "offsets", "lengths", "_ragged_idx", "_metadata_cache",
                         "requires_grad"}
    if unknown:
        raise PickleError(f"_rebuild_njt arguments {sorted(map(str, unknown))[:5]} are not "
                          "NestedTensor's")
    metadata = kw.get("_metadata_cache")
    if metadata is None:  # NestedTensor takes None as no cache
        metadata = {}
    if not isinstance(metadata, dict) or not all(type(k) is str for k in metadata):
        raise PickleError("a jagged tensor's metadata cache is not a dict by name")
    bad = _unreadable(kw.get("values"), kw.get("offsets"), kw.get("lengths"),
                      *metadata.values())
    if bad is not None:
        return bad
    lengths = kw.get("lengths")
    ragged = kw.get("_ragged_idx", 1)
    if type(ragged) is not int:
        raise PickleError("a jagged tensor's ragged index is not an int")
    return TensorRecord("jagged", {
        "values": _tensor("values", kw.get("values")),
        "offsets": _tensor("offsets", kw.get("offsets")),
        "lengths": None if lengths is None else _tensor("lengths", lengths),
        "ragged_idx": ragged, "metadata": metadata, "attrs": None,
        "requires_grad": _flag("requires_grad", kw.get("requires_grad", False))})


def meta(a: tuple[Any, ...], limits: Limits) -> Any:
    """``_rebuild_meta_tensor_no_storage(dtype, size, stride, requires_grad)``."""
    if len(a) != 4 or not isinstance(a[0], DType):
        raise PickleError("_rebuild_meta_tensor_no_storage takes (dtype, size, stride, "
                          "requires_grad)")
    shape, stride = _ints("size", a[1]), _ints("stride", a[2])
    if len(shape) != len(stride) or len(shape) > limits.max_ndim or min(shape, default=0) < 0:
        raise PickleError(f"meta tensor size {list(shape)[:8]} and stride do not fit")
    return TensorRecord("meta", {"dtype": a[0].name, "shape": shape, "stride": stride,
                                 "requires_grad": _flag("requires_grad", a[3])})
