"""The writing half of the inert format (``docs/inert-format.md``): an object graph to a
JSON tree and the tensors it references."""

from __future__ import annotations

import argparse
import base64
import collections
import copyreg
import datetime
import json
import math
import pathlib
import struct
import types
import zoneinfo
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from torchless.core import dtypes as _dtypes
from torchless.core.dtypes import DType, StorageType
from torchless.core.limits import Limits
from torchless.core.ndarrays import is_ndarray, loaded_numpy
from torchless.errors import ConversionError, LimitError
from torchless.inert.schema import (
    _DESCR,
    _FACTORIES,
    _SAFE_INT,
    _TYPED_ARRAYS,
    _UINT8,
    TypeRegistry,
    _torch,
    default_types,
)
from torchless.inert.setorder import member_key
from torchless.model.graph import ModuleDict
from torchless.model.interop import torch_to_record
from torchless.model.kinds import TensorRecord
from torchless.model.tensor import Storage, Tensor, UnsupportedTensor
from torchless.model.walk import (
    MODULE_DICTS,
    arg_names,
    children,
    entry_name,
    is_module_state,
    key_text,
)
from torchless.pickle.values import NOTSET, Global, Opaque
from torchless.rules.stdlib import system_zone
from torchless.write.safetensors import MAX_HEADER_BYTES

__all__ = ["Encoder"]


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
    for name, known in _dtypes.ml_dtypes_by_name().items():
        if dt == known:
            return name
    s: str = dt.str
    if dt.hasobject or dt.fields is not None or dt.subdtype is not None:
        raise ConversionError(f"cannot store NumPy dtype {dt} (object or structured)")
    m = _DESCR.fullmatch(s)
    if m is None or dt.itemsize == 0:
        raise ConversionError(f"cannot store NumPy dtype {dt}")
    return s


class Encoder:
    """One object graph to a JSON tree and the tensors it references.

    ``names`` gives tensors of a checkpoint (by id) the safetensors names they are written
    under, ``skipped`` the reason for those deliberately left out; any other tensor or array
    gets a name from its path in the object. ``dtypes`` gives named tensors written as another
    dtype (a ``--dtype`` cast) that dtype."""

    def __init__(self, *, types: TypeRegistry | None = None, limits: Limits | None = None,
                 names: Mapping[int, str] | None = None,
                 skipped: Mapping[int, str] | None = None,
                 reserved: Iterable[str] = (), records: bool = True,
                 dtypes: Mapping[int, DType] | None = None) -> None:
        self.types = types if types is not None else default_types
        self.limits = limits if limits is not None else Limits()
        self.names = dict(names or {})
        self.skipped = dict(skipped or {})
        self.dtypes = dict(dtypes or {})
        self.reserved = set(reserved)           # names taken by entries written beside
        self.records = records                  # sparse … tensors with their parts, or named
        self.tensors: dict[str, Tensor] = {}
        self.opaque: dict[str, int] = {}        # class path -> count, for warnings
        #: Of those, the live objects of classes ``types`` does not know, turned into
        #: records here (an ``Opaque`` passed in was a record already): save warns of them.
        self.lowered: dict[str, int] = {}
        self._counts: dict[int, int] = {}
        self._ids: dict[int, int] = {}
        self._active: set[int] = set()
        #: module records' ``__dict__`` states: their ``_parameters``, ``_buffers`` and
        #: ``_modules`` add no segment to the names below them, as in the walker's names
        self._module_states: set[int] = set()
        self._lowered: dict[int, Any] = {}      # registered state / Opaque record, by id
        self._records: dict[int, TensorRecord | None] = {}  # of torch tensors, by id
        self._parts: set[int] = set()           # torch tensors that are a record's parts
        self._next_id = 0
        #: Characters of text (strings, names, numbers as text) the tree may still take: a
        #: safetensors header holds at most MAX_HEADER_BYTES, and one string a file holds
        #: once may be referenced thousands of times (written each time).
        self._text_left = MAX_HEADER_BYTES
        self._keep: list[Any] = []              # objects made while encoding, kept alive
        self._torch = _torch()

    def encode(self, root: Any) -> str:
        """The tree as JSON text. A ``str`` holding a lone surrogate (bytes a program decoded
        with ``surrogateescape``, a path from ``sys.argv``) cannot be UTF-8: the text then
        escapes every non-ASCII character, which JSON reads back as the same ``str``."""
        self._count(root)
        tree = self._value(root, "", 0)
        text = json.dumps(tree, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                text = json.dumps(tree, separators=(",", ":"), allow_nan=False)
        return text

    # -- what a value is ------------------------------------------------------------------

    def _atom(self, obj: Any, path: str) -> Any:
        """The node of a value without identity, or ``_NOT_ATOM``."""
        kind = type(obj)
        if kind is Tensor or kind is dict or kind is list:  # most nodes: no test below holds
            return _NOT_ATOM
        if obj is None or obj is True or obj is False:
            return obj
        if type(obj) is str:
            self._spend(len(obj), path)
            return obj
        if type(obj) is int:
            if -_SAFE_INT <= obj <= _SAFE_INT:
                return obj
            if obj.bit_length() > 14_000:  # more than 4,215 decimal digits: maybe too many
                text = _digits(obj, self.limits.max_int_digits, path)
            else:
                text = str(obj)
            self._spend(len(text), path)
            return {"$int": text}
        if type(obj) is float:
            return _float(obj)
        if type(obj) is bytes:
            self._spend(len(obj) * 4 // 3, path)
            return {"$bytes": _b64(obj)}
        if type(obj) is complex:
            return {"$complex": [_float(obj.real), _float(obj.imag)]}
        if isinstance(obj, DType):
            return {"$dtype": obj.name}
        if obj is Ellipsis or obj is NotImplemented:
            return {"$const": "Ellipsis" if obj is Ellipsis else "NotImplemented"}
        if isinstance(obj, StorageType):
            return {"$global": ["torch", obj.name]}
        if isinstance(obj, Global):
            self._spend(len(obj.module) + len(obj.name), path)
            return {"$global": [obj.module, obj.name]}
        if isinstance(obj, UnsupportedTensor) and not (
                self.records and isinstance(obj, TensorRecord)):
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
            text = str(obj)
            again = type(obj)(text)
            if again != obj or str(again) != text:  # e.g. PureWindowsPath("//:/") on 3.11
                raise ConversionError(f"{path or 'the object'}: cannot store the path "
                                      f"{obj!r}: pathlib reads its text {text!r} back as "
                                      f"{again!r}")
            return {"$path": [type(obj).__name__, text]}
        numpy = loaded_numpy()  # no NumPy value exists before it is imported
        if numpy is not None and isinstance(obj, numpy.generic):
            if obj.dtype.itemsize == 0 and obj.dtype.kind in "SU":
                # np.str_("") / np.bytes_(b""): one NUL character reads back as the same
                # empty scalar (NumPy strips trailing NULs), where no descr has size 0
                one = obj.dtype.str[:-1] + "1"
                return {"$npscalar": {"dtype": one,
                                      "data": _b64(bytes(numpy.dtype(one).itemsize))}}
            return {"$npscalar": {"dtype": _descr(obj.dtype),
                                  "data": _b64(numpy.asarray(obj).tobytes())}}
        if numpy is not None and isinstance(obj, numpy.dtype):
            return {"$npdtype": _descr(obj)}
        t = self._torch
        if t is not None:
            if isinstance(obj, t.dtype):
                return {"$dtype": str(obj).removeprefix("torch.")}
            if isinstance(obj, t.device):
                return {"$device": str(obj)}
            if isinstance(obj, t.Size):
                return {"$size": list(obj)}
        if type(obj) in (tuple, frozenset) and not obj:
            return {"$tuple" if type(obj) is tuple else "$frozenset": []}
        return _NOT_ATOM

    def _spend(self, chars: int, path: str) -> None:
        self._text_left -= chars
        if self._text_left < 0:
            raise ConversionError(
                f"{path or 'the object'}: the object tree would hold more than "
                f"{MAX_HEADER_BYTES} characters of text, more than a safetensors header "
                "holds (a file can reference one long string thousands of times)",
                hint="convert the tensors alone: --no-tree (tree=False)")

    def _record(self, obj: Any) -> TensorRecord | None:
        """A record, or the record of a torch tensor that is not one strided array (made
        once per tensor, so both passes see the same parts)."""
        if isinstance(obj, TensorRecord):
            return obj
        t = self._torch
        if t is None or not isinstance(obj, t.Tensor):
            return None
        k = id(obj)
        if k not in self._records:
            record = self._records[k] = torch_to_record(obj, t)
            if record is not None:  # its parts: torch.save keeps no attributes of theirs
                stack: list[Any] = [record.fields]
                while stack:
                    v = stack.pop()
                    if isinstance(v, t.Tensor):
                        self._parts.add(id(v))
                    elif isinstance(v, (dict, list, tuple)):
                        stack.extend(v.values() if isinstance(v, dict) else v)
        return self._records[k]

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
        return type(obj) in _CONTAINER_TYPES or isinstance(obj, Opaque) or is_ndarray(obj) or (
            self._is_tensor(obj))

    # -- pass 1: how often each object is reached -----------------------------------------

    def _count(self, root: Any) -> None:
        stack: list[tuple[Any, str]] = [(root, "")]
        counts = self._counts
        while stack:
            obj, path = stack.pop()
            if type(obj) is Tensor and not obj.attrs:  # a leaf (most nodes): what follows,
                k = id(obj)                           # without the tests that fail for it
                n = counts.get(k, 0)
                counts[k] = n + 1
                if not n:
                    self._keep.append(obj)
                continue
            if self._atom(obj, path) is not _NOT_ATOM:
                continue
            k = id(obj)
            n = self._counts.get(k, 0)
            self._counts[k] = n + 1
            if n:
                continue
            self._keep.append(obj)
            record = self._record(obj)
            if record is not None:
                stack.append((record.fields, path))
            elif self._structural(obj):
                stack.extend((c, path) for _, c in children(obj))
                if self._is_tensor(obj) and not isinstance(obj, Tensor) and (
                        id(obj) not in self._parts):
                    stack.extend((c, path) for c in (_attr(obj, "dict") or {}).values())
            elif self.types.by_type(type(obj)) is not None:
                stack.append((self._lower(obj, path), path))
            elif not isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
                stack.extend((c, path) for _, c in children(self._lower(obj, path)))

    # -- pass 2: the tree -----------------------------------------------------------------

    def _value(self, obj: Any, path: str, depth: int) -> Any:
        if depth > self.limits.max_depth:
            raise LimitError("max_depth", self.limits.max_depth, depth,
                             "nested values in the object to save")
        if len(path) > self.limits.max_name_bytes:  # long keys down a deep chain
            raise LimitError("max_name_bytes", self.limits.max_name_bytes, len(path),
                             "the path of a value in the object to save")
        k = id(obj)
        if type(obj) is Tensor and not obj.attrs and self._counts.get(k, 0) <= 1:
            return {"$tensor": self._tensor(obj, path, depth + 1)}  # a leaf seen once
        atom = self._atom(obj, path)
        if atom is not _NOT_ATOM:
            return atom
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

    def _pairs(self, items: Any, path: str, d: int, *, keys: bool = True) -> list[list[Any]]:
        """``[key, value]`` pairs; ``keys``: the keys are a mapping's (checked as
        :meth:`_hashable` says), not an opaque record's ``__setitem__`` arguments."""
        return [[self._value(self._hashable(k, path) if keys else k, path, d),
                 self._value(v, _segment(path, entry_name(i, k)), d)]
                for i, (k, v) in enumerate(items)]

    def _hashable(self, key: Any, path: str) -> Any:
        """``key``, a dict key or set member, if it reads back hashable: a tensor (an array
        when read), also inside a tuple or frozenset, does not."""
        if type(key) is str or type(key) is int:
            return key
        stack, seen = [key], set()
        while stack:
            k = stack.pop()
            if id(k) in seen:  # a key shares its parts freely: each is looked at once
                continue
            seen.add(id(k))
            if self._is_tensor(k) or is_ndarray(k) or isinstance(k, TensorRecord):
                raise ConversionError(
                    f"{path or 'the object'}: a dict key or set member holds a tensor, which "
                    "the inert format cannot hold there (it reads back as an array, which is "
                    "not hashable)", hint="convert the tensors alone: --no-tree "
                                          "(tree=False)")
            if type(k) is tuple or type(k) is frozenset:
                stack.extend(k)
        return key


    def _node(self, obj: Any, path: str, d: int, shared: bool) -> Any:
        record = self._record(obj)
        if record is not None:
            return {"$record": {"kind": record.kind,
                                "fields": self._value(record.fields, path, d)}}
        if self._is_tensor(obj):
            return {"$tensor": self._tensor(obj, path, d)}
        if is_ndarray(obj):
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
            record = self._lower(obj, path)
            self.lowered[record.class_path] = self.lowered.get(record.class_path, 0) + 1
            return {"$opaque": self._opaque(record, path, d)}
        if kind is list:
            items = [self._value(v, _join(path, i), d) for i, v in enumerate(obj)]
            return {"$list": items} if shared else items
        if kind is tuple:
            return {"$tuple": [self._value(v, _join(path, i), d) for i, v in enumerate(obj)]}
        if kind is dict:
            if not shared and all(type(k) is str and not k.startswith("$") for k in obj):
                self._spend(sum(len(k) for k in obj), path)
                module = id(obj) in self._module_states
                return {k: self._value(v, path if module and k in MODULE_DICTS
                                       else _join(path, k), d) for k, v in obj.items()}
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
            return {"$set" if kind is set else "$frozenset": [
                self._value(self._hashable(v, path), path, d)
                for v in sorted(obj, key=member_key)]}
        if kind is bytearray:
            return {"$bytearray": _b64(obj)}
        tag = "$namespace" if kind is argparse.Namespace else "$simplenamespace"
        return {tag: {str(k): self._value(v, _join(path, k), d) for k, v in vars(obj).items()}}

    def _opaque(self, obj: Opaque, path: str, d: int) -> dict[str, Any]:
        self.opaque[obj.class_path] = self.opaque.get(obj.class_path, 0) + 1
        body: dict[str, Any] = {
            "callable": self._value(obj.callable, path, d),
            "args": [self._value(v, _segment(path, n) if n else path, d)
                     for n, v in zip(arg_names(obj), obj.args, strict=True)],
            "kwargs": None if obj.kwargs is None else self._pairs(
                obj.kwargs.items(), _segment(path, "kwargs"), d),
            "newobj": obj.newobj,
            "items": [self._value(v, _join(path, i), d) for i, v in enumerate(obj.items)],
            "dict_items": self._pairs(obj.dict_items, path, d, keys=False)}
        if obj.state is not NOTSET:
            if is_module_state(obj.state):
                self._module_states.add(id(obj.state))
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
            module = _attr(obj, "module") or type(obj).__module__
            return Opaque(Global(module, rv))
        if not isinstance(rv, tuple) or not 2 <= len(rv) <= 6:
            raise ConversionError(f"{where}: cannot store a {type(obj).__qualname__}")
        func, args, *rest = rv
        state, listitems, dictitems = [*rest, None, None, None][:3]
        if func is copyreg.__newobj__:  # type: ignore[attr-defined]
            record = Opaque(Global(*_global_name(args[0], where)), tuple(args[1:]),
                            newobj=True)
        elif func is copyreg.__newobj_ex__:  # type: ignore[attr-defined]
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
        while name in self.tensors or name in self.reserved or name == "__metadata__":
            n += 1
            name = f"{base}~{n}"
        return name

    def _tensor(self, obj: Any, path: str, d: int) -> dict[str, Any]:
        if not isinstance(obj, Tensor):
            return self._torch_tensor(obj, path, d)
        name = self.names.get(id(obj))
        # named already (the usual case): the node is built with its name first, in one dict
        body: dict[str, Any] = {"dtype": obj.dtype.name, "shape": list(obj.shape)} \
            if name is None else {"name": name,
                                  "dtype": self.dtypes.get(id(obj), obj.dtype).name,
                                  "shape": list(obj.shape)}
        if obj.requires_grad:
            body["requires_grad"] = True
        if obj.is_parameter:
            body["parameter"] = True
        if obj.is_storage:
            body["storage"] = True
        if obj.storage.location != "cpu":
            body["device"] = obj.storage.location
        if obj.attrs:
            body["attrs"] = {k: self._value(v, _join(path, k), d) for k, v in obj.attrs.items()}
        if name is not None:
            return body
        if id(obj) in self.skipped:
            return {"skipped": self.skipped[id(obj)], **body}
        name = self._name(path)
        if obj.dtype.safetensors is None:  # its bytes, as U8
            import numpy as np

            from torchless.model.chunks import chunks

            raw = np.frombuffer(b"".join(bytes(c) for c in chunks(obj)), np.uint8)
            self.tensors[name] = _memory_tensor(name, raw, _UINT8, (raw.size,))
            body["raw"] = True
        else:
            self.tensors[name] = obj
        return {"name": name, **body}

    def _torch_tensor(self, obj: Any, path: str, d: int) -> dict[str, Any]:
        torch = self._torch
        dtype = _dtypes.by_torch_name(str(obj.dtype).removeprefix("torch."))
        where = path or "the object"
        if dtype is None:
            raise ConversionError(f"{where}: cannot store a tensor of {obj.dtype}")
        if obj.layout != torch.strided or obj.is_quantized or obj.device.type == "meta" or (
                obj.is_nested):
            raise ConversionError(f"{where}: cannot store a {obj.layout} / quantized / nested "
                                  "/ meta tensor")
        body: dict[str, Any] = {"dtype": dtype.name, "shape": list(obj.shape)}
        if obj.requires_grad:
            body["requires_grad"] = True
        if isinstance(obj, torch.nn.Parameter):
            body["parameter"] = True
        if obj.device.type != "cpu":
            body["device"] = str(obj.device)
        attrs = {} if id(obj) in self._parts else _torch_attrs(obj, where)
        if attrs:
            body["attrs"] = {k: self._value(v, _join(path, k), d) for k, v in attrs.items()}
        import numpy as np

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
        import numpy as np

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


def _memory_tensor(name: str, raw: np.ndarray[Any, Any], dtype: DType,
                   shape: tuple[int, ...]) -> Tensor:
    """A contiguous tensor over bytes in memory; dtypes safetensors cannot name go as U8."""
    buf = memoryview(raw.data).cast("B") if raw.size else memoryview(b"")
    storage = Storage(name, dtype, len(buf), lambda: buf)
    stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    return Tensor(storage, dtype, shape, stride, 0)


def _torch_attrs(t: Any, where: str) -> dict[str, Any]:
    """The Python attributes set on a torch tensor (``p._is_hf_initialized = True``), which
    ``torch.save`` keeps; their names as the format requires (section 2.5)."""
    attrs: dict[str, Any] = _attr(t, "dict") or {}
    for k in attrs:
        if not (isinstance(k, str) and k.isidentifier() and not k.startswith("__")):
            raise ConversionError(f"{where or 'the object'}: cannot store the tensor "
                                  f"attribute {k!r} (not an identifier, or starts with '__')")
    return attrs


def _join(path: str, key: str | int) -> str:
    """The name of the value under ``key`` (an attribute name or an index) of the value at
    ``path``, as :func:`torchless.model.walk.children` names it."""
    return _segment(path, key if type(key) is str else key_text(key))


def _segment(path: str, segment: str) -> str:
    return f"{path}.{segment}" if path else segment


#: The longest name of a fixed-offset time zone (``timezone(offset, name)``) stored.
_MAX_TZNAME = 255


def _iso(obj: datetime.datetime | datetime.time) -> str:
    zone = ""
    tz = obj.tzinfo
    if isinstance(obj, datetime.datetime) and type(tz) is zoneinfo.ZoneInfo \
            and tz.key is not None and system_zone(tz.key) is tz:
        zone = f";zone={tz.key}"
    elif tz is not None and type(tz) is not datetime.timezone:
        raise ConversionError(f"cannot store a time zone of type {type(tz).__name__} "
                              "(only fixed UTC offsets and IANA zones by name)")
    elif tz is not None:
        name = tz.tzname(None)
        offset = tz.utcoffset(None)
        if name != datetime.timezone(offset).tzname(None):  # timezone(offset, name)
            if len(name) > _MAX_TZNAME:
                raise ConversionError(f"cannot store a time zone name of {len(name)} "
                                      f"characters (at most {_MAX_TZNAME})")
            zone = f";tzname={name}"
    text = obj.isoformat()
    return text + (";fold=1" if obj.fold else "") + zone


def _digits(value: int, limit: int, path: str) -> str:
    try:
        text = str(value)
    except ValueError:  # Python's own int-to-str guard
        text = ""
    if not text or len(text.lstrip("-")) > limit:
        raise ConversionError(f"{path or 'the object'}: an integer of more than {limit} "
                              "digits (Limits.max_int_digits)")
    return text


def _attr(obj: Any, which: str) -> Any:
    """``obj.__module__`` / ``__qualname__`` / ``__name__`` / ``__self__`` / ``__dict__``
    of a live object, or None."""
    try:
        if which == "module":
            return obj.__module__
        if which == "self":
            return obj.__self__
        if which == "dict":
            return obj.__dict__
        return obj.__qualname__ if which == "qualname" else obj.__name__
    except AttributeError:
        return None


def _global_name(obj: Any, where: str) -> tuple[str, str]:
    module = _attr(obj, "module")
    qual = _attr(obj, "qualname") or _attr(obj, "name")
    owner = _attr(obj, "self")
    if module is None and isinstance(owner, type):
        # a classmethod of a C type (ZoneInfo._unpickle, what a bare ZoneInfo reduces to):
        # no module of its own, its class's
        module = owner.__module__
    if not isinstance(module, str) or not isinstance(qual, str) or "<" in qual:
        raise ConversionError(f"{where}: cannot store {obj!r}: it has no importable name "
                              "(a lambda or a local class or function)")
    return module, qual


