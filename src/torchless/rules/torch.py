"""Rebuild rules for torch's own pickled callables: tensors (every ``_rebuild_tensor``
form, the oldest ``torch.Tensor()`` + ``__setstate__`` one included), parameters with their
Python attributes, tensor subclasses, storages, sizes, devices, layouts; sparse, quantized,
nested, jagged and meta tensors as records of their parts (:mod:`.kinds`), and the tensor
kinds torchless lists as unsupported. Each rule checks the geometry against the storage before a
tensor exists."""

from __future__ import annotations

import collections
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
from torchless.pickle.known import Known
from torchless.pickle.machine import Resolver
from torchless.pickle.values import Global, Opaque
from torchless.rules import kinds as _kinds
from torchless.rules.dtensor import (
    DTENSOR_CLASSES,
    SHARDED_TENSOR_CLASSES,
    dtensor_piece,
    sharded_tensor_piece,
)

__all__ = ["UNSUPPORTED_ELSEWHERE", "UNSUPPORTED_TENSORS", "TorchRules"]

UNSUPPORTED_TENSORS = {
    "_rebuild_sparse_tensor": "sparse",
    "_rebuild_sparse_csr_tensor": "sparse",
    "_rebuild_nested_tensor": "nested",
    "_rebuild_qtensor": "quantized",
    "_rebuild_meta_tensor_no_storage": "meta",
    "_rebuild_wrapper_subclass": "wrapper-subclass",
    "_rebuild_xla_tensor": "XLA",
    "_rebuild_mtia_tensor": "MTIA",
}

#: Tensor kinds rebuilt outside ``torch._utils``, and what they are.
UNSUPPORTED_ELSEWHERE = {
    ("torch.nested._internal.nested_tensor", "_rebuild_njt"): "nested (jagged)",
    ("torch.nn.parameter", "UninitializedParameter"): "uninitialized parameter",
    ("torch.nn.parameter", "UninitializedBuffer"): "uninitialized buffer",
}

#: Classes of backward hooks and metadata :meth:`TorchRules._tensor_flags` passes at once
#: (any other dict subclass is checked there).
_HOOKS = frozenset({type(None), dict, collections.OrderedDict})
_LAYOUTS = frozenset({"strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr",
                      "sparse_bsc", "_mkldnn", "jagged"})

class TorchRules(Resolver):
    """``_r_<rule>`` methods for the torch entries of the rule table."""

    limits: Limits

    def _old_tensor(self, cls: Known, state: tuple[Any, ...], offset: int) -> Any:
        """``torch.Tensor()`` then ``__setstate__``: the form torch wrote before
        ``_rebuild_tensor`` (``(storage, offset, size, stride)``; a Variable's
        ``(data, _, backward_hooks, requires_grad, _)``)."""
        is_parameter = cls.rule == "parameter_class"
        if len(state) == 4:
            storage = state[0]
            if isinstance(storage, MissingStorage):
                return DATALESS
            if not isinstance(storage, Storage):
                raise PickleError(f"old tensor state holds {type_phrase(storage)}, not a "
                                  "storage", offset=offset)
            t = make_tensor(storage, state[1], state[2], state[3], storage.dtype, self.limits)
            return t.with_flags(requires_grad=False, is_parameter=is_parameter) \
                if is_parameter else t
        data, requires_grad = state[0], state[3]
        if isinstance(data, UnsupportedTensor):
            return data
        if not isinstance(data, Tensor) or type(requires_grad) is not bool:
            raise PickleError("old Variable state is not (tensor, _, hooks, requires_grad, _)",
                              offset=offset)
        return data.with_flags(requires_grad=requires_grad, is_parameter=is_parameter)

    def _r_rebuild_tensor(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) != 4:
            raise PickleError(f"{f} takes 4 arguments, got {len(a)}")
        storage = a[0]
        if isinstance(storage, MissingStorage):
            return DATALESS
        dtype = storage.dtype if isinstance(storage, Storage) else _dtypes.UINT8
        return make_tensor(storage, a[1], a[2], a[3], dtype, self.limits)

    def _tensor_flags(self, f: Known, requires_grad: Any, hooks: Any, metadata: Any) -> None:
        if type(requires_grad) is not bool:
            raise PickleError(f"{f}: requires_grad is {type_phrase(requires_grad)}")
        if hooks is not None and not isinstance(hooks, dict):
            raise PickleError(f"{f}: backward hooks are {type_phrase(hooks)}")
        if metadata is not None and not isinstance(metadata, dict):
            raise PickleError(f"{f}: metadata is {type_phrase(metadata)}")

    def _r_rebuild_tensor_v2(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) not in (6, 7):
            raise PickleError(f"{f} takes 6 or 7 arguments, got {len(a)}")
        metadata = a[6] if len(a) == 7 else None
        if type(a[4]) is not bool or a[5].__class__ not in _HOOKS or \
                metadata.__class__ not in _HOOKS:  # the call when it may raise
            self._tensor_flags(f, a[4], a[5], metadata)
        if metadata and any(metadata.values()):
            return UnsupportedTensor("conjugate/negative-bit")
        storage = a[0]
        if isinstance(storage, MissingStorage):
            return DATALESS
        dtype = storage.dtype if isinstance(storage, Storage) else _dtypes.UINT8
        return make_tensor(storage, a[1], a[2], a[3], dtype, self.limits,
                           requires_grad=a[4])

    def _r_rebuild_tensor_v3(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) not in (7, 8):
            raise PickleError(f"{f} takes 7 or 8 arguments, got {len(a)}")
        metadata = a[7] if len(a) == 8 else None
        self._tensor_flags(f, a[4], a[5], metadata)
        if not isinstance(a[6], DType):
            raise PickleError(f"{f}: dtype is {type_phrase(a[6])}, not a torch dtype")
        if metadata and any(metadata.values()):
            return UnsupportedTensor("conjugate/negative-bit")
        if isinstance(a[0], MissingStorage):
            return DATALESS
        return make_tensor(a[0], a[1], a[2], a[3], a[6], self.limits, requires_grad=a[4])

    def _r_rebuild_parameter(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) not in (3, 4):
            raise PickleError(f"{f} takes 3 or 4 arguments, got {len(a)}")
        data, requires_grad = a[0], a[1]
        self._tensor_flags(f, requires_grad, a[2], None)
        if isinstance(data, TensorRecord):  # a Parameter of a meta / sparse … tensor
            return TensorRecord(data.kind, {**data.fields, "requires_grad": requires_grad,
                                            "parameter": True})
        if isinstance(data, UnsupportedTensor):
            return data
        if not isinstance(data, Tensor):
            raise PickleError(f"{f}: data is {type_phrase(data)}, not a tensor")
        return data.with_flags(requires_grad=requires_grad, is_parameter=True,
                               attrs=_attrs(f, a[3]) if len(a) == 4 else None)

    def _r_rebuild_from_type(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) not in (3, 4):
            raise PickleError(f"{f} takes 3 or 4 arguments, got {len(a)}")
        func, new_type, args = a[0], a[1], a[2]
        if not isinstance(args, tuple):
            raise PickleError(f"{f}: arguments are not a tuple")
        value = self.call(func, args, -1)
        cls = (new_type.module, new_type.name) if isinstance(new_type, Global) else None
        if isinstance(value, UnsupportedTensor) and len(a) == 4:  # one rank's piece, as data
            if cls in DTENSOR_CLASSES:
                return dtensor_piece(a[3])
            if cls in SHARDED_TENSOR_CLASSES:
                return sharded_tensor_piece(args, a[3])
        if isinstance(value, TensorRecord) and len(a) == 4:  # a jagged tensor's __dict__
            value.fields["attrs"] = _record_attrs(value, _attrs(f, a[3]))
        if isinstance(value, Tensor):
            attrs = _attrs(f, a[3]) if len(a) == 4 else None
            is_parameter = value.is_parameter or (
                isinstance(new_type, Known) and new_type.rule == "parameter_class")
            if attrs or is_parameter != value.is_parameter:
                return value.with_flags(requires_grad=value.requires_grad,
                                        is_parameter=is_parameter, attrs=attrs)
        return value

    def _r_layout(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) != 1 or type(a[0]) is not str or not a[0].startswith("torch.") \
                or a[0][6:] not in _LAYOUTS:
            raise PickleError(f"{f} takes the name of a torch layout")
        return Global("torch", a[0][6:])

    def _r_device_tensor(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) != 4 or not isinstance(a[0], Tensor) or a[1] != a[0].dtype:
            return UnsupportedTensor("device-converted")
        return a[0].with_flags(requires_grad=bool(a[3]), is_parameter=False)

    def _r_unsupported_tensor(self, f: Known, a: tuple[Any, ...]) -> Any:
        if f.name == "_rebuild_sparse_tensor" or f.name == "_rebuild_sparse_csr_tensor":
            return _kinds.sparse(a)
        if f.name == "_rebuild_qtensor":
            return _kinds.quantized(a, self.limits)
        if f.name == "_rebuild_nested_tensor":
            return _kinds.nested(a)
        if f.name == "_rebuild_njt":
            return _kinds.jagged(a)
        if f.name == "_rebuild_meta_tensor_no_storage":
            return _kinds.meta(a, self.limits)
        kind = UNSUPPORTED_ELSEWHERE.get((f.module, f.name)) or UNSUPPORTED_TENSORS[f.name]
        return UnsupportedTensor(kind)

    def _r_size(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) != 1 or not isinstance(a[0], (tuple, list)) \
                or any(type(x) is not int for x in a[0]):
            raise PickleError("torch.Size takes one sequence of ints")
        return tuple(a[0])

    def _r_device(self, f: Known, a: tuple[Any, ...]) -> Any:
        if not a or type(a[0]) is not str or len(a) > 2:
            raise PickleError("torch.device takes a type string and an optional index")
        if len(a) == 2 and a[1] is not None:
            if type(a[1]) is not int:
                raise PickleError("torch.device index must be an int")
            return f"{a[0]}:{a[1]}"
        return a[0]

    def _r_str(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) != 1 or type(a[0]) is not str:
            raise PickleError(f"{f} takes one str")
        return a[0]

    def _r_identity(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) != 1 or not isinstance(a[0], list):
            raise PickleError(f"{f} takes one list")
        return a[0]

    def _r_first(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) != 2:
            raise PickleError(f"{f} takes 2 arguments")
        return a[0]

    def _r_tensor_class(self, f: Known, a: tuple[Any, ...]) -> Any:
        return Opaque(f, a)

    _r_parameter_class = _r_tensor_class
    _r_opaque = _r_tensor_class


#: A jagged tensor's attributes that repeat its constructor's arguments.
_JAGGED_ATTRS = {"_values": "values", "_offsets": "offsets", "_lengths": "lengths",
                 "_metadata_cache": "metadata", "_ragged_idx": "ragged_idx"}


def _record_attrs(record: TensorRecord, attrs: dict[str, Any] | None) -> dict[str, Any] | None:
    """The attributes a record does not already hold as fields (the same objects)."""
    def repeated(k: str, v: Any) -> bool:
        field = record.fields.get(_JAGGED_ATTRS.get(k, ""), attrs)
        return v is field or (type(v) is int and type(field) is int and v == field)

    kept = {k: v for k, v in (attrs or {}).items() if not repeated(k, v)}
    return kept or None


def _attrs(f: Known, state: Any) -> dict[str, Any] | None:
    """The Python attributes torch's ``_set_obj_state`` would set on a tensor: a ``__dict__``,
    or a ``(__dict__, slots)`` pair. Any other state (a subclass with its own
    ``__setstate__``) is kept whole as the attribute ``state``."""
    parts = list(state) if (type(state) is tuple and len(state) == 2) else [state]
    if not all(p is None or (isinstance(p, dict) and all(type(k) is str for k in p))
               for p in parts):
        return {"state": state}
    attrs: dict[str, Any] = {}
    for part in parts:
        if part:
            attrs.update(part)
    return attrs or None

