"""torch tensors from torchless's: for programs that have imported torch themselves (torchless
never imports it)."""

from __future__ import annotations

from typing import Any

from torchless.errors import UnsupportedError
from torchless.model.chunks import chunks
from torchless.model.tensor import Tensor

__all__ = ["to_torch", "torch_dtypes"]


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
