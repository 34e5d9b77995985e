"""The inert format, version 1 (``docs/inert-format.md``): a whole object without pickle.

One safetensors file: every tensor and array of the object is a safetensors tensor, and
``__metadata__["torchless.tree"]`` is a JSON tree of everything else, with tagged values for
what JSON has no type for. :mod:`torchless.inert.encode` turns a Python object into (tree,
tensors to write); :mod:`torchless.inert.decode` turns a tree back into the object, building
only the data types the specification lists. This module holds what both share: the
metadata keys, the tables of types, and the :class:`TypeRegistry` through which a *loading
program* (never a file) says how its own classes are rebuilt.
"""

from __future__ import annotations

import pathlib
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from torchless.core import dtypes as _dtypes
from torchless.core.dtypes import DType

__all__ = ["FORMAT_KEY", "TREE_KEY", "VERSION", "OpaqueObjectWarning", "TensorMode",
           "TypeRegistry", "default_types", "opaque_summary", "register_type"]


class OpaqueObjectWarning(UserWarning):
    """A written file holds objects torchless keeps as inert records (their class path and
    state): :func:`torchless.load` returns them as :class:`torchless.Opaque`."""


def opaque_summary(counts: dict[str, int]) -> str:
    """``N object(s) kept as inert records (torchless.Opaque): a.B, c.D …`` for a warning."""
    names = sorted(counts)
    shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    return f"{sum(counts.values())} object(s) kept as inert records (torchless.Opaque): {shown}"

#: How tensors come back: views as NumPy arrays, torch tensors, or torchless Tensors.
TensorMode = Literal["numpy", "torch", "lazy"]
#: A safetensors header's entries: name -> (dtype, shape, begin, end).
Entries = Mapping[str, tuple[str, tuple[int, ...], int, int]]

FORMAT_KEY = "torchless.inert"
TREE_KEY = "torchless.tree"
VERSION = "1"

_SAFE_INT = 2**53 - 1
_FACTORIES: dict[Any, str] = {list: "list", dict: "dict", set: "set", int: "int",
                              float: "float", str: "str", tuple: "tuple"}
_FACTORY_BY_NAME = {v: k for k, v in _FACTORIES.items()}
_PATHS: dict[str, type[pathlib.PurePath]] = {
    "PurePosixPath": pathlib.PurePosixPath, "PureWindowsPath": pathlib.PureWindowsPath,
    "PosixPath": pathlib.PurePosixPath, "WindowsPath": pathlib.PureWindowsPath,
    "Path": pathlib.PurePath}
#: NumPy type strings allowed in a file: byte order, kind, size; m8/M8 with their unit.
_DESCR = re.compile(r"[<>|](?:[biufcSUV]\d{1,6}|[mM]8\[[0-9]{0,6}[a-zA-Z]{1,2}\])")
#: array descr -> the torch dtype whose safetensors name types its entry
_TYPED_ARRAYS = {"|b1": "bool", "|u1": "uint8", "|i1": "int8", "<i2": "int16", "<u2": "uint16",
                 "<i4": "int32", "<u4": "uint32", "<i8": "int64", "<u8": "uint64",
                 "<f2": "float16", "<f4": "float32", "<f8": "float64", "<c8": "complex64",
                 "bfloat16": "bfloat16", "float8_e4m3fn": "float8_e4m3fn",
                 "float8_e5m2": "float8_e5m2", "float8_e8m0fnu": "float8_e8m0fnu"}


def _uint8() -> DType:
    found = _dtypes.by_torch_name("uint8")
    assert found is not None
    return found


_UINT8: DType = _uint8()


# ---- the type registry ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    cls: type
    name: str
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


class TypeRegistry:
    """How a program's own classes are written and read back. Opt-in and explicit: a name
    read from a file is only ever looked up in here, never imported."""

    def __init__(self) -> None:
        self._by_type: dict[type, _Entry] = {}
        self._by_name: dict[str, _Entry] = {}
        self._by_global: dict[tuple[str, str], type] = {}

    def register(self, cls: type, encode: Callable[[Any], Any], decode: Callable[[Any], Any],
                 *, name: str | None = None) -> None:
        """Write instances of ``cls`` as ``encode(obj)`` (any value this format holds) under
        ``name`` (default ``module:qualname``); read them back with ``decode(state)``."""
        if not isinstance(cls, type):
            raise TypeError("register() needs a class")
        key = name if name is not None else f"{cls.__module__}:{cls.__qualname__}"
        if not isinstance(key, str) or not key:
            raise TypeError("the name must be a non-empty str")
        entry = _Entry(cls, key, encode, decode)
        old = self._by_name.get(key)
        if old is not None:
            self.unregister(old.cls)
        self.unregister(cls)
        self._by_type[cls] = entry
        self._by_name[key] = entry
        self._by_global[(cls.__module__, cls.__qualname__)] = cls

    def unregister(self, cls: type) -> None:
        entry = self._by_type.pop(cls, None)
        if entry is not None:
            self._by_name.pop(entry.name, None)
            self._by_global.pop((cls.__module__, cls.__qualname__), None)

    def by_type(self, cls: type) -> _Entry | None:
        return self._by_type.get(cls)

    def by_name(self, name: str) -> _Entry | None:
        return self._by_name.get(name)

    def by_global(self, module: str, qualname: str) -> type | None:
        """The registered class whose ``__module__`` and ``__qualname__`` these are: what a
        ``$global`` naming it reads back as (Lightning saves ``hparams_type``, the class of
        its hyper parameters). Registering a class vouches for the class object too."""
        return self._by_global.get((module, qualname))


default_types = TypeRegistry()


def register_type(cls: type, encode: Callable[[Any], Any], decode: Callable[[Any], Any], *,
                  name: str | None = None) -> None:
    """Register ``cls`` in the default registry used by :func:`torchless.save` and
    :func:`torchless.load` (see :meth:`TypeRegistry.register`)."""
    default_types.register(cls, encode, decode, name=name)


def _torch() -> Any:
    """torch, if the program has imported it (then its tensors may be in the object)."""
    return sys.modules.get("torch")
