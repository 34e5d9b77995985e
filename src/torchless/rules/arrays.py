"""Rebuild rules for NumPy arrays, scalars and dtypes (``ndarray.__reduce__`` and friends).

Arrays are rebuilt with ``np.frombuffer`` from the bytes in the pickle, never by calling
NumPy's own unpickling; object arrays hold only the inert values the pickle built.
"""

from __future__ import annotations

import re
from typing import Any

from torchless.errors import PickleError
from torchless.pickle.known import Known, Pending, unwrap
from torchless.pickle.machine import Resolver
from torchless.pickle.values import Opaque

__all__ = ["NumpyRules"]

_NP_DTYPE_CODE = re.compile(r"(?:b1|[iu][1248]|f(?:2|4|8|16)|c(?:8|16|32)|\?|[SUV][0-9]+|O[48]"
                            r"|[mM]8\[[1-9][0-9]{0,5}(?:[YMWDhms]|[munpfa]s)\])\Z")
_DATETIME_UNITS = frozenset({"Y", "M", "W", "D", "h", "m", "s", "ms", "us", "ns", "ps", "fs", "as"})


def _datetime_code(code: str, meta: Any) -> str:
    """``M8[10s]`` from a datetime64 / timedelta64 dtype's pickled unit, ``(metadata,
    (b"s", 10, 1, 1))``; the bare code (not rebuilt) for any other form, and for the generic
    unit (NaT of no unit, which an inert file cannot name)."""
    if not (isinstance(meta, tuple) and len(meta) == 2 and isinstance(meta[1], tuple)
            and len(meta[1]) == 4):
        return code
    unit, num, den, events = meta[1]
    if isinstance(unit, bytes):
        unit = unit.decode("ascii", "replace")
    if unit not in _DATETIME_UNITS or type(num) is not int or not 0 < num < 10**6 \
            or den != 1 or events != 1:
        return code
    return f"{code}[{num}{unit}]"


class NumpyRules(Resolver):
    """``_r_np_*`` methods and the BUILD step that finishes arrays and dtypes."""

    def _r_np_reconstruct(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) != 3 or not isinstance(a[0], Known) or a[0].rule != "np_ndarray":
            return Opaque(f, a)
        return Pending("ndarray", a)

    def _r_np_ndarray(self, f: Known, a: tuple[Any, ...]) -> Any:
        return Pending("ndarray", a)

    def _r_np_dtype(self, f: Known, a: tuple[Any, ...]) -> Any:
        if not a or type(a[0]) is not str:
            raise PickleError("numpy.dtype takes a type code")
        return Pending("dtype", a)

    def _r_np_frombuffer(self, f: Known, a: tuple[Any, ...]) -> Any:
        import numpy as np  # only files that hold NumPy values pay for importing it

        if len(a) != 4:
            raise PickleError("numpy _frombuffer takes (buffer, dtype, shape, order)")
        buf, dtype, shape, order = a[0], unwrap(a[1]), a[2], a[3]
        if not isinstance(dtype, np.dtype) or dtype.hasobject:
            return Opaque(f, a)
        if not isinstance(buf, (bytes, bytearray)) or order not in ("C", "F") or \
                not isinstance(shape, tuple) or any(type(s) is not int or s < 0 for s in shape):
            raise PickleError("numpy _frombuffer called with invalid arguments")
        n = 1
        for s in shape:
            n *= s
        if len(buf) != n * dtype.itemsize:
            raise PickleError(f"numpy buffer of {len(buf)} bytes for {n} x {dtype}")
        flat = np.frombuffer(bytes(buf), dtype=dtype)
        return flat.reshape(shape, order="F" if order == "F" else "C")

    def _r_np_scalar(self, f: Known, a: tuple[Any, ...]) -> Any:
        import numpy as np  # only files that hold NumPy values pay for importing it

        if len(a) not in (1, 2):
            raise PickleError("numpy scalar takes a dtype and its bytes")
        dtype = unwrap(a[0])
        if not isinstance(dtype, np.dtype):
            return Opaque(f, a)
        if dtype.hasobject:
            return a[1] if len(a) == 2 else None
        raw = a[1] if len(a) == 2 else b""
        if isinstance(raw, str):
            raw = raw.encode("latin-1")
        if not isinstance(raw, bytes) or len(raw) != dtype.itemsize:
            raise PickleError(f"numpy scalar of {dtype} needs {dtype.itemsize} bytes")
        return np.frombuffer(raw, dtype=dtype)[0]

    def _finish_pending(self, p: Pending, state: Any) -> None:
        import numpy as np  # only files that hold NumPy values pay for importing it

        if p.kind == "dtype":
            code = p.args[0]
            order = state[1] if isinstance(state, tuple) and len(state) > 1 else "|"
            fields_none = isinstance(state, tuple) and len(state) >= 5 and \
                all(x is None for x in state[2:5])
            if code in ("M8", "m8") and fields_none and len(state) == 9:
                code = _datetime_code(code, state[8])
            if _NP_DTYPE_CODE.match(code) and order in ("<", ">", "|", "=") and fields_none:
                dt = np.dtype(code)
                p.value = dt.newbyteorder(order) if order in "<>" else dt
            return
        if not isinstance(state, tuple) or len(state) not in (4, 5):
            raise ValueError("ndarray state is not a 4- or 5-tuple")
        shape, dtype, fortran, raw = state[-4:]
        dtype = unwrap(dtype)
        if not isinstance(dtype, np.dtype):
            return
        if not isinstance(shape, tuple) or any(type(s) is not int or s < 0 for s in shape):
            raise ValueError("ndarray shape is not a tuple of non-negative ints")
        n = 1
        for s in shape:
            n *= s
        if dtype.hasobject:
            if not isinstance(raw, list) or len(raw) != n:
                raise ValueError("object array state does not match its shape")
            arr = np.empty(n, dtype=object)
            arr[:] = raw
            p.value = arr.reshape(shape, order="F" if fortran else "C")
            return
        if isinstance(raw, str):
            raw = raw.encode("latin-1")
        if not isinstance(raw, (bytes, bytearray)) or len(raw) != n * dtype.itemsize:
            raise ValueError(f"ndarray of {n} x {dtype} needs {n * dtype.itemsize} bytes")
        flat = np.frombuffer(bytes(raw), dtype=dtype)
        if not dtype.isnative:  # ndarray.__setstate__ swaps to native order; so do we
            flat = flat.astype(dtype.newbyteorder("="))
            flat.flags.writeable = False
        p.value = flat.reshape(shape, order="F" if fortran else "C")
