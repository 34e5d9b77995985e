"""The reading half of the inert format (``docs/inert-format.md``): a tree back to the
object, building only the data types the specification lists. Nothing read is ever imported,
looked up or called: class names stay inert records unless the loading program registered a
decoder for them."""

from __future__ import annotations

import argparse
import base64
import binascii
import collections
import datetime
import json
import math
import pathlib
import re
import struct
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from torchless.core import dtypes as _dtypes
from torchless.core.limits import Limits
from torchless.errors import CheckpointError, FormatError, LimitError, type_phrase
from torchless.inert.schema import (
    _DESCR,
    _FACTORY_BY_NAME,
    _PATHS,
    _SAFE_INT,
    _TYPED_ARRAYS,
    FORMAT_KEY,
    TREE_KEY,
    VERSION,
    Entries,
    TensorMode,
    TypeRegistry,
    _torch,
    default_types,
)
from torchless.model.graph import ModuleDict
from torchless.model.interop import record_to_torch, to_torch, torch_dtypes
from torchless.model.kinds import KINDS, TensorRecord
from torchless.model.tensor import Storage, Tensor, UnsupportedTensor, with_attrs
from torchless.pickle.keycost import KeyCost
from torchless.pickle.values import Global, Opaque
from torchless.rules.policy import PYTHON_CONSTANTS
from torchless.rules.stdlib import system_zone

__all__ = ["decode", "parse_tree", "plain"]


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
        self.keycost = KeyCost(limits)          # the work of hashing keys
        self.torch = _torch() if mode == "torch" else None
        if mode == "torch" and self.torch is None:
            from torchless.torch import _import_torch

            self.torch = _import_torch("framework='pt'")

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
        if type(k) is tuple:
            self.keycost.spend(self.keycost.measure(k))
        try:
            hash(k)
        except TypeError:
            raise FormatError(f"{type_phrase(k)} cannot be a dict key or set member"
                              ) from None
        return k

    def pairs(self, payload: Any, depth: int, *, keys: bool = True
              ) -> Iterator[tuple[Any, Any]]:
        """``[key, value]`` pairs; ``keys``: a mapping's, so hashable (an opaque record's
        ``dict_items`` are ``__setitem__`` arguments: any value)."""
        _expect(payload, list, "pairs")
        self._length(payload)
        for pair in payload:
            if not isinstance(pair, list) or len(pair) != 2:
                raise FormatError("expected [key, value] pairs")
            key = self.key(pair[0], depth) if keys else self.value(pair[0], depth)
            yield key, self.value(pair[1], depth)

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
        return with_attrs(np.array(arr) if self.copy else arr, t)


def _expect(value: Any, kind: type | tuple[type, ...], what: str) -> None:
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        expected = kind.__name__ if isinstance(kind, type) else kind
        raise FormatError(f"{what}: expected {expected}, got "
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
    digits = len(p.lstrip("-"))
    if digits > dec.limits.max_int_digits:
        raise LimitError("max_int_digits", dec.limits.max_int_digits, digits, "a $int")
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


#: Attributes of an OrderedDict an ``attrs`` entry may not shadow (its methods).
_ODICT_NAMES = frozenset(dir(collections.OrderedDict))


def _attrs(dec: _Decoder, obj: Any, attrs: Any, depth: int) -> None:
    _expect(attrs, dict, "attrs")
    for name, v in attrs.items():
        if not name.isidentifier() or name.startswith("__") or name in _ODICT_NAMES:
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


def _split_fold(p: Any, what: str) -> tuple[str, int, str | None, str | None]:
    """ISO text, its fold, the IANA zone named after it (``$datetime`` only) and the name
    of its fixed offset (``timezone(offset, name)``), which comes last."""
    _expect(p, str, what)
    if len(p) > 64 + 9 + 255:
        raise FormatError(f"{what}: too long")
    tzname = None
    if ";tzname=" in p:
        p, tzname = p.split(";tzname=", 1)
    zone = None
    if what == "$datetime" and ";zone=" in p:
        p, zone = p.split(";zone=", 1)
    if len(p) > 64 or (tzname is not None and (len(tzname) > 255 or zone is not None)):
        raise FormatError(f"{what}: too long, or both a zone and a time zone name")
    if p.endswith(";fold=1"):
        return p[:-7], 1, zone, tzname
    return p, 0, zone, tzname


_OFFSET = re.compile(r"(.*?)(?:([+-])(\d\d):(\d\d)(?::(\d\d)(?:\.(\d{6}))?)?|(Z))")


def _split_offset(text: str) -> tuple[str, datetime.timezone | None]:
    """The text before a UTC offset and the offset (parsed here: Python 3.11's
    fromisoformat drops the microseconds of some sub-second offsets)."""
    m = _OFFSET.fullmatch(text)
    if m is None or (m.group(2) is None and m.group(7) is None):
        return text, None
    if m.group(7):
        return m.group(1), datetime.timezone.utc
    sign = -1 if m.group(2) == "-" else 1
    delta = datetime.timedelta(hours=int(m.group(3)), minutes=int(m.group(4)),
                               seconds=int(m.group(5) or 0),
                               microseconds=int(m.group(6) or 0))
    return m.group(1), datetime.timezone(sign * delta)


def _clock(p: Any, tag: str, cls: type[datetime.datetime] | type[datetime.time]) -> Any:
    """A $datetime or $time: ISO text, our own parse of its UTC offset, and its fold."""
    text, fold, zone, tzname = _split_fold(p, tag)
    naive, tz = _split_offset(text)
    value = cls.fromisoformat(naive)
    if value.tzinfo is not None:
        raise FormatError(f"bad {tag} {p!r}")
    if tzname is not None:
        if tz is None:
            raise FormatError(f"{tag} {p!r} names its time zone but has no UTC offset")
        offset = tz.utcoffset(None)
        assert offset is not None
        tz = datetime.timezone(offset, tzname)
    if zone is not None:
        if tz is None:
            raise FormatError(f"{tag} {p!r} names a zone but has no UTC offset")
        named = system_zone(zone)
        if named is not None:  # else the fixed offset it had, which the text keeps
            return value.replace(tzinfo=named, fold=fold)
    return value.replace(tzinfo=tz, fold=fold)


def _h_datetime(dec: _Decoder, p: Any, depth: int, nid: int | None) -> datetime.datetime:
    if not isinstance(p, str) or "T" not in p:
        raise FormatError("$datetime needs a date and a time")
    value: datetime.datetime = _clock(p, "$datetime", datetime.datetime)
    return value


def _h_date(dec: _Decoder, p: Any, depth: int, nid: int | None) -> datetime.date:
    _expect(p, str, "$date")
    if len(p) > 16:
        raise FormatError("$date: too long")
    return datetime.date.fromisoformat(p)


def _h_time(dec: _Decoder, p: Any, depth: int, nid: int | None) -> datetime.time:
    value: datetime.time = _clock(p, "$time", datetime.time)
    return value


def _h_timedelta(dec: _Decoder, p: Any, depth: int, nid: int | None) -> datetime.timedelta:
    _expect(p, list, "$timedelta")
    if len(p) != 3 or not all(type(x) is int for x in p) or not (
            0 <= p[1] < 86400 and 0 <= p[2] < 1_000_000 and abs(p[0]) <= 999_999_999):
        raise FormatError("$timedelta takes [days, seconds, microseconds] as timedelta keeps "
                          "them (0 <= seconds < 86400, 0 <= microseconds < 10**6)")
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
    known = _dtypes.ml_dtypes_by_name().get(descr)
    if known is not None:
        return known
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
    arr = np.frombuffer(raw, dtype=dt)
    _check_text(arr)
    return arr[0]


def _check_text(arr: np.ndarray[Any, Any]) -> None:
    """A NumPy text scalar must hold code points it can turn into str (NumPy raises a
    SystemError on others). Arrays keep any bytes: NumPy builds those, lossless."""
    if arr.dtype.kind != "U" or not arr.size:
        return
    points = arr.view(arr.dtype.byteorder.replace("|", "<").replace("=", "<") + "u4")
    bad = (points >= 0x110000) | ((points >= 0xD800) & (points < 0xE000))
    if bad.any():
        raise FormatError("UCS-4 text holds a value that is not a Unicode code point")


def _h_objarray(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Any:
    f = _fields(p, {"shape", "items"}, set(), "$objarray")
    shape = _shape(f["shape"], dec.limits)
    _expect(f["items"], list, "$objarray items")
    if len(f["items"]) != math.prod(shape):
        raise FormatError(f"$objarray of shape {list(shape)} holds {len(f['items'])} items")
    dec._length(f["items"])
    items = [dec.value(v, depth) for v in f["items"]]  # no cycle may run through an array
    out = np.empty(shape, dtype=object)
    flat = out.reshape(-1)
    for i, v in enumerate(items):
        flat[i] = v
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
    if type(f.get("fortran", False)) is not bool:
        raise FormatError("$ndarray fortran is a bool")
    if f.get("fortran", False):
        arr = np.asfortranarray(arr)
    elif dec.copy or not nbytes:
        arr = np.array(arr)
    if not dec.copy:
        arr.flags.writeable = False
    return arr


def _h_tensor(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Any:
    f = _fields(p, {"dtype", "shape"}, {"name", "requires_grad", "parameter", "raw", "device",
                                        "skipped", "storage", "attrs"}, "$tensor")
    dtype = _dtypes.by_torch_name(f["dtype"]) if isinstance(f["dtype"], str) else None
    if dtype is None or (dtype.numpy is None and "skipped" not in f):  # a skipped one: any
        raise FormatError(f"torch dtype {f['dtype']!r} is not one an inert file holds")
    shape = _shape(f["shape"], dec.limits)
    flags = {k: f.get(k, False) for k in ("requires_grad", "parameter", "raw", "storage")}
    if not all(type(v) is bool for v in flags.values()):
        raise FormatError("requires_grad, parameter, raw and storage are booleans")
    if "attrs" in f and (not isinstance(f["attrs"], dict) or not all(
            k.isidentifier() and not k.startswith("__") for k in f["attrs"])):
        raise FormatError("a tensor's attrs are an object of identifiers not starting with "
                          "'__'")
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
               is_parameter=flags["parameter"], is_storage=flags["storage"])
    if "attrs" in f:
        t.attrs = {k: dec.value(v, depth + 1) for k, v in f["attrs"].items()}
    if dec.on_tensor is not None:
        return dec.on_tensor(t, f)
    return dec.leaf(t)


def _h_dtype(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Any:
    dtype = _dtypes.by_torch_name(p) if isinstance(p, str) else None
    if dtype is None:
        raise FormatError(f"unknown torch dtype {p!r}")
    if dec.torch is not None:
        found = torch_dtypes(dec.torch).get(dtype.name)
        if found is not None:
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


def _h_const(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Any:
    if type(p) is not str or p not in PYTHON_CONSTANTS:
        raise FormatError(f"$const takes one of {', '.join(map(repr, PYTHON_CONSTANTS))}")
    return PYTHON_CONSTANTS[p]


def _h_global(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Any:
    if not isinstance(p, list) or len(p) != 2 or not all(type(x) is str for x in p):
        raise FormatError("$global takes [module, name]")
    registered = dec.types.by_global(p[0], p[1])
    return registered if registered is not None else Global(p[0], p[1])


def _h_opaque(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Opaque:
    f = _fields(p, {"callable", "args", "kwargs", "newobj", "items", "dict_items"}, {"state"},
                "$opaque")
    if type(f["newobj"]) is not bool:
        raise FormatError("$opaque newobj is a bool")
    record: Opaque = dec.define(nid, Opaque(None, (), newobj=f["newobj"]))
    record.callable = dec.value(f["callable"], depth)
    if isinstance(record.callable, type):  # a registered class: the record stays inert
        record.callable = Global(record.callable.__module__, record.callable.__qualname__)
    _expect(f["args"], list, "$opaque args")
    record.args = tuple(dec.value(v, depth) for v in f["args"])
    if f["kwargs"] is not None:
        record.kwargs = dict(dec.pairs(f["kwargs"], depth))
    _expect(f["items"], list, "$opaque items")
    dec._length(f["items"])
    record.items = [dec.value(v, depth) for v in f["items"]]
    record.dict_items = list(dec.pairs(f["dict_items"], depth, keys=False))
    if "state" in f:  # last, as the writer puts it: $refs point backwards only
        record.state = dec.value(f["state"], depth)
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


def _h_record(dec: _Decoder, p: Any, depth: int, nid: int | None) -> Any:
    f = _fields(p, {"kind", "fields"}, set(), "$record")
    if f["kind"] not in KINDS:
        raise FormatError(f"$record kind {str(f['kind'])[:40]!r} is not one of "
                          f"{', '.join(KINDS)}")
    fields = dec.value(f["fields"], depth)
    if type(fields) is not dict or not all(type(k) is str for k in fields):
        raise FormatError("$record fields are an object")
    record = TensorRecord(f["kind"], fields)
    if dec.mode != "torch":
        return record
    try:
        return record_to_torch(record, dec.torch)
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as e:
        raise FormatError(f"torch cannot rebuild this {f['kind']} record: "
                          f"{type(e).__name__}: {e}") from None


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
    "$const": _h_const, "$global": _h_global, "$opaque": _h_opaque, "$obj": _h_obj,
    "$unsupported": _h_unsupported, "$record": _h_record,
}


def plain(entries: Entries, data: memoryview, *, tensors: TensorMode = "numpy",
          copy: bool = False,
          on_tensor: Callable[[Tensor, dict[str, Any]], Any] | None = None) -> dict[str, Any]:
    """The tensors of a safetensors file with no tree, by name in file order
    (``on_tensor(t, {})``: each tensor as the caller makes it, as for :func:`decode`)."""
    dec = _Decoder(entries, data, tensors, default_types, Limits(), copy, on_tensor)
    by_st = {d.safetensors: d for d in _dtypes.DTYPES if d.safetensors is not None}
    out: dict[str, Any] = {}
    for name, (st, shape, begin, end) in entries.items():
        dtype = by_st[st]
        view = data[begin:end]
        storage = Storage(name, dtype, end - begin, lambda v=view: v)  # type: ignore[misc]
        stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
        t = Tensor(storage, dtype, shape, stride, 0)
        out[name] = on_tensor(t, {}) if on_tensor is not None else dec.leaf(t)
    return out


def decode(metadata: Mapping[str, str], entries: Entries, data: memoryview, *,
           tensors: TensorMode = "numpy", types: TypeRegistry | None = None,
           limits: Limits | None = None, copy: bool = False,
           on_tensor: Callable[[Tensor, dict[str, Any]], Any] | None = None) -> Any:
    """The object an inert file holds, from its safetensors header and data section."""
    version = metadata.get(FORMAT_KEY)
    if version != VERSION:
        raise FormatError(f"inert format version {version!r} is not supported (this reader "
                          f"reads version {VERSION})",
                          hint="a newer torchless may read it (pip install -U torchless); the "
                               "tensors alone read with the safetensors package")
    text = metadata.get(TREE_KEY)
    if not isinstance(text, str):
        raise FormatError(f"the file has no {TREE_KEY!r} in its metadata")
    lim = limits if limits is not None else Limits()
    try:
        tree = parse_tree(text, lim)
        dec = _Decoder(entries, data, tensors, types if types is not None else default_types,
                       lim, copy, on_tensor)
        try:
            return dec.value(tree, 0)
        except RecursionError:
            raise LimitError("max_depth", lim.max_depth, sys.getrecursionlimit(),
                             "nested tree values") from None
    except FormatError as e:
        e.add_context(member=f"__metadata__[{TREE_KEY!r}]")
        if "hint" not in e.__dict__:
            e.hint = ("the object tree stored beside the tensors was damaged or edited: "
                      "convert the source checkpoint again; the tensors alone still read "
                      "with the safetensors package")
        raise
