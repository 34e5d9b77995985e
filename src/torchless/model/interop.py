"""torch tensors from torchless's: for programs that have imported torch themselves (torchless
never imports it)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from torchless.core.ndarrays import is_ndarray
from torchless.errors import TensorGeometryError, UnsupportedError
from torchless.model.chunks import chunks
from torchless.model.kinds import TensorRecord
from torchless.model.tensor import Tensor

__all__ = ["finish_tensor", "record_to_torch", "to_torch", "torch_dtypes", "torch_to_record"]


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
    return finish_tensor(torch, out, t)


def finish_tensor(torch: Any, out: Any, t: Tensor) -> Any:
    """What torch.load gives on top of a tensor's values: a Parameter (with its
    ``requires_grad``), ``requires_grad`` on a plain tensor, and attributes saved with it."""
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

    try:
        return _rebuild(rec, torch, part)
    except (ValueError, RuntimeError, TypeError, KeyError, IndexError) as e:
        raise TensorGeometryError(f"torch cannot rebuild this {rec.kind} tensor: "
                                  f"{type(e).__name__}: {e}") from None


def _rebuild(rec: TensorRecord, torch: Any, part: Callable[[str], Any]) -> Any:
    f = rec.fields
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
            layout={"sparse_csr": torch.sparse_csr, "sparse_bsr": torch.sparse_bsr,
                    "sparse_csc": torch.sparse_csc, "sparse_bsc": torch.sparse_bsc}[kind],
            check_invariants=True)
    elif kind == "quantized":
        out = _quantized(rec, torch, part)
    elif kind == "nested":
        values, sizes, strides, offsets = (part(k) for k in ("values", "sizes", "strides",
                                                              "offsets"))
        _check_nested(values.numel(), sizes.numpy(), strides.numpy(), offsets.numpy())
        out = torch._nested_view_from_buffer(values.contiguous(), sizes, strides, offsets)
    elif kind == "jagged":
        ragged = f["ragged_idx"]
        dims = part("values").shape
        if type(ragged) is not int or not 1 <= ragged <= len(dims):
            raise ValueError(f"ragged index {ragged!r} outside the values' dims")
        _check_offsets(part("offsets").numpy(), int(dims[ragged - 1]))
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
        if math.prod(shape) > 8 * raw.numel():  # at most 8 values a byte (2-bit: 4)
            raise ValueError(f"{list(shape)} packed values in {raw.numel()} bytes")
    else:
        raw = part("int_repr").contiguous()
        if tuple(raw.shape) != shape:
            raise ValueError(f"int_repr of shape {list(raw.shape)} for size {list(shape)}")
        offset, stride = 0, tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    storage = torch.storage.TypedStorage(wrap_storage=raw.untyped_storage(), dtype=qdtype,
                                         _internal=True)
    out.set_(storage, offset, shape, stride)
    return out


def _check_nested(numel: int, sizes: Any, strides: Any, offsets: Any) -> None:
    """Each component's view lies inside the buffer (torch's _nested_view_from_buffer does
    not check: a file could make it read past the buffer)."""
    import numpy as np

    sizes, strides, offsets = (np.asarray(x) for x in (sizes, strides, offsets))
    if sizes.shape != strides.shape or sizes.ndim != 2 or offsets.shape != (sizes.shape[0],):
        raise ValueError("nested sizes, strides and offsets do not fit")
    for size, stride, offset in zip(sizes.tolist(), strides.tolist(), offsets.tolist(),
                                    strict=True):  # Python ints: no overflow
        if min([*size, *stride, offset], default=0) < 0:
            raise ValueError("negative nested sizes, strides or offsets")
        last = offset + sum((n - 1) * st for n, st in zip(size, stride, strict=True))
        if all(size) and last >= numel:
            raise ValueError("a nested component lies outside its buffer")


def _check_offsets(offsets: Any, n: int) -> None:
    """A jagged tensor's offsets rise from 0 within its values (torch does not check)."""
    import numpy as np

    o = np.asarray(offsets, dtype=np.int64)
    if o.ndim != 1 or not o.size or o[0] < 0 or o[-1] > n or (np.diff(o) < 0).any():
        raise ValueError("jagged offsets do not rise within the values")


def _seqlen(value: Any) -> int | None:
    """torch keeps a jagged tensor's cached min/max length as the size of an empty
    tensor's first dimension (``_store_val_in_tensor``)."""
    return None if value is None else int(value.shape[0])


def _torch_part(value: Any, torch: Any) -> Any:
    if isinstance(value, Tensor):
        return to_torch(value, torch)
    if is_ndarray(value):
        import numpy as np

        return torch.from_numpy(np.array(value))
    return value


def torch_to_record(t: Any, torch: Any) -> TensorRecord | None:
    """The record of a torch tensor that is not one strided array (what ``torch.save``
    would pickle of it), or None for a strided tensor. Its parts stay torch tensors."""
    rg = bool(t.requires_grad)
    extra = {"parameter": True} if isinstance(t, torch.nn.Parameter) else {}
    if t.device.type == "meta":
        return TensorRecord("meta", {"dtype": str(t.dtype).removeprefix("torch."),
                                     "shape": tuple(t.shape), "stride": tuple(t.stride()),
                                     "requires_grad": rg, **extra})
    if t.is_quantized:
        q = str(t.qscheme()).removeprefix("torch.")
        f: dict[str, Any] = {"dtype": str(t.dtype).removeprefix("torch."), "qscheme": q,
                             "shape": tuple(t.shape), "stride": tuple(t.stride()),
                             "storage_offset": t.storage_offset(), "requires_grad": rg}
        if q == "per_tensor_affine":
            f.update(scale=t.q_scale(), zero_point=t.q_zero_point(), axis=None)
        else:
            f.update(scale=t.q_per_channel_scales(), zero_point=t.q_per_channel_zero_points(),
                     axis=t.q_per_channel_axis())
        if t.dtype in (torch.quint4x2, torch.quint2x4):
            f["packed"] = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
        else:
            f["int_repr"] = t.int_repr()
        return TensorRecord("quantized", {**f, **extra})
    if t.is_nested:
        if t.layout == torch.jagged:
            return TensorRecord("jagged", {
                "values": t._values, "offsets": t._offsets, "lengths": t._lengths,
                "ragged_idx": t._ragged_idx, "metadata": dict(t._metadata_cache),
                "attrs": None, "requires_grad": rg, **extra})
        return TensorRecord("nested", {
            "values": t.values(), "sizes": t._nested_tensor_size(),
            "strides": t._nested_tensor_strides(),
            "offsets": t._nested_tensor_storage_offsets(), "requires_grad": rg, **extra})
    kind = str(t.layout).removeprefix("torch.")
    shape = tuple(t.shape)
    if kind == "sparse_coo":
        return TensorRecord(kind, {"indices": t._indices(), "values": t._values(),
                                   "shape": shape, "is_coalesced": t.is_coalesced(),
                                   "requires_grad": rg, **extra})
    if kind in ("sparse_csr", "sparse_bsr"):
        return TensorRecord(kind, {"crow_indices": t.crow_indices(),
                                   "col_indices": t.col_indices(), "values": t.values(),
                                   "shape": shape, "requires_grad": rg, **extra})
    if kind in ("sparse_csc", "sparse_bsc"):
        return TensorRecord(kind, {"ccol_indices": t.ccol_indices(),
                                   "row_indices": t.row_indices(), "values": t.values(),
                                   "shape": shape, "requires_grad": rg, **extra})
    return None
