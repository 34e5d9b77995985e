"""Tensors that are not one strided array: sparse, quantized, nested, jagged, meta.

torch pickles each as a call on its component tensors and metadata
(``torch._utils._rebuild_sparse_tensor``, ``_rebuild_qtensor``, ``_rebuild_nested_tensor``,
``_rebuild_meta_tensor_no_storage``, ``torch.nested._internal.nested_tensor._rebuild_njt``).
A :class:`TensorRecord` keeps exactly those parts, losslessly: the components stay lazy
:class:`Tensor` objects (NumPy arrays after ``load``), the metadata plain values. A
record is not one array, so safetensors cannot hold it: it is listed in
``Checkpoint.unsupported`` by its kind (``convert`` refuses it by name) and in
``Checkpoint.records`` whole. ``to_torch`` (:mod:`.interop`) rebuilds the torch tensor.

The fields of each kind (the names of torch's accessors)::

    sparse_coo            indices, values, shape, is_coalesced
    sparse_csr, _bsr      crow_indices, col_indices, values, shape
    sparse_csc, _bsc      ccol_indices, row_indices, values, shape
    quantized             int_repr (the integer values, for qint8 / quint8 / qint32) or
                          packed (the storage's bytes, for quint4x2 / quint2x4), dtype,
                          qscheme, scale, zero_point, axis (None per tensor), shape,
                          stride, storage_offset
    nested                values (the buffer), sizes, strides, offsets
    jagged                values, offsets, lengths, ragged_idx, metadata, attrs
    meta                  dtype, shape, stride

and ``requires_grad`` for every kind (``parameter``: True for a ``torch.nn.Parameter``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

from torchless.core.ndarrays import is_ndarray
from torchless.errors import UnsupportedError
from torchless.model.tensor import Tensor, UnsupportedTensor

__all__ = ["KINDS", "TensorRecord"]

#: Every kind of record and the fields that hold component tensors.
KINDS: dict[str, tuple[str, ...]] = {
    "sparse_coo": ("indices", "values"),
    "sparse_csr": ("crow_indices", "col_indices", "values"),
    "sparse_bsr": ("crow_indices", "col_indices", "values"),
    "sparse_csc": ("ccol_indices", "row_indices", "values"),
    "sparse_bsc": ("ccol_indices", "row_indices", "values"),
    "quantized": ("int_repr", "packed", "scale", "zero_point"),
    "nested": ("values", "sizes", "strides", "offsets"),
    "jagged": ("values", "offsets", "lengths", "metadata", "attrs"),
    "meta": (),
}


class TensorRecord(UnsupportedTensor):
    """A tensor of one of the :data:`KINDS`: ``kind`` and its ``fields`` (also readable as
    attributes: ``rec.values``, ``rec.shape`` …)."""

    __slots__ = ("fields",)

    def __init__(self, kind: str, fields: dict[str, Any]) -> None:
        super().__init__(kind)
        self.fields = fields

    def __getattr__(self, name: str) -> Any:
        try:
            return object.__getattribute__(self, "fields")[name]
        except KeyError:
            raise AttributeError(f"a {self.kind} tensor record has no field {name!r}") from None

    def error(self, name: str) -> UnsupportedError:
        return UnsupportedError(
            f"a {self.kind} tensor is not one array", member=name,
            hint="Checkpoint.records[name] holds its component arrays; torchless.load gives "
                 "the record (framework='pt': the torch tensor)")

    def components(self) -> Iterator[tuple[str, Any]]:
        """Every component tensor or array, by field name (``metadata.min_seqlen`` for one
        inside a field's dict)."""
        for key in KINDS[self.kind]:
            value = self.fields.get(key)
            if isinstance(value, dict):
                for k, v in value.items():
                    if _is_array(v):
                        yield f"{key}.{k}", v
            elif _is_array(value):
                yield key, value

    def map(self, f: Callable[[Any], Any]) -> TensorRecord:
        """The same record with every component replaced by ``f(component)``."""
        fields = dict(self.fields)
        for key in KINDS[self.kind]:
            value = fields.get(key)
            if isinstance(value, dict):
                fields[key] = {k: f(v) if _is_array(v) else v for k, v in value.items()}
            elif _is_array(value):
                fields[key] = f(value)
        return TensorRecord(self.kind, fields)

    def __repr__(self) -> str:
        shape = self.fields.get("shape")
        return f"TensorRecord({self.kind}, shape={list(shape) if shape is not None else '?'})"


def _is_array(value: Any) -> bool:
    if isinstance(value, Tensor) or is_ndarray(value):
        return True
    torch = sys.modules.get("torch")  # after load(framework="pt"): torch's own tensors
    return torch is not None and isinstance(value, torch.Tensor)
