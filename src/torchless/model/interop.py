"""torch tensors from torchless's: for programs that have imported torch themselves (torchless
never imports it)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from torchless.errors import UnsupportedError
from torchless.model.chunks import chunks
from torchless.model.kinds import TensorRecord
from torchless.model.tensor import Tensor

__all__ = ["record_to_torch", "to_torch", "torch_dtypes"]


def torch_dtypes(torch: Any) -> dict[str, Any]:
    """The dtypes of a torch module the program imported, by name (``float32`` …)."""
    return {str(v).removeprefix("torch."): v for v in vars(torch).values()
            if isinstance(v, torch.dtype)}


def to_torch(t: Tensor, torch: Any) -> Any:
    """A writable torch tensor (or Parameter) with ``t``'s dtype, shape, values and flags."""
    tdtype = torch_dtypes(torch).get(t.dtype.name)
    if tdtype is None:
        raise UnsupportedError(f"this torch has no dtype {t.dtype.name}")
    if t.numel:
        if t.is_contiguous() and not t.storage.streams and (
                t.storage.byteorder == "little" or t.dtype.itemsize == 1):
            begin = t.storage_offset * t.dtype.itemsize
            raw = bytearray(t.storage.buffer()[begin:begin + t.nbytes])
        else:
            raw = bytearray(b"".join(bytes(c) for c in chunks(t)))
        out = torch.frombuffer(raw, dtype=torch.uint8).view(tdtype).reshape(t.shape)
    else:  # empty: viewed from no bytes (torch.empty warns for some dtypes)
        out = torch.empty(0, dtype=torch.uint8).view(tdtype).reshape(t.shape)
    if t.is_storage:  # torch.load gives a storage held as a value as a TypedStorage
        return torch.storage.TypedStorage(wrap_storage=out.untyped_storage(), dtype=tdtype,
                                          _internal=True)
    if t.is_parameter:
        out = torch.nn.Parameter(out, requires_grad=t.requires_grad)
    elif t.requires_grad:
        out.requires_grad_(True)
    for k, v in (t.attrs or {}).items():
        setattr(out, k, v)
    return out


def record_to_torch(rec: TensorRecord, torch: Any) -> Any:
    """The torch tensor a record stands for, built as ``torch.load`` builds it (the
    ``torch._utils._rebuild_*`` functions); its components may be torchless tensors, NumPy
    arrays or torch tensors (a record read back from an inert file)."""
    f = rec.fields

    def part(key: str) -> Any:
        value = f.get(key)
        return None if value is None else _torch_part(value, torch)

    kind = rec.kind
    if kind == "sparse_coo":
        out = torch.sparse_coo_tensor(part("indices"), part("values"), f["shape"],
                                      is_coalesced=f.get("is_coalesced"),
                                      check_invariants=True)
    elif kind in ("sparse_csr", "sparse_bsr", "sparse_csc", "sparse_bsc"):
        row = kind in ("sparse_csr", "sparse_bsr")
        out = torch.sparse_compressed_tensor(
            part("crow_indices" if row else "ccol_indices"),
            part("col_indices" if row else "row_indices"), part("values"), f["shape"],
            layout=getattr(torch, kind), check_invariants=True)
    elif kind == "quantized":
        out = _quantized(rec, torch, part)
    elif kind == "nested":
        out = torch._nested_view_from_buffer(part("values").contiguous(), part("sizes"),
                                             part("strides"), part("offsets"))
    elif kind == "jagged":
        cache = f.get("metadata") or {}
        seqlens = {k: _seqlen(cache.get(k)) for k in ("min_seqlen", "max_seqlen")}
        out = torch.nested.nested_tensor_from_jagged(
            part("values"), part("offsets"), part("lengths"), jagged_dim=f["ragged_idx"],
            **seqlens)
        for k, v in (f.get("attrs") or {}).items():
            setattr(out, k, v)
    elif kind == "meta":
        out = torch.empty_strided(f["shape"], f["stride"], dtype=torch_dtypes(torch)[
            f["dtype"]], device="meta")
    else:
        raise UnsupportedError(f"no torch tensor for a {kind} record")
    if f.get("parameter"):
        return torch.nn.Parameter(out, requires_grad=bool(f.get("requires_grad")))
    if f.get("requires_grad"):
        out.requires_grad_(True)
    return out


def _quantized(rec: TensorRecord, torch: Any, part: Callable[[str], Any]) -> Any:
    f = rec.fields
    qdtype = torch_dtypes(torch)[f["dtype"]]
    shape = tuple(f["shape"])
    if f["qscheme"] == "per_tensor_affine":
        out = torch._empty_affine_quantized(shape, scale=f["scale"],
                                            zero_point=f["zero_point"], dtype=qdtype)
    else:
        scales, zeros = f["scale"], f["zero_point"]
        if isinstance(scales, list) and isinstance(zeros, list):
            floats = f["qscheme"] == "per_channel_affine_float_qparams"
            scales = torch.tensor(scales, dtype=torch.float if floats else torch.double)
            zeros = torch.tensor(zeros, dtype=torch.float if floats else torch.long)
        else:
            scales, zeros = part("scale"), part("zero_point")
        out = torch._empty_per_channel_affine_quantized(shape, scales=scales,
                                                        zero_points=zeros, axis=f["axis"],
                                                        dtype=qdtype)
    if f.get("packed") is not None:
        raw, offset, stride = part("packed"), f["storage_offset"], tuple(f["stride"])
    else:
        raw = part("int_repr").contiguous()
        offset, stride = 0, tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    storage = torch.storage.TypedStorage(wrap_storage=raw.untyped_storage(), dtype=qdtype,
                                         _internal=True)
    out.set_(storage, offset, shape, stride)
    return out


def _seqlen(value: Any) -> int | None:
    """torch keeps a jagged tensor's cached min/max length as the size of an empty
    tensor's first dimension (``_store_val_in_tensor``)."""
    return None if value is None else int(value.shape[0])


def _torch_part(value: Any, torch: Any) -> Any:
    if isinstance(value, Tensor):
        return to_torch(value, torch)
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.array(value))
    return value
