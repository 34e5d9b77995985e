"""The inert format, version 1 (``docs/inert-format.md``): a whole object without pickle.

One safetensors file: every tensor and array of the object is a safetensors tensor, and
``__metadata__["torchless.tree"]`` is a JSON tree of everything else, with tagged values for
what JSON has no type for. This module is the tree codec: :class:`Encoder` turns a Python
object into (tree, tensors to write); :func:`decode` turns a tree back into the object,
building only the data types the specification lists. Nothing read from a file is ever
imported, looked up or called: class names stay :class:`Global` / :class:`Opaque` records
unless the *loading program* registered a decoder for them (:class:`TypeRegistry`).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import collections
import copyreg
import datetime
import json
import math
import pathlib
import re
import struct
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import ml_dtypes
import numpy as np

from . import _dtypes
from ._dtypes import DType, StorageType
from ._errors import CheckpointError, ConversionError, FormatError, LimitError, UnsupportedError
from ._graph import ModuleDict
from ._limits import Limits
from ._tensor import Storage, Tensor, UnsupportedTensor
from ._values import NOTSET, Global, Opaque

__all__ = ["FORMAT_KEY", "TREE_KEY", "VERSION", "Encoder", "TypeRegistry", "decode",
           "default_types", "register_type"]

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
#: ml_dtypes types an array may have, by name (their ``dtype.str`` is an opaque ``<V2``).
_ML_DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(getattr(ml_dtypes, name)) for name in (
        "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
        "float8_e4m3b11fnuz", "float8_e8m0fnu", "float4_e2m1fn", "int4", "uint4")
    if hasattr(ml_dtypes, name)}
_DESCR = re.compile(r"[<>|=]?([biufcSUVmM])(\d{1,6})(\[[0-9]*[a-zA-Z]{1,2}\])?")
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
            self._by_type.pop(old.cls, None)
        self._by_type[cls] = entry
        self._by_name[key] = entry

    def unregister(self, cls: type) -> None:
        entry = self._by_type.pop(cls, None)
        if entry is not None:
            self._by_name.pop(entry.name, None)

    def by_type(self, cls: type) -> _Entry | None:
        return self._by_type.get(cls)

    def by_name(self, name: str) -> _Entry | None:
        return self._by_name.get(name)


default_types = TypeRegistry()


def register_type(cls: type, encode: Callable[[Any], Any], decode: Callable[[Any], Any], *,
                  name: str | None = None) -> None:
    """Register ``cls`` in the default registry used by :func:`torchless.save` and
    :func:`torchless.load` (see :meth:`TypeRegistry.register`)."""
    default_types.register(cls, encode, decode, name=name)


# ---- encoding ------------------------------------------------------------------------------


def _b64(data: bytes | bytearray | memoryview) -> str:
    return base64.b64encode(bytes(data)).decode("ascii")


def _float(x: float) -> Any:
    if math.isfinite(x):
        return x
    if math.isinf(x):
        return {"$float": "inf" if x > 0 else "-inf"}
    bits = struct.pack(">d", x)
    return {"$float": "nan" if bits == b"\x7f\xf8" + bytes(6) else "nan:" + bits.hex()}


def _descr(dt: np.dtype[Any]) -> str:
    for name, known in _ML_DTYPES.items():
        if dt == known:
            return name
    s: str = dt.str
    if dt.hasobject or dt.fields is not None or dt.subdtype is not None:
        raise ConversionError(f"cannot store NumPy dtype {dt} (object or structured)")
    m = _DESCR.fullmatch(s)
    if m is None or dt.itemsize == 0:
        raise ConversionError(f"cannot store NumPy dtype {dt}")
    return s


def _torch() -> Any:
    """torch, if the program has imported it (then its tensors may be in the object)."""
    return sys.modules.get("torch")


class Encoder:
    """One object graph to a JSON tree and the tensors it references.

    ``names`` gives tensors of a checkpoint (by id) the safetensors names they are written
    under, ``skipped`` the reason for those deliberately left out; any other tensor or array
    gets a name from its path in the object."""

    def __init__(self, *, types: TypeRegistry | None = None, limits: Limits | None = None,
                 names: Mapping[int, str] | None = None,
                 skipped: Mapping[int, str] | None = None) -> None:
        self.types = types if types is not None else default_types
        self.limits = limits if limits is not None else Limits()
        self.names = dict(names or {})
        self.skipped = dict(skipped or {})
        self.tensors: dict[str, Tensor] = {}
        self.opaque: dict[str, int] = {}        # class path -> count, for warnings
        self._counts: dict[int, int] = {}
        self._ids: dict[int, int] = {}
        self._active: set[int] = set()
        self._lowered: dict[int, Any] = {}      # registered state / Opaque record, by id
        self._next_id = 0
        self._keep: list[Any] = []              # objects made while encoding, kept alive
        self._torch = _torch()

    def encode(self, root: Any) -> str:
        """The tree as JSON text."""
        self._count(root)
        tree = self._value(root, "", 0)
        return json.dumps(tree, ensure_ascii=False, separators=(",", ":"), allow_nan=False)

    # -- what a value is ------------------------------------------------------------------

    def _atom(self, obj: Any, path: str) -> Any:
        """The node of a value without identity, or ``_NOT_ATOM``."""
        if obj is None or obj is True or obj is False or type(obj) is str:
            return obj
        if type(obj) is int:
            return obj if -_SAFE_INT <= obj <= _SAFE_INT else {"$int": str(obj)}
        if type(obj) is float:
            return _float(obj)
        if type(obj) is bytes:
            return {"$bytes": _b64(obj)}
        if type(obj) is complex:
            return {"$complex": [_float(obj.real), _float(obj.imag)]}
        if isinstance(obj, DType):
            return {"$dtype": obj.name}
        if isinstance(obj, StorageType):
            return {"$global": ["torch", obj.name]}
        if isinstance(obj, Global):
            return {"$global": [obj.module, obj.name]}
        if isinstance(obj, UnsupportedTensor):
            return {"$unsupported": {"kind": obj.kind}}
        if isinstance(obj, slice):
            parts = [obj.start, obj.stop, obj.step]
            if not all(p is None or type(p) is int for p in parts):
                raise ConversionError(f"{path or 'the object'}: cannot store a slice of "
                                      "non-integers")
            return {"$slice": parts}
        if type(obj) is range:
            return {"$range": [obj.start, obj.stop, obj.step]}
        if type(obj) is datetime.datetime:
            return {"$datetime": _iso(obj)}
        if type(obj) is datetime.date:
            return {"$date": obj.isoformat()}
        if type(obj) is datetime.time:
            return {"$time": _iso(obj)}
        if type(obj) is datetime.timedelta:
            return {"$timedelta": [obj.days, obj.seconds, obj.microseconds]}
        if isinstance(obj, pathlib.PurePath) and type(obj).__module__ == "pathlib":
            return {"$path": [type(obj).__name__, str(obj)]}
        if isinstance(obj, np.generic):
            return {"$npscalar": {"dtype": _descr(obj.dtype),
                                  "data": _b64(np.asarray(obj).tobytes())}}
        if isinstance(obj, np.dtype):
            return {"$npdtype": _descr(obj)}
        t = self._torch
        if t is not None:
            if isinstance(obj, t.dtype):
                return {"$dtype": str(obj).removeprefix("torch.")}
            if isinstance(obj, t.device):
                return {"$device": str(obj)}
            if isinstance(obj, t.Size):
                return {"$size": list(obj)}
        if isinstance(obj, (tuple, frozenset)) and not obj and type(obj) in (tuple, frozenset):
            return {"$tuple" if type(obj) is tuple else "$frozenset": []}
        return _NOT_ATOM

    def _is_tensor(self, obj: Any) -> bool:
        t = self._torch
        return isinstance(obj, Tensor) or (t is not None and isinstance(obj, t.Tensor))

    def _lower(self, obj: Any, path: str) -> Any:
        """For an object of a registered type its encoded state, for an object of a class
        this format does not know an :class:`Opaque` record; cached, so both passes agree."""
        k = id(obj)
        if k in self._lowered:
            return self._lowered[k]
        entry = self.types.by_type(type(obj))
        lowered = entry.encode(obj) if entry is not None else self._reduce(obj, path)
        self._lowered[k] = lowered
        self._keep.append(lowered)
        return lowered

    def _structural(self, obj: Any) -> bool:
        """Containers, tensors and arrays this format writes itself."""
        return type(obj) in _CONTAINER_TYPES or isinstance(obj, (Opaque, np.ndarray)) or (
            self._is_tensor(obj))

    # -- pass 1: how often each object is reached -----------------------------------------

    def _count(self, root: Any) -> None:
        stack: list[tuple[Any, str]] = [(root, "")]
        while stack:
            obj, path = stack.pop()
            if self._atom(obj, path) is not _NOT_ATOM:
                continue
            k = id(obj)
            n = self._counts.get(k, 0)
            self._counts[k] = n + 1
            if n:
                continue
            self._keep.append(obj)
            if self._structural(obj):
                stack.extend((c, path) for c in _children(obj))
            elif self.types.by_type(type(obj)) is not None:
                stack.append((self._lower(obj, path), path))
            elif not isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
                stack.extend((c, path) for c in _children(self._lower(obj, path)))

    # -- pass 2: the tree -----------------------------------------------------------------

    def _value(self, obj: Any, path: str, depth: int) -> Any:
        if depth > self.limits.max_depth:
            raise LimitError("max_depth", self.limits.max_depth, depth,
                             "nested values in the object to save")
        atom = self._atom(obj, path)
        if atom is not _NOT_ATOM:
            return atom
        k = id(obj)
        if k in self._ids:
            return {"$ref": self._ids[k]}
        if k in self._active:
            raise ConversionError(f"{path or 'the object'} contains itself through a "
                                  f"{type(obj).__name__}, which cannot be rebuilt")
        shared = self._counts.get(k, 0) > 1
        node_id = None
        if shared:
            node_id = self._next_id
            self._next_id += 1
        if shared and type(obj) not in (tuple, frozenset):  # mutable: defined before children
            assert node_id is not None
            self._ids[k] = node_id
        self._active.add(k)
        try:
            node = self._node(obj, path, depth + 1, shared)
        finally:
            self._active.discard(k)
        if shared:
            assert node_id is not None and isinstance(node, dict)
            self._ids[k] = node_id
            node = {"$id": node_id, **node}
        return node

    def _pairs(self, items: Any, path: str, d: int) -> list[list[Any]]:
        return [[self._value(k, path, d), self._value(v, _join(path, k), d)]
                for k, v in items]

    def _node(self, obj: Any, path: str, d: int, shared: bool) -> Any:
        if self._is_tensor(obj):
            return {"$tensor": self._tensor(obj, path)}
        if isinstance(obj, np.ndarray):
            return self._array(obj, path, d)
        if isinstance(obj, Opaque):
            return {"$opaque": self._opaque(obj, path, d)}
        kind = type(obj)
        if kind not in _CONTAINER_TYPES:
            entry = self.types.by_type(kind)
            if entry is not None:
                return {"$obj": {"type": entry.name,
                                 "state": self._value(self._lower(obj, path), path, d)}}
            if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
                return {"$global": list(_global_name(obj, path or "the object"))}
            return {"$opaque": self._opaque(self._lower(obj, path), path, d)}
        if kind is list:
            items = [self._value(v, _join(path, i), d) for i, v in enumerate(obj)]
            return {"$list": items} if shared else items
        if kind is tuple:
            return {"$tuple": [self._value(v, _join(path, i), d) for i, v in enumerate(obj)]}
        if kind is dict:
            if not shared and all(type(k) is str and not k.startswith("$") for k in obj):
                return {k: self._value(v, _join(path, k), d) for k, v in obj.items()}
            return {"$dict": self._pairs(obj.items(), path, d)}
        if kind is collections.OrderedDict or kind is ModuleDict:
            body: dict[str, Any] = {"items": self._pairs(obj.items(), path, d)}
            attrs = {str(k): self._value(v, path, d) for k, v in vars(obj).items()}
            if attrs:
                body["attrs"] = attrs
            return {"$module" if kind is ModuleDict else "$odict": body}
        if kind is collections.defaultdict:
            factory = obj.default_factory
            if factory is not None and factory not in _FACTORIES:
                raise ConversionError(f"{path or 'the object'}: cannot store a defaultdict "
                                      f"whose default_factory is {factory!r}")
            return {"$defaultdict": {"factory": None if factory is None else _FACTORIES[factory],
                                     "items": self._pairs(obj.items(), path, d)}}
        if kind is collections.Counter:
            return {"$counter": self._pairs(obj.items(), path, d)}
        if kind is collections.deque:
            return {"$deque": {"items": [self._value(v, _join(path, i), d)
                                         for i, v in enumerate(obj)], "maxlen": obj.maxlen}}
        if kind is set or kind is frozenset:
            return {"$set" if kind is set else "$frozenset": [self._value(v, path, d)
                                                              for v in obj]}
        if kind is bytearray:
            return {"$bytearray": _b64(obj)}
        tag = "$namespace" if kind is argparse.Namespace else "$simplenamespace"
        return {tag: {str(k): self._value(v, _join(path, k), d) for k, v in vars(obj).items()}}

    def _opaque(self, obj: Opaque, path: str, d: int) -> dict[str, Any]:
        self.opaque[obj.class_path] = self.opaque.get(obj.class_path, 0) + 1
        body: dict[str, Any] = {
            "callable": self._value(obj.callable, path, d),
            "args": [self._value(v, path, d) for v in obj.args],
            "kwargs": None if obj.kwargs is None else self._pairs(obj.kwargs.items(), path, d),
            "newobj": obj.newobj,
            "items": [self._value(v, _join(path, i), d) for i, v in enumerate(obj.items)],
            "dict_items": self._pairs(obj.dict_items, path, d)}
        if obj.state is not NOTSET:
            body["state"] = self._value(obj.state, path, d)
        return body

    def _reduce(self, obj: Any, path: str) -> Opaque:
        """An object of a class this format does not know, as pickle would describe it (the
        program's own live object, so asking it is safe): an :class:`Opaque` record."""
        where = path or "the object"
        try:
            rv = obj.__reduce_ex__(4)
        except Exception as e:
            raise ConversionError(f"{where}: cannot store a {type(obj).__qualname__} "
                                  f"({type(e).__name__}: {e})") from None
        if isinstance(rv, str):  # a module-level singleton
            module = getattr(obj, "__module__", None) or type(obj).__module__
            return Opaque(Global(module, rv))
        if not isinstance(rv, tuple) or not 2 <= len(rv) <= 6:
            raise ConversionError(f"{where}: cannot store a {type(obj).__qualname__}")
        func, args, *rest = rv
        state, listitems, dictitems = [*rest, None, None, None][:3]
        if func is copyreg.__newobj__:  # type: ignore[attr-defined]
            record = Opaque(Global(*_global_name(args[0], where)), tuple(args[1:]),
                            newobj=True)
        elif func is getattr(copyreg, "__newobj_ex__", None):
            cls, a, kw = args
            record = Opaque(Global(*_global_name(cls, where)), tuple(a), dict(kw), newobj=True)
        else:
            record = Opaque(Global(*_global_name(func, where)), tuple(args))
        if state is not None:
            record.state = state
        if listitems is not None:
            record.items = list(listitems)
        if dictitems is not None:
            record.dict_items = list(dictitems)
        return record

    def _name(self, path: str) -> str:
        base = path or "tensor"
        name, n = base, 1
        while name in self.tensors or name == "__metadata__":
            n += 1
            name = f"{base}~{n}"
        return name

    def _tensor(self, obj: Any, path: str) -> dict[str, Any]:
        if not isinstance(obj, Tensor):
            return self._torch_tensor(obj, path)
        body: dict[str, Any] = {"dtype": obj.dtype.name, "shape": list(obj.shape)}
        if obj.requires_grad:
            body["requires_grad"] = True
        if obj.is_parameter:
            body["parameter"] = True
        if obj.storage.location != "cpu":
            body["device"] = obj.storage.location
        name = self.names.get(id(obj))
        if name is None:
            if id(obj) in self.skipped:
                return {"skipped": self.skipped[id(obj)], **body}
            name = self._name(path)
            if obj.dtype.safetensors is None:  # its bytes, as U8
                from ._safetensors import chunks

                raw = np.frombuffer(b"".join(bytes(c) for c in chunks(obj)), np.uint8)
                self.tensors[name] = _memory_tensor(name, raw, _UINT8, (raw.size,))
                body["raw"] = True
            else:
                self.tensors[name] = obj
        return {"name": name, **body}

    def _torch_tensor(self, obj: Any, path: str) -> dict[str, Any]:
        torch = self._torch
        dtype = _dtypes.by_torch_name(str(obj.dtype).removeprefix("torch."))
        where = path or "the object"
        if dtype is None:
            raise ConversionError(f"{where}: cannot store a tensor of {obj.dtype}")
        if obj.layout != torch.strided or obj.is_quantized or obj.device.type == "meta" or (
                getattr(obj, "is_nested", False)):
            raise ConversionError(f"{where}: cannot store a {obj.layout} / quantized / nested "
                                  "/ meta tensor")
        body: dict[str, Any] = {"dtype": dtype.name, "shape": list(obj.shape)}
        if obj.requires_grad:
            body["requires_grad"] = True
        if isinstance(obj, torch.nn.Parameter):
            body["parameter"] = True
        if obj.device.type != "cpu":
            body["device"] = str(obj.device)
        flat = obj.detach().to("cpu").resolve_conj().resolve_neg().contiguous()
        raw = flat.reshape(-1).view(torch.uint8).numpy() if flat.numel() else np.empty(
            0, np.uint8)
        self._keep.append(flat)
        name = self._name(path)
        if dtype.safetensors is None:
            self.tensors[name] = _memory_tensor(name, raw, _UINT8, (raw.size,))
            body["raw"] = True
        else:
            self.tensors[name] = _memory_tensor(name, raw, dtype, tuple(obj.shape))
        return {"name": name, **body}

    def _array(self, obj: np.ndarray[Any, Any], path: str, d: int) -> dict[str, Any]:
        where = path or "the object"
        if obj.dtype.hasobject:
            if obj.dtype.fields is not None or obj.dtype != np.dtype(object):
                raise ConversionError(f"{where}: cannot store a structured array with object "
                                      "fields")
            return {"$objarray": {"shape": list(obj.shape),
                                  "items": [self._value(v, path, d) for v in
                                            obj.ravel(order="C")]}}
        descr = _descr(obj.dtype)
        body: dict[str, Any] = {"descr": descr, "shape": list(obj.shape)}
        if obj.ndim > 1 and obj.flags.f_contiguous and not obj.flags.c_contiguous:
            body["fortran"] = True
        data = np.ascontiguousarray(obj).reshape(-1).view(np.uint8) if obj.size else np.empty(
            0, np.uint8)
        self._keep.append(data)
        typed = _TYPED_ARRAYS.get(descr)
        name = self._name(path)
        if typed is not None:
            dtype = _dtypes.by_torch_name(typed)
            assert dtype is not None
            self.tensors[name] = _memory_tensor(name, data, dtype, tuple(obj.shape))
        else:
            self.tensors[name] = _memory_tensor(name, data, _UINT8, (data.size,))
        return {"$ndarray": {"name": name, **body}}


_NOT_ATOM: Any = object()
_CONTAINER_TYPES: frozenset[type] = frozenset({list, tuple, dict, set, frozenset, bytearray,
                              collections.OrderedDict, ModuleDict, collections.defaultdict,
                              collections.Counter, collections.deque, argparse.Namespace,
                              types.SimpleNamespace})


def _children(obj: Any) -> Iterator[Any]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield v
        if type(obj) in (collections.OrderedDict, ModuleDict):
            yield from vars(obj).values()
    elif isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
        yield from obj
    elif isinstance(obj, (argparse.Namespace, types.SimpleNamespace)):
        yield from vars(obj).values()
    elif isinstance(obj, Opaque):
        yield obj.callable
        yield from obj.args
        if obj.kwargs:
            yield from obj.kwargs.keys()
            yield from obj.kwargs.values()
        if obj.state is not NOTSET:
            yield obj.state
        yield from obj.items
        for k, v in obj.dict_items:
            yield k
            yield v
    elif isinstance(obj, np.ndarray) and obj.dtype.hasobject and obj.dtype.fields is None:
        yield from obj.ravel(order="C")


def _memory_tensor(name: str, raw: np.ndarray[Any, Any], dtype: DType,
                   shape: tuple[int, ...]) -> Tensor:
    """A contiguous tensor over bytes in memory; dtypes safetensors cannot name go as U8."""
    buf = memoryview(raw.data).cast("B") if raw.size else memoryview(b"")
    storage = Storage(name, dtype, len(buf), lambda: buf)
    stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    return Tensor(storage, dtype, shape, stride, 0)


def _join(path: str, key: Any) -> str:
    k = key if type(key) is str else str(key) if type(key) in (int, bool) or key is None else (
        repr(key))
    return f"{path}.{k}" if path else k


def _iso(obj: datetime.datetime | datetime.time) -> str:
    if obj.tzinfo is not None and type(obj.tzinfo) is not datetime.timezone:
        raise ConversionError(f"cannot store a time zone of type {type(obj.tzinfo).__name__} "
                              "(only fixed UTC offsets)")
    text = obj.isoformat()
    return text + (";fold=1" if obj.fold else "")


def _global_name(obj: Any, where: str) -> tuple[str, str]:
    module = getattr(obj, "__module__", None)
    qual = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if not isinstance(module, str) or not isinstance(qual, str) or "<" in qual:
        raise ConversionError(f"{where}: cannot store {obj!r}: it has no importable name "
                              "(a lambda or a local class or function)")
    return module, qual


# ---- decoding ------------------------------------------------------------------------------


Entries = Mapping[str, tuple[str, tuple[int, ...], int, int]]
TensorMode = Literal["numpy", "torch", "lazy"]


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise FormatError(f"the tree repeats the key {k!r} in one object")
        out[k] = v
    return out


def parse_tree(text: str, limits: Limits) -> Any:
    """The tree's JSON, checked for duplicate keys and bounded in depth."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates,
                          parse_constant=_no_constant)
    except RecursionError:
        raise LimitError("max_depth", limits.max_depth, sys.getrecursionlimit(),
                         "the tree nests deeper than Python's JSON parser can") from None
    except FormatError:
        raise
    except ValueError as e:
        raise FormatError(f"the tree is not valid JSON: {e}") from None


def _no_constant(name: str) -> Any:
    raise FormatError(f"the tree holds {name}, which JSON does not allow")


class _Decoder:
    def __init__(self, entries: Entries, data: memoryview, mode: TensorMode,
                 types: TypeRegistry, limits: Limits, copy: bool,
                 on_tensor: Callable[[Tensor, dict[str, Any]], Any] | None) -> None:
        self.entries = entries
        self.data = data
        self.mode = mode
        self.types = types
        self.limits = limits
        self.copy = copy
        self.on_tensor = on_tensor
        self.ids: dict[int, Any] = {}
        self.building: set[int] = set()
        self.torch = _torch() if mode == "torch" else None
        if mode == "torch" and self.torch is None:
            raise UnsupportedError("tensors='torch' needs torch imported by your program "
                                   "(torchless never imports it): add `import torch` first")

    def value(self, node: Any, depth: int) -> Any:
        if depth > self.limits.max_depth:
            raise LimitError("max_depth", self.limits.max_depth, depth, "nested tree values")
        if node is None or isinstance(node, (bool, str)):
            return node
        if isinstance(node, int):
            if abs(node) > _SAFE_INT and len(str(abs(node))) > self.limits.max_int_digits:
                raise LimitError("max_int_digits", self.limits.max_int_digits,
                                 len(str(abs(node))), "an integer in the tree")
            return node
        if isinstance(node, float):
            return node
        if isinstance(node, list):
            self._length(node)
            return [self.value(v, depth + 1) for v in node]
        if not isinstance(node, dict):  # pragma: no cover - json gives nothing else
            raise FormatError(f"unexpected JSON value {type(node).__name__}")
        if not any(k.startswith("$") for k in node):
            self._length(node)
            return {k: self.value(v, depth + 1) for k, v in node.items()}
        return self._tagged(node, depth)

    def _length(self, seq: Any) -> None:
        if len(seq) > self.limits.max_container_len:
            raise LimitError("max_container_len", self.limits.max_container_len, len(seq),
                             "values in one container of the tree")

    def _tagged(self, node: dict[str, Any], depth: int) -> Any:
        keys = [k for k in node if k != "$id"]
        if len(keys) != 1 or not keys[0].startswith("$"):
            raise FormatError(f"a tagged value has keys {sorted(node)}: expected one tag "
                              "and an optional $id")
        tag = keys[0]
        payload = node[tag]
        node_id = node.get("$id")
        if "$id" in node:
            if type(node_id) is not int or tag == "$ref":
                raise FormatError("$id must be an int on a value that is not a $ref")
            if node_id in self.ids or node_id in self.building:
                raise FormatError(f"the id {node_id} is defined twice")
        if tag == "$ref":
            if type(payload) is not int:
                raise FormatError("$ref takes an int id")
            if payload in self.ids:
                return self.ids[payload]
            if payload in self.building:
                raise FormatError(f"$ref {payload} makes a cycle through a value that cannot "
                                  "hold itself (a tuple, frozenset, set member or dict key)")
            raise FormatError(f"$ref {payload} names no value defined before it")
        handler = _HANDLERS.get(tag)
        if handler is None:
            raise FormatError(f"unknown tag {tag!r} (this reader knows format version "
                              f"{VERSION})")
        if node_id is not None:
            self.building.add(node_id)
        try:
            value = handler(self, payload, depth + 1, node_id)
        except (TypeError, ValueError, OverflowError, KeyError, IndexError,
                binascii.Error) as e:
            if isinstance(e, CheckpointError):
                raise
            raise FormatError(f"bad {tag} value: {e}") from None
        finally:
            if node_id is not None:
                self.building.discard(node_id)
        if node_id is not None:
            self.ids.setdefault(node_id, value)
        return value

    def define(self, node_id: int | None, value: Any) -> Any:
        """Register a mutable value before its children are read (cycles may use it)."""
        if node_id is not None:
            self.ids[node_id] = value
        return value

    def key(self, node: Any, depth: int) -> Any:
        k = self.value(node, depth)
        try:
            hash(k)
        except TypeError:
            raise FormatError(f"a {type(k).__name__} cannot be a dict key or set member"
                              ) from None
        return k

    def pairs(self, payload: Any, depth: int) -> Iterator[tuple[Any, Any]]:
        _expect(payload, list, "pairs")
        self._length(payload)
        for pair in payload:
            if not isinstance(pair, list) or len(pair) != 2:
                raise FormatError("expected [key, value] pairs")
            yield self.key(pair[0], depth), self.value(pair[1], depth)

    def floatval(self, node: Any) -> float:
        if isinstance(node, (int, float)) and not isinstance(node, bool):
            return float(node)
        if isinstance(node, dict) and list(node) == ["$float"]:
            return _h_float(self, node["$float"], 0, None)
        raise FormatError("expected a float")

    # tensors --------------------------------------------------------------------------

    def entry(self, name: Any) -> tuple[str, tuple[int, ...], int, int]:
        if not isinstance(name, str):
            raise FormatError("a tensor name must be a str")
        e = self.entries.get(name)
        if e is None:
            raise FormatError(f"the tree names the tensor {name!r}, which the file does not "
                              "have")
        return e

    def bytes_of(self, begin: int, end: int) -> memoryview:
        return self.data[begin:end]

    def leaf(self, t: Tensor) -> Any:
        """A tensor as the caller asked: lazy, a NumPy array or a torch tensor."""
        if self.mode == "lazy":
            return t
        if self.mode == "torch":
            return to_torch(t, self.torch)
        arr = t.numpy()
        return np.array(arr) if self.copy else arr


def _expect(value: Any, kind: type | tuple[type, ...], what: str) -> None:
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise FormatError(f"{what}: expected {getattr(kind, '__name__', kind)}, got "
                          f"{type(value).__name__}")


def _fields(payload: Any, required: set[str], optional: set[str], what: str) -> dict[str, Any]:
    _expect(payload, dict, what)
    missing = required - set(payload)
    surplus = set(payload) - required - optional
    if missing or surplus:
        raise FormatError(f"{what}: missing {sorted(missing)} / unexpected {sorted(surplus)}")
    return dict(payload)


def _shape(value: Any, limits: Limits) -> tuple[int, ...]:
    _expect(value, list, "shape")
    if len(value) > limits.max_ndim or not all(type(x) is int and x >= 0 for x in value):
        raise FormatError(f"bad shape {value!r}")
    return tuple(value)


def _h_int(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Any:
    _expect(p, str, "$int")
    if not re.fullmatch(r"-?[0-9]+", p):
        raise FormatError("$int takes a decimal string")
    if len(p) > dec.limits.max_int_digits:
        raise LimitError("max_int_digits", dec.limits.max_int_digits, len(p), "a $int")
    return int(p)


def _h_float(dec: _Decoder, p: Any, depth: int, nid: int | None) -> float:
    _expect(p, str, "$float")
    if p in ("inf", "-inf"):
        return float(p)
    if p == "nan":
        return float(struct.unpack(">d", b"\x7f\xf8" + bytes(6))[0])
    m = re.fullmatch(r"nan:([0-9a-f]{16})", p)
    if m is None:
        raise FormatError(f"bad $float {p!r}")
    x = float(struct.unpack(">d", bytes.fromhex(m.group(1)))[0])
    if not math.isnan(x):
        raise FormatError(f"$float {p!r} is not a NaN")
    return x


def _h_complex(dec: _Decoder, p: Any, depth: int, nid: int | None) -> complex:
    _expect(p, list, "$complex")
    if len(p) != 2:
        raise FormatError("$complex takes [re, im]")
    return complex(dec.floatval(p[0]), dec.floatval(p[1]))


def _b64decode(p: Any, what: str) -> bytes:
    _expect(p, str, what)
    return base64.b64decode(p.encode("ascii"), validate=True)


def _h_bytes(dec: _Decoder, p: Any, depth: int, nid: int | None) -> bytes:
    return _b64decode(p, "$bytes")


def _h_bytearray(dec: _Decoder, p: Any, depth: int, nid: int | None) -> bytearray:
    return dec.define(nid, bytearray(_b64decode(p, "$bytearray")))  # type: ignore[no-any-return]


def _h_tuple(dec: _Decoder, p: Any, depth: int, nid: int | None) -> tuple[Any, ...]:
    _expect(p, list, "$tuple")
    dec._length(p)
    return tuple(dec.value(v, depth) for v in p)


def _h_list(dec: _Decoder, p: Any, depth: int, nid: int | None) -> list[Any]:
    _expect(p, list, "$list")
    dec._length(p)
    out: list[Any] = dec.define(nid, [])
    for v in p:
        out.append(dec.value(v, depth))
    return out


def _h_dict(dec: _Decoder, p: Any, depth: int, nid: int | None) -> dict[Any, Any]:
    out: dict[Any, Any] = dec.define(nid, {})
    for k, v in dec.pairs(p, depth):
        out[k] = v
    return out


def _attrs(dec: _Decoder, obj: Any, attrs: Any, depth: int) -> None:
    _expect(attrs, dict, "attrs")
    for name, v in attrs.items():
        if not name.isidentifier() or name.startswith("__"):
            raise FormatError(f"attribute name {name!r} is not allowed")
        setattr(obj, name, dec.value(v, depth))


def _h_odict(dec: _Decoder, p: Any, depth: int, nid: int | None,
             cls: type[collections.OrderedDict[Any, Any]] = collections.OrderedDict) -> Any:
    f = _fields(p, {"items"}, {"attrs"}, "$odict")
    out = dec.define(nid, cls())
    for k, v in dec.pairs(f["items"], depth):
        out[k] = v
    _attrs(dec, out, f.get("attrs", {}), depth)
    return out


def _h_module(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Any:
    return _h_odict(dec, p, depth, nid, ModuleDict)


def _h_defaultdict(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Any:
    f = _fields(p, {"factory", "items"}, set(), "$defaultdict")
    factory = f["factory"]
    if factory is not None and factory not in _FACTORY_BY_NAME:
        raise FormatError(f"$defaultdict factory {factory!r} is not one of "
                          f"{sorted(_FACTORY_BY_NAME)}")
    out: collections.defaultdict[Any, Any] = dec.define(
        nid, collections.defaultdict(None if factory is None else _FACTORY_BY_NAME[factory]))
    for k, v in dec.pairs(f["items"], depth):
        out[k] = v
    return out


def _h_counter(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Any:
    out: collections.Counter[Any] = dec.define(nid, collections.Counter())
    for k, v in dec.pairs(p, depth):
        out[k] = v
    return out


def _h_deque(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Any:
    f = _fields(p, {"items", "maxlen"}, set(), "$deque")
    maxlen = f["maxlen"]
    if maxlen is not None and (type(maxlen) is not int or maxlen < 0):
        raise FormatError("$deque maxlen must be null or a non-negative int")
    _expect(f["items"], list, "$deque items")
    dec._length(f["items"])
    out: collections.deque[Any] = dec.define(nid, collections.deque(maxlen=maxlen))
    for v in f["items"]:
        out.append(dec.value(v, depth))
    return out


def _h_set(dec: _Decoder, p: Any, depth: int, nid: int | None) -> set[Any]:
    _expect(p, list, "$set")
    dec._length(p)
    out: set[Any] = dec.define(nid, set())
    for v in p:
        out.add(dec.key(v, depth))
    return out


def _h_frozenset(dec: _Decoder, p: Any, depth: int, nid: int | None) -> frozenset[Any]:
    _expect(p, list, "$frozenset")
    dec._length(p)
    return frozenset(dec.key(v, depth) for v in p)


def _h_slice(dec: _Decoder, p: Any, depth: int, nid: int | None) -> slice:
    _expect(p, list, "$slice")
    if len(p) != 3 or not all(x is None or type(x) is int for x in p):
        raise FormatError("$slice takes [start, stop, step] of ints or null")
    return slice(*p)


def _h_range(dec: _Decoder, p: Any, depth: int, nid: int | None) -> range:
    _expect(p, list, "$range")
    if len(p) != 3 or not all(type(x) is int for x in p) or p[2] == 0:
        raise FormatError("$range takes [start, stop, step] of ints, step not 0")
    return range(*p)


def _split_fold(p: Any, what: str) -> tuple[str, int]:
    _expect(p, str, what)
    if len(p) > 64:
        raise FormatError(f"{what}: too long")
    if p.endswith(";fold=1"):
        return p[:-7], 1
    return p, 0


def _check_tz(value: datetime.datetime | datetime.time) -> None:
    if value.tzinfo is not None and type(value.tzinfo) is not datetime.timezone:
        raise FormatError("only fixed UTC offsets are allowed")  # pragma: no cover


def _h_datetime(dec: _Decoder, p: Any, depth: int, nid: int | None) -> datetime.datetime:
    text, fold = _split_fold(p, "$datetime")
    value = datetime.datetime.fromisoformat(text).replace(fold=fold)
    _check_tz(value)
    return value


def _h_date(dec: _Decoder, p: Any, depth: int, nid: int | None) -> datetime.date:
    _expect(p, str, "$date")
    if len(p) > 16:
        raise FormatError("$date: too long")
    return datetime.date.fromisoformat(p)


def _h_time(dec: _Decoder, p: Any, depth: int, nid: int | None) -> datetime.time:
    text, fold = _split_fold(p, "$time")
    value = datetime.time.fromisoformat(text).replace(fold=fold)
    _check_tz(value)
    return value


def _h_timedelta(dec: _Decoder, p: Any, depth: int, nid: int | None) -> datetime.timedelta:
    _expect(p, list, "$timedelta")
    if len(p) != 3 or not all(type(x) is int for x in p):
        raise FormatError("$timedelta takes [days, seconds, microseconds]")
    return datetime.timedelta(days=p[0], seconds=p[1], microseconds=p[2])


def _h_namespace(dec: _Decoder, p: Any, depth: int, nid: int | None,
                 cls: type = argparse.Namespace) -> Any:
    _expect(p, dict, "$namespace")
    dec._length(p)
    out = dec.define(nid, cls())
    target = vars(out)
    for k, v in p.items():
        target[k] = dec.value(v, depth)
    return out


def _h_simplenamespace(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Any:
    return _h_namespace(dec, p, depth, nid, types.SimpleNamespace)


def _h_path(dec: _Decoder, p: Any, depth: int, nid: int | None) -> pathlib.PurePath:
    _expect(p, list, "$path")
    if len(p) != 2 or p[0] not in _PATHS or type(p[1]) is not str:
        raise FormatError(f"$path takes [kind, text] with kind one of {sorted(_PATHS)}")
    kind = p[0]
    cls: type[pathlib.PurePath] = _PATHS[kind]
    if kind in ("PosixPath", "Path") and sys.platform != "win32":
        cls = pathlib.Path if kind == "Path" else pathlib.PosixPath
    elif kind == "WindowsPath" and sys.platform == "win32":  # pragma: no cover
        cls = pathlib.WindowsPath
    elif kind == "Path":  # pragma: no cover
        cls = pathlib.Path
    return cls(p[1])


def _numpy_dtype(descr: Any) -> np.dtype[Any]:
    _expect(descr, str, "descr")
    if descr in _ML_DTYPES:
        return _ML_DTYPES[descr]
    if _DESCR.fullmatch(descr) is None:
        raise FormatError(f"NumPy dtype {descr!r} is not allowed")
    dt: np.dtype[Any] = np.dtype(descr)
    if dt.hasobject or dt.fields is not None or dt.itemsize == 0 or dt.itemsize > 65536:
        raise FormatError(f"NumPy dtype {descr!r} is not allowed")
    return dt


def _h_npdtype(dec: _Decoder, p: Any, depth: int, nid: int | None) -> np.dtype[Any]:
    return _numpy_dtype(p)


def _h_npscalar(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Any:
    f = _fields(p, {"dtype", "data"}, set(), "$npscalar")
    dt = _numpy_dtype(f["dtype"])
    raw = _b64decode(f["data"], "$npscalar data")
    if len(raw) != dt.itemsize:
        raise FormatError(f"$npscalar of {dt} holds {len(raw)} bytes")
    return np.frombuffer(raw, dtype=dt)[0]


def _h_objarray(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Any:
    f = _fields(p, {"shape", "items"}, set(), "$objarray")
    shape = _shape(f["shape"], dec.limits)
    _expect(f["items"], list, "$objarray items")
    if len(f["items"]) != math.prod(shape):
        raise FormatError(f"$objarray of shape {list(shape)} holds {len(f['items'])} items")
    out = dec.define(nid, np.empty(shape, dtype=object))
    flat = out.reshape(-1)
    for i, v in enumerate(f["items"]):
        flat[i] = dec.value(v, depth)
    return out


def _h_ndarray(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Any:
    f = _fields(p, {"name", "descr", "shape"}, {"fortran"}, "$ndarray")
    dt = _numpy_dtype(f["descr"])
    shape = _shape(f["shape"], dec.limits)
    st, eshape, begin, end = dec.entry(f["name"])
    typed = _TYPED_ARRAYS.get(f["descr"])
    nbytes = math.prod(shape) * dt.itemsize
    if typed is not None:
        want = _dtypes.by_torch_name(typed)
        assert want is not None
        if st != want.safetensors or eshape != shape:
            raise FormatError(f"array {f['name']!r}: the file holds {st} {list(eshape)}, the "
                              f"tree says {f['descr']} {list(shape)}")
    elif st != "U8" or eshape != (nbytes,):
        raise FormatError(f"array {f['name']!r}: expected U8 [{nbytes}] raw bytes, the file "
                          f"holds {st} {list(eshape)}")
    if end - begin != nbytes:
        raise FormatError(f"array {f['name']!r}: {end - begin} bytes for {nbytes}")
    arr: np.ndarray[Any, Any] = np.frombuffer(dec.bytes_of(begin, end), dtype=dt).reshape(
        shape) if nbytes else np.empty(shape, dtype=dt)
    if f.get("fortran", False) is True:
        arr = np.asfortranarray(arr)
    elif dec.copy or not nbytes:
        arr = np.array(arr)
    if not dec.copy:
        arr.flags.writeable = False
    return arr


def _h_tensor(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Any:
    f = _fields(p, {"dtype", "shape"}, {"name", "requires_grad", "parameter", "raw", "device",
                                        "skipped"}, "$tensor")
    dtype = _dtypes.by_torch_name(f["dtype"]) if isinstance(f["dtype"], str) else None
    if dtype is None:
        raise FormatError(f"unknown torch dtype {f['dtype']!r}")
    shape = _shape(f["shape"], dec.limits)
    flags = {k: f.get(k, False) for k in ("requires_grad", "parameter", "raw")}
    if not all(type(v) is bool for v in flags.values()):
        raise FormatError("requires_grad, parameter and raw are booleans")
    if "device" in f and not isinstance(f["device"], str):
        raise FormatError("device is a str")
    if "skipped" in f:
        if "name" in f or not isinstance(f["skipped"], str):
            raise FormatError("a skipped tensor has a reason and no name")
        return UnsupportedTensor(f"skipped when converted: {f['skipped']}")
    if "name" not in f:
        raise FormatError("$tensor: missing ['name']")
    st, eshape, begin, end = dec.entry(f["name"])
    nbytes = math.prod(shape) * dtype.itemsize
    if flags["raw"]:
        if st != "U8" or eshape != (nbytes,):
            raise FormatError(f"tensor {f['name']!r}: expected U8 [{nbytes}] raw bytes, the "
                              f"file holds {st} {list(eshape)}")
    elif dtype.safetensors is None or st != dtype.safetensors or eshape != shape:
        raise FormatError(f"tensor {f['name']!r}: the file holds {st} {list(eshape)}, the "
                          f"tree says {dtype.name} {list(shape)}")
    if end - begin != nbytes:  # pragma: no cover - read_header checks entry sizes
        raise FormatError(f"tensor {f['name']!r}: {end - begin} bytes for {nbytes}")
    view = dec.bytes_of(begin, end)
    storage = Storage(f["name"], dtype, nbytes, lambda: view)
    stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    t = Tensor(storage, dtype, shape, stride, 0, requires_grad=flags["requires_grad"],
               is_parameter=flags["parameter"])
    if dec.on_tensor is not None:
        return dec.on_tensor(t, f)
    return dec.leaf(t)


def to_torch(t: Tensor, torch: Any) -> Any:
    """A writable torch tensor (or Parameter) with ``t``'s dtype, shape, values and flags."""
    tdtype = getattr(torch, t.dtype.name, None)
    if not isinstance(tdtype, torch.dtype):
        raise UnsupportedError(f"this torch has no dtype {t.dtype.name}")
    if t.numel:
        if t.is_contiguous() and not t.storage.streams and (
                t.storage.byteorder == "little" or t.dtype.itemsize == 1):
            begin = t.storage_offset * t.dtype.itemsize
            raw = bytearray(t.storage.buffer()[begin:begin + t.nbytes])
        else:
            from ._safetensors import chunks  # contiguous little-endian bytes
            raw = bytearray(b"".join(bytes(c) for c in chunks(t)))
        out = torch.frombuffer(raw, dtype=torch.uint8).view(tdtype).reshape(t.shape)
    else:
        out = torch.empty(t.shape, dtype=tdtype)
    if t.is_parameter:
        return torch.nn.Parameter(out, requires_grad=t.requires_grad)
    if t.requires_grad:
        out.requires_grad_(True)
    return out


def _h_dtype(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Any:
    dtype = _dtypes.by_torch_name(p) if isinstance(p, str) else None
    if dtype is None:
        raise FormatError(f"unknown torch dtype {p!r}")
    if dec.torch is not None:
        found = getattr(dec.torch, dtype.name, None)
        if isinstance(found, dec.torch.dtype):
            return found
    return dtype


def _h_device(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Any:
    _expect(p, str, "$device")
    if not re.fullmatch(r"[a-z_]{1,32}(:[0-9]{1,6})?", p):
        raise FormatError(f"bad device {p!r}")
    return dec.torch.device(p) if dec.torch is not None else p


def _h_size(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Any:
    _expect(p, list, "$size")
    if not all(type(x) is int for x in p):
        raise FormatError("$size takes ints")
    return dec.torch.Size(p) if dec.torch is not None else tuple(p)


def _h_global(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Global:
    if not isinstance(p, list) or len(p) != 2 or not all(type(x) is str for x in p):
        raise FormatError("$global takes [module, name]")
    return Global(p[0], p[1])


def _h_opaque(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Opaque:
    f = _fields(p, {"callable", "args", "kwargs", "newobj", "items", "dict_items"}, {"state"},
                "$opaque")
    if type(f["newobj"]) is not bool:
        raise FormatError("$opaque newobj is a bool")
    record: Opaque = dec.define(nid, Opaque(None, (), newobj=f["newobj"]))
    record.callable = dec.value(f["callable"], depth)
    _expect(f["args"], list, "$opaque args")
    record.args = tuple(dec.value(v, depth) for v in f["args"])
    if f["kwargs"] is not None:
        record.kwargs = dict(dec.pairs(f["kwargs"], depth))
    if "state" in f:
        record.state = dec.value(f["state"], depth)
    _expect(f["items"], list, "$opaque items")
    record.items = [dec.value(v, depth) for v in f["items"]]
    record.dict_items = list(dec.pairs(f["dict_items"], depth))
    return record


def _h_obj(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Any:
    f = _fields(p, {"type", "state"}, set(), "$obj")
    name = f["type"]
    _expect(name, str, "$obj type")
    entry = dec.types.by_name(name)
    if entry is None:
        module, _, qual = name.partition(":")
        record: Opaque = dec.define(nid, Opaque(Global(module, qual) if qual else
                                                Global(name, ""), (), newobj=True))
        record.state = dec.value(f["state"], depth)
        return record
    state = dec.value(f["state"], depth)
    return entry.decode(state)


def _h_unsupported(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Any:
    f = _fields(p, {"kind"}, set(), "$unsupported")
    _expect(f["kind"], str, "$unsupported kind")
    return UnsupportedTensor(f["kind"])


_HANDLERS: dict[str, Callable[[_Decoder, Any, int, int | None], Any]] = {
    "$int": _h_int, "$float": _h_float, "$complex": _h_complex, "$bytes": _h_bytes,
    "$bytearray": _h_bytearray, "$tuple": _h_tuple, "$list": _h_list, "$dict": _h_dict,
    "$odict": _h_odict, "$module": _h_module, "$defaultdict": _h_defaultdict,
    "$counter": _h_counter, "$deque": _h_deque, "$set": _h_set, "$frozenset": _h_frozenset,
    "$slice": _h_slice, "$range": _h_range, "$datetime": _h_datetime, "$date": _h_date,
    "$time": _h_time, "$timedelta": _h_timedelta, "$namespace": _h_namespace,
    "$simplenamespace": _h_simplenamespace, "$path": _h_path, "$tensor": _h_tensor,
    "$ndarray": _h_ndarray, "$objarray": _h_objarray, "$npscalar": _h_npscalar,
    "$npdtype": _h_npdtype, "$dtype": _h_dtype, "$device": _h_device, "$size": _h_size,
    "$global": _h_global, "$opaque": _h_opaque, "$obj": _h_obj,
    "$unsupported": _h_unsupported,
}


def plain(entries: Entries, data: memoryview, *, tensors: TensorMode = "numpy",
          copy: bool = False) -> dict[str, Any]:
    """The tensors of a safetensors file with no tree, by name in file order."""
    dec = _Decoder(entries, data, tensors, default_types, Limits(), copy, None)
    by_st = {d.safetensors: d for d in _dtypes.DTYPES if d.safetensors is not None}
    out: dict[str, Any] = {}
    for name, (st, shape, begin, end) in entries.items():
        dtype = by_st[st]
        view = data[begin:end]
        storage = Storage(name, dtype, end - begin, lambda v=view: v)  # type: ignore[misc]
        stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
        out[name] = dec.leaf(Tensor(storage, dtype, shape, stride, 0))
    return out


def decode(metadata: Mapping[str, str], entries: Entries, data: memoryview, *,
           tensors: TensorMode = "numpy", types: TypeRegistry | None = None,
           limits: Limits | None = None, copy: bool = False,
           on_tensor: Callable[[Tensor, dict[str, Any]], Any] | None = None) -> Any:
    """The object an inert file holds, from its safetensors header and data section."""
    version = metadata.get(FORMAT_KEY)
    if version != VERSION:
        raise FormatError(f"inert format version {version!r} is not supported (this reader "
                          f"reads version {VERSION})")
    text = metadata.get(TREE_KEY)
    if not isinstance(text, str):
        raise FormatError(f"the file has no {TREE_KEY!r} in its metadata")
    lim = limits if limits is not None else Limits()
    tree = parse_tree(text, lim)
    dec = _Decoder(entries, data, tensors, types if types is not None else default_types,
                   lim, copy, on_tensor)
    try:
        return dec.value(tree, 0)
    except RecursionError:
        raise LimitError("max_depth", lim.max_depth, sys.getrecursionlimit(),
                         "nested tree values") from None
