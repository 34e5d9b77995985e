"""Torch element types and their NumPy equivalents.

One table: the torch dtype name and its aliases, the legacy ``<Name>Storage``
class torch pickles for it, the NumPy dtype that views its bytes (ml_dtypes
for bfloat16 and float8), and the safetensors name where there is one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

__all__ = ["DTYPES", "DType", "StorageType", "by_storage_name", "by_torch_name",
           "ml_dtypes_by_name", "names_storage_type"]


@dataclass(frozen=True)
class DType:
    """A torch element type. ``numpy`` is None for types torchless cannot view.

    ``view`` names the NumPy dtype (a dtype string, or ``ml_dtypes.<type>``): NumPy and
    ml_dtypes are imported the first time :attr:`numpy` is asked for, so that work which never
    looks at a tensor's values (inspecting, copying bytes into safetensors) does not pay for
    them."""

    name: str
    itemsize: int
    view: str | None = field(compare=False)
    safetensors: str | None = None
    storage: str | None = None
    aliases: tuple[str, ...] = ()
    note: str = ""

    def __repr__(self) -> str:
        return f"torch.{self.name}"

    @property
    def numpy(self) -> np.dtype[Any] | None:
        """The NumPy dtype that views this type's bytes (None: torchless cannot view it)."""
        return None if self.view is None else _numpy_dtype(self.view)


@functools.cache
def _numpy_dtype(view: str) -> np.dtype[Any]:
    import numpy as np

    if view == "complex32":
        return np.dtype([("real", "<f2"), ("imag", "<f2")])
    if view.startswith("ml_dtypes."):
        return ml_dtypes_by_name()[view.removeprefix("ml_dtypes.")]
    return np.dtype(view)


@functools.cache
def ml_dtypes_by_name() -> dict[str, np.dtype[Any]]:
    """The ml_dtypes types torch's dtypes and the inert format's arrays may have, by name
    (their ``dtype.str`` is an opaque ``<V2``); NumPy and ml_dtypes are imported on the
    first call."""
    import ml_dtypes
    import numpy as np

    return {np.dtype(t).name: np.dtype(t) for t in (
        ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2fnuz, ml_dtypes.float8_e4m3b11fnuz,
        ml_dtypes.float8_e8m0fnu, ml_dtypes.float4_e2m1fn, ml_dtypes.int4, ml_dtypes.uint4)}


@dataclass(frozen=True)
class StorageType:
    """A ``torch.<Name>Storage`` class named in a persistent id (UntypedStorage: bytes)."""

    name: str
    dtype: DType
    untyped: bool = False


DTYPES: tuple[DType, ...] = (
    DType("float64", 8, "<f8", "F64", "DoubleStorage", ("double",)),
    DType("float32", 4, "<f4", "F32", "FloatStorage", ("float",)),
    DType("float16", 2, "<f2", "F16", "HalfStorage", ("half",)),
    DType("bfloat16", 2, "ml_dtypes.bfloat16", "BF16", "BFloat16Storage"),
    DType("float8_e4m3fn", 1, "ml_dtypes.float8_e4m3fn", "F8_E4M3",
          "Float8_e4m3fnStorage"),
    DType("float8_e5m2", 1, "ml_dtypes.float8_e5m2", "F8_E5M2", "Float8_e5m2Storage"),
    DType("float8_e4m3fnuz", 1, "ml_dtypes.float8_e4m3fnuz", None,
          "Float8_e4m3fnuzStorage"),
    DType("float8_e5m2fnuz", 1, "ml_dtypes.float8_e5m2fnuz", None,
          "Float8_e5m2fnuzStorage"),
    DType("float8_e8m0fnu", 1, "ml_dtypes.float8_e8m0fnu", "F8_E8M0",
          "Float8_e8m0fnuStorage"),
    DType("int64", 8, "<i8", "I64", "LongStorage", ("long",)),
    DType("int32", 4, "<i4", "I32", "IntStorage", ("int",)),
    DType("int16", 2, "<i2", "I16", "ShortStorage", ("short",)),
    DType("int8", 1, "i1", "I8", "CharStorage"),
    DType("uint8", 1, "u1", "U8", "ByteStorage"),
    DType("uint16", 2, "<u2", "U16", "UInt16Storage"),
    DType("uint32", 4, "<u4", "U32", "UInt32Storage"),
    DType("uint64", 8, "<u8", "U64", "UInt64Storage"),
    DType("bool", 1, "?", "BOOL", "BoolStorage"),
    DType("complex64", 8, "<c8", "C64", "ComplexFloatStorage", ("cfloat",)),
    DType("complex128", 16, "<c16", None, "ComplexDoubleStorage", ("cdouble",)),
    DType("complex32", 4, "complex32", None, "ComplexHalfStorage", ("chalf",),
          "viewed as a structured (real, imag) float16 pair"),
    DType("qint8", 1, None, None, "QInt8Storage", note="quantized"),
    DType("quint8", 1, None, None, "QUInt8Storage", note="quantized"),
    DType("qint32", 4, None, None, "QInt32Storage", note="quantized"),
    DType("quint4x2", 1, None, None, "QUInt4x2Storage", note="quantized"),
    DType("quint2x4", 1, None, None, "QUInt2x4Storage", note="quantized"),
    DType("float4_e2m1fn_x2", 1, None, None, "Float4_e2m1fn_x2Storage", note="packed 4-bit"),
    DType("bits8", 1, None, None, "Bits8Storage", note="bits"),
    DType("bits16", 2, None, None, "Bits16Storage", note="bits"),
    DType("bits1x8", 1, None, None, "Bits1x8Storage", note="bits"),
    DType("bits2x4", 1, None, None, "Bits2x4Storage", note="bits"),
    DType("bits4x2", 1, None, None, "Bits4x2Storage", note="bits"),
    *(DType(f"{kind}{n}", 1, None, None, f"{kind.capitalize().replace('Uint', 'UInt')}{n}Storage",
            note="sub-byte") for kind in ("int", "uint") for n in range(1, 8)),
)

_BY_NAME: dict[str, DType] = {}
for _d in DTYPES:
    _BY_NAME[_d.name] = _d
    for _a in _d.aliases:
        _BY_NAME[_a] = _d
_BY_STORAGE: dict[str, DType] = {d.storage: d for d in DTYPES if d.storage}

UINT8 = _BY_NAME["uint8"]


def by_torch_name(name: str) -> DType | None:
    """``float32`` / ``float`` / … → DType (None if not a torch dtype name)."""
    return _BY_NAME.get(name)


def by_storage_name(name: str) -> DType | None:
    """``FloatStorage`` … → DType (None if unknown)."""
    return _BY_STORAGE.get(name)


def names_storage_type(module: str, name: str) -> bool:
    """Whether a global claims to be a torch storage type (``torch.FloatStorage``,
    ``torch.cuda.HalfStorage``): the reader rebuilds the known ones and refuses the others,
    and the scanner judges them by the same test."""
    return (module == "torch" or module.startswith("torch.")) and name.endswith("Storage") \
        and "." not in name
