"""Rebuild rules for standard-library values: containers, datetimes, paths, namespaces.

Each rule calls the real constructor only with plain data it has checked (no callable
from the file is ever passed on), or keeps the call as an inert record.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import re
import types
from collections.abc import Callable
from typing import Any

from torchless.core.limits import Limits
from torchless.errors import PickleError, UnsafeGlobalError
from torchless.model.tensor import Tensor
from torchless.pickle.known import Known
from torchless.pickle.machine import Resolver
from torchless.pickle.values import Global, Opaque

__all__ = ["METHOD_CALL_HINT", "Annotation", "StdlibRules", "calls_a_method", "method_name",
           "system_zone"]

_CODECS = {"latin1", "latin-1", "iso-8859-1", "iso8859-1", "utf-8", "utf8", "ascii"}
_SCALAR_TYPES = (int, float, str, bool, complex, type(None))
#: Attribute reads ``getattr`` may chain on a name (torch pickles one: a class's function;
#: nested classes add a few); a file's chain of thousands made reading quadratic in it.
_MAX_ATTR_CHAIN = 32
_DATETIME_CLASSES: dict[str, Callable[..., Any]] = {
    "datetime": datetime.datetime, "date": datetime.date, "time": datetime.time,
    "timedelta": datetime.timedelta, "timezone": datetime.timezone,
}


def _path_class(name: str) -> Callable[..., Any]:
    """The pathlib class a pickled ``pathlib.NAME`` is rebuilt as (pure paths, except a
    POSIX ``Path`` here). pathlib is imported when a file names one: a scan or an open of a
    file with no path never needs it."""
    import pathlib

    if os.name == "posix" and name in ("Path", "PosixPath"):
        return pathlib.PosixPath
    return {"Path": pathlib.PurePosixPath, "PosixPath": pathlib.PurePosixPath,
            "PurePath": pathlib.PurePosixPath, "PurePosixPath": pathlib.PurePosixPath,
            "WindowsPath": pathlib.PureWindowsPath,
            "PureWindowsPath": pathlib.PureWindowsPath}[name]


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

#: ``type(x)`` of the plain values a pickle holds: the builtin class, as an inert reference.
_BUILTIN_TYPES: dict[type, str] = {
    type(None): "NoneType", bool: "bool", int: "int", float: "float", complex: "complex",
    str: "str", bytes: "bytes", bytearray: "bytearray", tuple: "tuple", list: "list",
    dict: "dict", set: "set", frozenset: "frozenset", slice: "slice", range: "range",
    type(Ellipsis): "ellipsis", type(NotImplemented): "NotImplementedType",
}
#: Modules whose subscripted forms are type annotations (``typing.Optional[int]``,
#: ``collections.abc.Callable[[int], str]``, ``builtins.list[int]``).
_ANNOTATION_MODULES = frozenset({"typing", "typing_extensions", "collections.abc"})
#: The most members a union read from a file may have (``A | B | …``).
_UNION_MAX = 256


class Annotation(Opaque):
    """A type annotation the file holds (``typing.Optional[torch.Tensor]``, which pickle
    writes as ``operator.getitem(typing.Union, (torch.Tensor, type(None)))``): kept as the
    inert record of that call, with :attr:`text` naming the annotation. Nothing is
    subscripted or imported."""

    __slots__ = ("text",)

    def __init__(self, func: Any, args: tuple[Any, ...], text: str) -> None:
        super().__init__(func, args)
        self.text = text

    def __repr__(self) -> str:
        return f"Annotation({self.text})"


def _annotation_text(value: Any) -> str | None:
    """How Python spells ``value`` inside an annotation, or None when it is no part of one
    (an object the file built, a container of data)."""
    if isinstance(value, Annotation):
        return value.text
    if isinstance(value, Global):
        if value.module in ("builtins", "__builtin__"):
            return value.name
        return value.path
    if value is None or value is Ellipsis:
        return repr(value)
    if type(value) in (int, bool, str, bytes):  # Literal[...] members, forward references
        return repr(value)
    if type(value) in (list, tuple) and len(value) <= 64:
        parts = [_annotation_text(v) for v in value]
        if all(p is not None for p in parts):
            text = ", ".join(p for p in parts if p is not None)
            return f"[{text}]" if type(value) is list else text
    return None
_ZONE_KEY = re.compile(r"[A-Za-z0-9_+-]+(?:/[A-Za-z0-9_+-]+)*\Z")


def system_zone(key: str) -> datetime.tzinfo | None:
    """``zoneinfo.ZoneInfo(key)`` when ``key`` is a plain zone name whose file this machine's
    time zone database holds; None otherwise. ``ZoneInfo`` then reads only that file (for a
    key it cannot find as a file it would import a ``tzdata`` module named after the key,
    which a name from a file must never choose)."""
    if len(key) > 255 or not _ZONE_KEY.match(key):
        return None
    import zoneinfo  # here: a scan or an open of a file with no zone never needs it

    for root in zoneinfo.TZPATH:
        if os.path.isfile(os.path.join(root, key)):
            try:
                return zoneinfo.ZoneInfo(key)
            except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
                return None
    return None


def _union_text(members: Any) -> str | None:
    """How Python spells the union of ``members`` (``int | None``), or None when one of them
    is no class, name or annotation (``|`` would run its own code)."""
    if len(members) > _UNION_MAX:
        return None
    parts = []
    for m in members:
        if not isinstance(m, (Global, Annotation)) and m is not None:
            return None
        if isinstance(m, Global) and m.name == "NoneType" and \
                m.module in ("builtins", "__builtin__"):
            parts.append("None")
            continue
        text = _annotation_text(m)
        if text is None:
            return None
        parts.append(text)
    return " | ".join(parts)


METHOD_CALL_HINT = (
    "torch.load would call a method of an object this file builds (how gadget chains run "
    "code): do not torch.load it. Nothing here can allow it; a method the file only keeps "
    "as a value (a module's hook) is read as an inert record")


def calls_a_method(func: Opaque) -> bool:
    """Whether calling ``func`` would call a method of an object the file built: a
    ``getattr(obj, name)`` record, or a ``functools.partial`` of one."""
    seen = 0
    current: Any = func
    while isinstance(current, Opaque) and seen < 64:
        func = current
        c = func.callable
        if isinstance(c, Known) and c.rule == "getattr":
            return True
        if not (isinstance(c, Known) and c.path == "functools.partial"):
            return False
        state = func.state
        current = state[0] if isinstance(state, tuple) and state else (
            func.args[0] if func.args else None)
        seen += 1
    return False


def method_name(func: Opaque) -> str:
    current: Any = func
    while isinstance(current, Opaque) and not (
            isinstance(current.callable, Known) and current.callable.rule == "getattr"):
        state = current.state
        current = state[0] if isinstance(state, tuple) and state else current.args[0]
    return str(current.args[1]) if isinstance(current, Opaque) and len(current.args) == 2 \
        else "?"


_DATA_TYPES = (*_SCALAR_TYPES, bytes, bytearray, list, tuple, dict, set, frozenset)
#: What a builtin rule takes as an argument: data, tensors, records, names.
_ARGUMENT_TYPES = (*_DATA_TYPES, Tensor, Opaque, Global)
_CONTAINER_CTORS: dict[str, Any] = {"set": set, "frozenset": frozenset, "list": list,
                                    "tuple": tuple, "dict": dict}
_CONTAINER_ARGS = (list, tuple, set, frozenset, dict)


def _is_data(value: Any) -> bool:
    return isinstance(value, _DATA_TYPES)



class StdlibRules(Resolver):
    """``_r_<rule>`` methods for the stdlib entries of the rule table."""

    limits: Limits

    def _r_ordered_dict(self, f: Known, a: tuple[Any, ...]) -> Any:
        od: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        if not a:
            return od
        if len(a) != 1 or not isinstance(a[0], (list, tuple, dict)):
            raise PickleError("OrderedDict takes one sequence of pairs")
        pairs = a[0].items() if isinstance(a[0], dict) else a[0]
        for pair in pairs:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise PickleError("OrderedDict item is not a (key, value) pair")
        self.charge_keys(pair[0] for pair in pairs)
        for pair in pairs:
            od[pair[0]] = pair[1]
        return od

    def _r_defaultdict(self, f: Known, a: tuple[Any, ...]) -> Any:
        factories: dict[str, Any] = {"list": list, "dict": dict, "set": set, "int": int,
                                     "float": float, "str": str, "tuple": tuple}
        factory = None
        if a and isinstance(a[0], Known) and a[0].rule == "builtin":
            factory = factories.get(a[0].name)
        return collections.defaultdict(factory)

    def _r_deque(self, f: Known, a: tuple[Any, ...]) -> Any:
        items = a[0] if a else ()
        maxlen = a[1] if len(a) > 1 else None
        if not isinstance(items, (list, tuple)) or (maxlen is not None and (
                type(maxlen) is not int or maxlen < 0)):
            raise PickleError("deque takes a sequence and an optional maxlen")
        return collections.deque(items, maxlen)

    def _r_counter(self, f: Known, a: tuple[Any, ...]) -> Any:
        if a and not isinstance(a[0], dict):
            raise PickleError("Counter takes a dict")
        if a:
            self.charge_keys(a[0])
        return collections.Counter(a[0] if a else {})

    def _r_builtin(self, f: Known, a: tuple[Any, ...]) -> Any:
        name = f.name
        for x in a:
            if not isinstance(x, _ARGUMENT_TYPES):
                raise PickleError(f"builtins.{name} called with non-data arguments")
        ctor: Any = _CONTAINER_CTORS.get(name)
        if ctor is not None:
            if len(a) > 1 or (a and not isinstance(a[0], _CONTAINER_ARGS)):
                raise PickleError(f"builtins.{name} takes one container")
            if a and name in ("set", "frozenset"):
                self.charge_keys(a[0])
            elif a and name == "dict" and isinstance(a[0], (list, tuple)):
                self.charge_keys(p[0] for p in a[0] if isinstance(p, (tuple, list)) and p)
            return ctor(*a)
        if name in ("bytes", "bytearray"):
            ctor = bytes if name == "bytes" else bytearray
            if not a:
                return ctor()
            if len(a) == 2 and type(a[0]) is str and type(a[1]) is str and a[1].lower() in _CODECS:
                return ctor(a[0], a[1])
            if len(a) == 1 and isinstance(a[0], (bytes, bytearray)):
                return ctor(a[0])
            if len(a) == 1 and isinstance(a[0], list) and all(
                    type(x) is int and 0 <= x < 256 for x in a[0]):
                return ctor(a[0])
            raise PickleError(f"builtins.{name} called with unsupported arguments")
        if name in ("slice", "range"):
            if not 1 <= len(a) <= 3 or not all(x is None or type(x) is int for x in a):
                raise PickleError(f"builtins.{name} takes up to 3 ints")
            return slice(*a) if name == "slice" else range(*a)
        if name in ("complex", "int", "float", "str", "bool"):
            if len(a) > 2 or not all(isinstance(x, (int, float, str)) for x in a):
                raise PickleError(f"builtins.{name} takes scalars")
            if name == "str":
                if len(a) != 1 or type(a[0]) is not str:
                    raise PickleError("builtins.str takes one str")
                return a[0]
            ctor = {"complex": complex, "int": int, "float": float, "bool": bool}[name]
            return ctor(*a)
        return Opaque(f, a)

    def _r_reconstructor(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) != 3:
            raise PickleError("copyreg._reconstructor takes 3 arguments")
        cls, base, state = a
        if isinstance(base, Known) and base.rule == "builtin" and base.name == "object" \
                and state is None:
            return self.new_object(cls, (), None, -1)
        return Opaque(f, a)

    def _r_newobj(self, f: Known, a: tuple[Any, ...]) -> Any:
        if not a:
            raise PickleError("copyreg.__newobj__ needs a class")
        return self.new_object(a[0], a[1:], None, -1)

    def _r_newobj_ex(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) != 3 or not isinstance(a[1], tuple) or not isinstance(a[2], dict):
            raise PickleError("copyreg.__newobj_ex__ takes (cls, args, kwargs)")
        return self.new_object(a[0], a[1], a[2], -1)

    def _r_codecs_encode(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) != 2 or type(a[0]) is not str or type(a[1]) is not str \
                or a[1].lower() not in _CODECS:
            raise PickleError("_codecs.encode takes a str and a known text encoding")
        return a[0].encode(a[1])

    def _r_datetime(self, f: Known, a: tuple[Any, ...]) -> Any:
        if f.name in ("datetime", "time") and len(a) == 2 and type(a[0]) is bytes \
                and isinstance(a[1], Opaque):
            return Opaque(f, a)  # in a time zone this machine's database lacks: a record
        if not all(isinstance(x, (int, float, str, bytes, datetime.tzinfo, datetime.timedelta))
                   or x is None for x in a):
            raise PickleError(f"datetime.{f.name} called with non-data arguments")
        return _DATETIME_CLASSES[f.name](*a)

    def _r_namespace(self, f: Known, a: tuple[Any, ...]) -> Any:
        if a:
            raise PickleError("argparse.Namespace takes no positional arguments")
        return argparse.Namespace()

    def _r_simple_namespace(self, f: Known, a: tuple[Any, ...]) -> Any:
        if a:
            raise PickleError("types.SimpleNamespace takes no positional arguments")
        return types.SimpleNamespace()

    def _r_path(self, f: Known, a: tuple[Any, ...]) -> Any:
        if not all(type(x) is str for x in a):
            raise PickleError(f"pathlib.{f.name} takes str parts")
        return _path_class(f.name)(*a)

    def _r_type(self, f: Known, a: tuple[Any, ...]) -> Any:
        """``type(x)`` of a plain value: its builtin class, an inert reference (pickle writes
        ``NoneType`` as ``type(None)``). Any other call (``type(x)`` of a record, ``type(name,
        bases, namespace)``, which makes a class) stays an inert record."""
        if len(a) == 1:
            name = _BUILTIN_TYPES.get(type(a[0]))
            if name is not None:
                return Global("builtins", name)
        return Opaque(f, a)

    def _r_getitem(self, f: Known, a: tuple[Any, ...]) -> Any:
        """``operator.getitem(form, key)``: a typing form subscripted with classes, names and
        literals (``typing.Optional[int]``) becomes an :class:`Annotation`; any other
        subscript (of an object the file builds, with other keys) stays an inert record."""
        if len(a) == 2 and isinstance(a[0], Global) and (
                a[0].module in _ANNOTATION_MODULES
                or (a[0].module in ("builtins", "__builtin__") and a[0].name in (
                    "list", "tuple", "dict", "set", "frozenset", "type"))):
            key = _annotation_text(a[1])
            if key is not None:
                form = _annotation_text(a[0])
                keys = a[1] if type(a[1]) is tuple else (a[1],)
                if a[0].path == "typing.Union" and len(keys) == 2 and any(
                        isinstance(k, Global) and k.module == "builtins"
                        and k.name == "NoneType" for k in keys):
                    other = [k for k in keys if not (isinstance(k, Global)
                                                      and k.name == "NoneType")]
                    if len(other) == 1:
                        form, key = "typing.Optional", _annotation_text(other[0])
                return Annotation(f, a, f"{form}[{key or '()'}]")
        return Opaque(f, a)

    def _r_generic_alias(self, f: Known, a: tuple[Any, ...]) -> Any:
        """``types.GenericAlias(origin, args)``: how pickle writes ``list[int]`` (and
        ``dict[str, list[int]]``, ``collections.OrderedDict[str, int]``). CPython's
        constructor only keeps both; a class subscripted with classes, names and literals
        becomes an :class:`Annotation`, anything else an inert record."""
        if len(a) == 2 and isinstance(a[0], (Global, Annotation)):
            form, key = _annotation_text(a[0]), _annotation_text(a[1])
            if form is not None and key is not None:
                return Annotation(f, a, f"{form}[{key or '()'}]")
        return Opaque(f, a)

    def _r_reduce(self, f: Known, a: tuple[Any, ...]) -> Any:
        """``functools.reduce(operator.or_, (int, type(None)))``: how pickle writes the union
        ``int | None`` (a ``types.UnionType``), kept as an :class:`Annotation`. reduce calls
        the function it is given on the file's values: any other use is refused."""
        if len(a) == 2 and isinstance(a[0], Known) and a[0].rule == "or" and \
                type(a[1]) in (tuple, list) and a[1]:
            text = _union_text(a[1])
            if text is not None:
                return Annotation(f, a, text)
        raise UnsafeGlobalError(
            f"refused call {f.path}: it calls the function it is given on values the "
            "file built (only reduce(operator.or_, classes), a pickled union such as "
            "int | None, is read)", names=(f.path,), hint=METHOD_CALL_HINT)

    def _r_or(self, f: Known, a: tuple[Any, ...]) -> Any:
        """``operator.or_(a, b)``: the union of two classes (``int | None``) as an
        :class:`Annotation`, or of two integers; any other operands (their ``__or__`` is
        code of the objects the file built) are refused."""
        if len(a) == 2:
            if all(type(x) in (int, bool) for x in a):
                return a[0] | a[1]
            text = _union_text(a)
            if text is not None:
                return Annotation(f, a, text)
        raise UnsafeGlobalError(
            f"refused call {f.path}: it runs the | of objects the file built (only a union of "
            "classes, such as int | None, is read)", names=(f.path,), hint=METHOD_CALL_HINT)

    def _r_getattr(self, f: Known, a: tuple[Any, ...]) -> Any:
        """``getattr(Class, "Inner")``: how protocols < 4 name a nested class or a class's
        function; resolved here, by name, into the global ``Class.Inner`` (judged like any
        global). ``getattr(cls, "__new__")`` is the first half of ``cls.__new__(cls, …)``."""
        if len(a) != 2 or type(a[1]) is not str or not _IDENTIFIER.match(a[1]) or (
                a[1].startswith("__") and (a[1] != "__new__" or not isinstance(a[0], Global))):
            raise UnsafeGlobalError(
                "refused global builtins.getattr: it is asked for something other than a plain "
                "attribute name", names=("builtins.getattr",),
                hint=METHOD_CALL_HINT)
        if not isinstance(a[0], Global):
            # an attribute of an object the file builds (a bound method a module keeps as a
            # hook): kept as a record; calling it is refused (see call)
            return Opaque(f, a)
        target, attr = a[0], a[1]
        if target.name.count(".") >= _MAX_ATTR_CHAIN:  # each read would copy the whole name
            raise UnsafeGlobalError(
                f"refused global builtins.getattr: a chain of more than {_MAX_ATTR_CHAIN} "
                f"attribute reads from {target.module}", names=("builtins.getattr",),
                hint=METHOD_CALL_HINT)
        if attr == "__new__":
            return Known(target.module, f"{target.name}.__new__", rule="class_new")
        try:
            return self.find_global(target.module, f"{target.name}.{attr}", target.offset)
        except UnsafeGlobalError as e:
            if "walks attributes through a dotted name" not in e.message:
                raise
            # one attribute read of a class the file names (torch.sigmoid is pickled as
            # getattr(torch._C._VariableFunctionsClass, "sigmoid")): a reference, kept
            # inert; calling it is refused like any call of an unvetted function
            return Global(target.module, f"{target.name}.{attr}", target.offset)

    def _r_class_new(self, f: Known, a: tuple[Any, ...]) -> Any:
        if not a or not isinstance(a[0], Global) \
                or f"{a[0].module}.{a[0].name}.__new__" != f"{f.module}.{f.name}":
            raise PickleError(f"{f} is called without its own class first")
        return self.new_object(a[0], a[1:], None, -1)

    def _r_zoneinfo(self, f: Known, a: tuple[Any, ...]) -> Any:
        """``ZoneInfo._unpickle(key, from_cache)``: the zone, when this machine's time zone
        database has it as a file (so nothing but that file is read); else an inert record."""
        if len(a) != 2 or type(a[0]) is not str:
            raise PickleError(f"{f} takes a zone key and a flag")
        zone = system_zone(a[0])
        return zone if zone is not None else Opaque(f, a)
