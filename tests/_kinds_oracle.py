"""Torch's side of the tensor kinds torchless reads as records: what a sparse, quantized,
nested, jagged or meta tensor is made of, from torch's own accessors (``_indices()``,
``int_repr()``, ``q_per_channel_scales()``, ``_nested_tensor_size()`` …), never from
torchless. :func:`parts_of_record` reads a torchless record the same way, so the two
compare as plain dicts of NumPy arrays and scalars.

Imports torch at top level (only through the ``torch`` fixture).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

#: ``tests._expected_names.unsupported_kind`` values torchless reads as records.
RECORD_KINDS = frozenset({"sparse", "quantized", "nested", "meta"})
_PACKED = (torch.quint4x2, torch.quint2x4)


def _np(t: Any) -> Any:
    if t is None:
        return None
    if isinstance(t, torch.Tensor):
        return t.detach().cpu().numpy()
    return np.asarray(t)


def _storage_bytes(t: torch.Tensor) -> np.ndarray[Any, Any]:
    s = t.untyped_storage()
    raw = torch.tensor([], dtype=torch.uint8).set_(s) if s.nbytes() else torch.empty(0)
    return raw.numpy().astype(np.uint8)


def _name(x: Any) -> str:
    return str(x).removeprefix("torch.")


def torch_parts(t: torch.Tensor) -> tuple[str, dict[str, Any]]:
    """(kind, parts) of a torch tensor torchless reads as a record."""
    if t.device.type == "meta":
        return "meta", {"dtype": _name(t.dtype), "shape": tuple(t.shape),
                        "stride": tuple(t.stride()), "requires_grad": t.requires_grad}
    if t.is_quantized:
        q = t.qscheme()
        parts: dict[str, Any] = {"dtype": _name(t.dtype), "qscheme": _name(q),
                                 "shape": tuple(t.shape), "requires_grad": t.requires_grad}
        if q == torch.per_tensor_affine:
            parts.update(scale=t.q_scale(), zero_point=t.q_zero_point(), axis=None)
        else:
            parts.update(scale=_np(t.q_per_channel_scales()),
                         zero_point=_np(t.q_per_channel_zero_points()),
                         axis=t.q_per_channel_axis())
        if t.dtype in _PACKED:
            parts["packed"] = _storage_bytes(t)
        else:
            parts["int_repr"] = _np(t.int_repr())
        return "quantized", parts
    if t.is_nested:
        if t.layout == torch.jagged:
            return "jagged", {"values": _np(t._values), "offsets": _np(t._offsets),
                              "lengths": _np(t._lengths), "ragged_idx": t._ragged_idx,
                              "requires_grad": t.requires_grad}
        return "nested", {"values": _np(t.values()), "sizes": _np(t._nested_tensor_size()),
                          "strides": _np(t._nested_tensor_strides()),
                          "offsets": _np(t._nested_tensor_storage_offsets()),
                          "requires_grad": t.requires_grad}
    kind = _name(t.layout)
    shape = tuple(t.shape)
    if kind == "sparse_coo":
        return kind, {"indices": _np(t._indices()), "values": _np(t._values()),
                      "shape": shape, "is_coalesced": t.is_coalesced(),
                      "requires_grad": t.requires_grad}
    if kind in ("sparse_csr", "sparse_bsr"):
        return kind, {"crow_indices": _np(t.crow_indices()), "col_indices": _np(t.col_indices()),
                      "values": _np(t.values()), "shape": shape,
                      "requires_grad": t.requires_grad}
    if kind in ("sparse_csc", "sparse_bsc"):
        return kind, {"ccol_indices": _np(t.ccol_indices()), "row_indices": _np(t.row_indices()),
                      "values": _np(t.values()), "shape": shape,
                      "requires_grad": t.requires_grad}
    raise AssertionError(f"not a record kind: {t.layout}")


def parts_of_record(rec: Any) -> tuple[str, dict[str, Any]]:
    """(kind, parts) of a torchless TensorRecord, the keys :func:`torch_parts` gives."""
    f = rec.fields
    want = {"meta": ("dtype", "shape", "stride", "requires_grad"),
            "quantized": ("dtype", "qscheme", "shape", "requires_grad", "scale", "zero_point",
                          "axis", "packed" if "packed" in f else "int_repr"),
            "jagged": ("values", "offsets", "lengths", "ragged_idx", "requires_grad"),
            "nested": ("values", "sizes", "strides", "offsets", "requires_grad"),
            "sparse_coo": ("indices", "values", "shape", "is_coalesced", "requires_grad")}
    keys = want.get(rec.kind) or (
        ("crow_indices", "col_indices", "values", "shape", "requires_grad")
        if rec.kind in ("sparse_csr", "sparse_bsr")
        else ("ccol_indices", "row_indices", "values", "shape", "requires_grad"))
    out = {}
    for k in keys:
        v = f[k]
        if hasattr(v, "numpy") and not isinstance(v, np.ndarray):
            v = _np(v) if isinstance(v, torch.Tensor) else v.numpy()
        elif isinstance(v, (list, tuple)) and k in ("shape", "stride"):
            v = tuple(v)
        out[k] = v
    if rec.kind == "quantized" and "packed" in out:
        out["packed"] = np.asarray(out["packed"]).astype(np.uint8)
    return rec.kind, out


def differences(a: tuple[str, dict[str, Any]], b: tuple[str, dict[str, Any]]) -> list[str]:
    """Where two (kind, parts) differ: arrays by dtype, shape and bytes, the rest by ==."""
    if a[0] != b[0]:
        return [f"kind {a[0]} != {b[0]}"]
    out = []
    for k in sorted(set(a[1]) | set(b[1])):
        x, y = a[1].get(k, "<missing>"), b[1].get(k, "<missing>")
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            x, y = np.asarray(x), np.asarray(y)
            if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                out.append(f"{k}: {x.dtype}{list(x.shape)} {x.ravel()[:6]} != "
                           f"{y.dtype}{list(y.shape)} {y.ravel()[:6]}")
        elif x != y:
            out.append(f"{k}: {x!r} != {y!r}")
    return out
