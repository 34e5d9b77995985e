"""Reconstruction rules: what torch's, the stdlib's and NumPy's pickled callables mean.

A table keyed by ``(module, name)`` maps each global we understand to a
rebuild function that turns the (already inert) arguments into a safe value:
tensors, OrderedDicts, sets, datetimes, Namespaces, NumPy arrays … Nothing is
ever imported from a name found in a file; the table holds our own code.

Every other global is judged by :mod:`._policy` and, if it may stand, stays an
inert :class:`Global`; calls on it become :class:`Opaque` records.
"""

from __future__ import annotations

import argparse
import collections
import re
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from torchless.core import dtypes as _dtypes
from torchless.core.dtypes import StorageType
from torchless.core.limits import Limits
from torchless.errors import (
    CheckpointError,
    PickleError,
    StorageError,
    UnsafeGlobalError,
    type_phrase,
)
from torchless.pickle.known import Known, Pending
from torchless.pickle.values import Global, Opaque, new_global
from torchless.rules.allowlist import FORWARDS, import_verdict
from torchless.rules.arrays import NumpyRules
from torchless.rules.findclass import EXTENSION, Failure, Import, StorageName, find_class
from torchless.rules.policy import PYTHON_CONSTANTS, judge, torch_constant
from torchless.rules.stdlib import METHOD_CALL_HINT, StdlibRules, calls_a_method, method_name
from torchless.rules.torch import UNSUPPORTED_ELSEWHERE, UNSUPPORTED_TENSORS, TorchRules
from torchless.rules.vetting import call_refusal, describe

__all__ = ["GlobalRecord", "Pending", "StorageType", "TorchResolver"]


@dataclass(frozen=True)
class GlobalRecord:
    """A global the file named, where, and what became of it."""

    module: str
    name: str
    offset: int
    verdict: Literal["rebuilt", "opaque"]


_RULES: dict[tuple[str, str], str] = {
    ("torch._utils", "_rebuild_tensor"): "rebuild_tensor",
    ("torch._utils", "_rebuild_tensor_v2"): "rebuild_tensor_v2",
    ("torch._utils", "_rebuild_tensor_v3"): "rebuild_tensor_v3",
    ("torch._utils", "_rebuild_parameter"): "rebuild_parameter",
    ("torch._utils", "_rebuild_parameter_with_state"): "rebuild_parameter",
    ("torch._utils", "_rebuild_device_tensor_from_cpu_tensor"): "device_tensor",
    ("torch._tensor", "_rebuild_from_type_v2"): "rebuild_from_type",
    ("torch._tensor", "_rebuild_from_type"): "rebuild_from_type",
    ("torch", "Size"): "size",
    ("torch", "device"): "device",
    ("torch", "Tensor"): "tensor_class",
    ("torch._tensor", "Tensor"): "tensor_class",
    ("torch.nn.parameter", "Parameter"): "parameter_class",
    ("torch.torch_version", "TorchVersion"): "str",
    ("torch.jit._pickle", "build_intlist"): "identity",
    ("torch.jit._pickle", "build_floatlist"): "identity",
    ("torch.jit._pickle", "build_boollist"): "identity",
    ("torch.jit._pickle", "build_doublelist"): "identity",
    ("torch.jit._pickle", "build_tensorlist"): "identity",
    ("torch.jit._pickle", "build_complexlist"): "identity",
    ("torch.jit._pickle", "restore_type_tag"): "first",
    ("collections", "OrderedDict"): "ordered_dict",
    ("collections", "defaultdict"): "defaultdict",
    ("collections", "deque"): "deque",
    ("collections", "Counter"): "counter",
    ("copyreg", "_reconstructor"): "reconstructor",
    ("copyreg", "__newobj__"): "newobj",
    ("copyreg", "__newobj_ex__"): "newobj_ex",
    ("_codecs", "encode"): "codecs_encode",
    ("argparse", "Namespace"): "namespace",
    ("numpy.core.multiarray", "_reconstruct"): "np_reconstruct",
    ("numpy._core.multiarray", "_reconstruct"): "np_reconstruct",
    ("numpy.core.multiarray", "scalar"): "np_scalar",
    ("numpy._core.multiarray", "scalar"): "np_scalar",
    ("numpy", "ndarray"): "np_ndarray",
    ("numpy.core.numeric", "_frombuffer"): "np_frombuffer",
    ("numpy._core.numeric", "_frombuffer"): "np_frombuffer",
    ("numpy", "dtype"): "np_dtype",
    ("functools", "partial"): "opaque",  # configs hold partial(Optimizer, lr=…); never called
    ("types", "SimpleNamespace"): "simple_namespace",
    ("uuid", "UUID"): "opaque",
    ("inspect", "_empty"): "opaque",  # inspect.Parameter.empty, a sentinel class
    ("re", "_compile"): "opaque",
    ("torch.serialization", "_get_layout"): "layout",
    # a Generator saved whole: its state (a ByteTensor, seed, offset) is set by BUILD
    ("torch._C", "Generator"): "opaque",
    ("builtins", "getattr"): "getattr",
    # typing.Optional[torch.Tensor] is pickled as getitem(typing.Union, (Tensor, type(None)))
    ("builtins", "type"): "type",
    ("operator", "getitem"): "getitem",
    ("_operator", "getitem"): "getitem",
    # list[int] is pickled as types.GenericAlias(list, (int,)); int | None as
    # functools.reduce(operator.or_, (int, type(None)))
    ("types", "GenericAlias"): "generic_alias",
    ("functools", "reduce"): "reduce",
    ("_functools", "reduce"): "reduce",
    ("operator", "or_"): "or",
    ("_operator", "or_"): "or",
    ("zoneinfo", "ZoneInfo._unpickle"): "zoneinfo",
    # torch 0.3/0.4 full-model saves pickle each module's _backend through this call
    ("torch.nn.backends.thnn", "_get_thnn_function_backend"): "opaque",
    ("numpy.random._pickle", "__randomstate_ctor"): "opaque",
    ("numpy.random._pickle", "__generator_ctor"): "opaque",
    ("numpy.random._pickle", "__bit_generator_ctor"): "opaque",
}
for _n in UNSUPPORTED_TENSORS:
    _RULES[("torch._utils", _n)] = "unsupported_tensor"
for _mn in UNSUPPORTED_ELSEWHERE:
    _RULES[_mn] = "unsupported_tensor"
for _n in ("set", "frozenset", "complex", "slice", "bytearray", "bytes", "list", "dict",
           "tuple", "int", "float", "str", "bool", "range", "object"):
    _RULES[("builtins", _n)] = "builtin"
for _n in ("datetime", "date", "time", "timedelta", "timezone"):
    _RULES[("datetime", _n)] = "datetime"
for _n in ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"):
    _RULES[("pathlib", _n)] = "path"

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

class TorchResolver(TorchRules, StdlibRules, NumpyRules):
    """Rebuilds what the rules know, judges every other global, keeps the rest inert."""

    def __init__(
        self,
        limits: Limits,
        persistent_load: Callable[[Any, int], Any] | None = None,
        *,
        strict: bool = False,
        allow: frozenset[str] = frozenset(),
        plain: bool = False,
    ) -> None:
        self.limits = limits
        self._persistent_load = persistent_load
        self.strict = strict
        self.allow = allow
        self.globals: list[GlobalRecord] = []
        self._rule_methods: dict[str, Callable[[Known, Any], Any]] = {}
        #: id -> the rule callables (kept alive: ids stay theirs) whose calls are never
        #: refused (:meth:`_vet_call`), each with its rule's method
        self._unforwarding: dict[int, tuple[Known, Callable[[Known, Any], Any]]] = {}
        #: (module, name) as mapped -> the refusal reason (None: it may stand); judging
        #: scans the whole name, and a file can name one long name again in a few bytes
        self._verdicts: dict[tuple[str, str], str | None] = {}
        #: which of torch's loaders reads the stream (:mod:`.findclass`): a plain
        #: ``pickle.load`` pass maps no storage name
        self.plain = plain

    # ---- names ----------------------------------------------------------------------

    def find_global(self, module: str, name: str, offset: int) -> Any:
        if module in ("__builtin__", "copy_reg"):
            self.python2_strings = True
        found = find_class(module, name, self.proto, "plain" if self.plain else "torch")
        if isinstance(found, StorageName):
            self.globals.append(GlobalRecord(module, name, offset, "rebuilt"))
            return _storage_type(found.name)
        module, name = _imported(found, module, name, offset)
        value = self._known(module, name, offset)
        key = (module, name)
        if key in self._verdicts:
            reason = self._verdicts[key]
        else:
            reason = judge(module, name, known=value is not None, strict=self.strict,
                           allow=self.allow)
            if reason is None and value is None and f"{module}.{name}" not in self.allow:
                severity, why = import_verdict(module, name)
                if severity == "dangerous":
                    reason = why if why.startswith(("is ", "reaches", "walks", "belongs")) \
                        else f"is known to be dangerous: {why}"
            self._verdicts[key] = reason
        if reason is not None:
            raise UnsafeGlobalError(f"refused global {module}.{name}: it {reason}",
                                    names=(f"{module}.{name}",), offset=offset,
                                    hint=_refusal_hint(f"{module}.{name}", reason))
        self.globals.append(GlobalRecord(module, name, offset,
                                         "opaque" if value is None else "rebuilt"))
        return new_global(module, name, offset) if value is None else value

    def known(self, module: str, name: str, offset: int = -1, proto: int = 2) -> bool:
        """Whether a rebuild rule knows ``module.name`` (as the file spells it, read by
        torch's loader at protocol ``proto``)."""
        found = find_class(module, name, proto, "plain" if self.plain else "torch")
        if isinstance(found, StorageName):
            return True
        module, name = _imported(found, module, name, offset)
        return self._known(module, name, offset) is not None

    def _known(self, module: str, name: str, offset: int | None = None) -> Any:
        rule = _RULES.get((module, name))
        if rule is not None:
            return Known(module, name, rule=rule)
        if module == "torch.return_types" and _IDENTIFIER.match(name):
            # struct sequences (torch.max(x, 1) …): a tuple of tensors with field names
            return Known(module, name, rule="opaque")
        if _dtypes.names_storage_type(module, name):
            # names torch imports: UntypedStorage (torch.save writes torch.storage's for the
            # newer dtypes), and the storage classes (torch.FloatStorage …) as plain passes
            # import them; the names outside torch's StorageType table are read too
            if name == "UntypedStorage":
                return StorageType(name, _dtypes.UINT8, untyped=True)
            dtype = _dtypes.by_storage_name(name)
            if dtype is None:
                raise UnsafeGlobalError(
                    f"refused global {module}.{name}: torch has no such storage type",
                    names=(f"{module}.{name}",), offset=offset,
                    hint="torch.save never writes this name: the file was made by hand or by "
                         "another tool; do not torch.load it")
            return StorageType(name, dtype)
        if module == "torch":
            dtype = _dtypes.by_torch_name(name)
            if dtype is not None:
                return dtype
        constant = torch_constant(module, name)
        if constant is not None:
            return Global("torch", constant)
        if module == "builtins" and name in PYTHON_CONSTANTS:
            return PYTHON_CONSTANTS[name]  # ... and NotImplemented: the constants themselves
        return None

    def extension(self, code: int, offset: int) -> Any:
        raise UnsafeGlobalError(
            f"refused copyreg extension code {code}: it {EXTENSION}",
            names=(f"copyreg.extension:{code}",), offset=offset,
            hint="torch.save never writes extension codes; what they name depends on the "
                 "loading process, so do not torch.load this file")

    # ---- calls ----------------------------------------------------------------------

    def call(self, func: Any, args: Any, offset: int) -> Any:
        vetted = self._unforwarding.get(id(func))
        if vetted is not None and vetted[0] is func:  # a rule's callable met before (a
            rule = vetted[1]                          # Known): its method is kept
        else:
            self._vet_call(func, args, offset)
            if not isinstance(func, Known):
                return self._call_record(func, args, offset)
            rule = self._rule_method(func)
        try:
            return rule(func, args)
        except CheckpointError as e:
            if e.offset is None:
                e.offset = offset
            raise
        except (TypeError, ValueError, OverflowError, UnicodeError) as e:
            raise PickleError(f"bad arguments for {func}: {e}", offset=offset) from None

    def _call_record(self, func: Any, args: Any, offset: int) -> Any:
        """A call of what no rule knows (vetted): an inert record of it."""
        if isinstance(func, Opaque):
            if calls_a_method(func):
                raise UnsafeGlobalError(
                    "refused call of an attribute of an object the file builds "
                    f"(getattr(…, {method_name(func)!r})(…)): torch.load would call that "
                    "method", names=("builtins.getattr",), offset=offset,
                    hint=METHOD_CALL_HINT)
            made = self._call_partial(func, args, offset)
            if made is not None:
                return made
        if isinstance(func, (Global, Opaque)):
            return Opaque(func, args)
        raise PickleError(f"REDUCE of a non-callable {type(func).__name__}", offset=offset)

    def _vet_call(self, func: Any, args: Any, offset: int) -> None:
        """Refuse a call the scanner's execution model calls dangerous (see
        :func:`.vetting.call_refusal`)."""
        reason = call_refusal(func, args, self.allow)
        if reason is not None:
            raise UnsafeGlobalError(f"refused call: {reason}", names=(describe(func),),
                                    offset=offset, hint=METHOD_CALL_HINT)
        if type(func) is Known and func.path not in FORWARDS:
            # call_refusal passes a rule's callable that forwards nothing, whatever the
            # arguments: each such object is vetted once, not at each of its calls, and its
            # rule's method looked up once
            self._unforwarding[id(func)] = (func, self._rule_method(func))

    def _rule_method(self, func: Known) -> Callable[[Known, Any], Any]:
        """The method of ``func``'s rule (``_r_<rule>``, a name of our own table), looked up
        once per rule."""
        rule = self._rule_methods.get(func.rule)
        if rule is None:
            rule = self._rule_methods[func.rule] = getattr(self, "_r_" + func.rule)
        return rule

    def _call_partial(self, p: Opaque, args: tuple[Any, ...], offset: int) -> Any:
        """``functools.partial(cls.__new__, cls, *a, **kw)()``: how protocols < 4 pickle an
        object whose class has ``__getnewargs_ex__``; made as NEWOBJ_EX would make it.
        None for any other partial (kept as an inert record)."""
        if not (isinstance(p.callable, Known) and p.callable.rule == "opaque"
                and p.callable.path == "functools.partial"):
            return None
        state = p.state
        if isinstance(state, tuple) and len(state) == 4:
            func, p_args, p_kwargs = state[0], state[1], state[2]
        else:
            func, p_args, p_kwargs = (p.args[0] if p.args else None), p.args[1:], p.kwargs
        if not (isinstance(func, Known) and func.rule == "class_new"
                and isinstance(p_args, tuple) and p_args and isinstance(p_args[0], Global)
                and (p_kwargs is None or isinstance(p_kwargs, dict))):
            return None
        return self.new_object(p_args[0], (*p_args[1:], *args), p_kwargs or None, offset)

    #: Classes whose ``__new__`` ignores its arguments, by rule (builtins by name).
    _EMPTY_FROM_NEW: dict[str, Callable[[], Any]] = {
        "list": list, "dict": dict, "set": set, "bytearray": bytearray,
        "ordered_dict": collections.OrderedDict, "counter": collections.Counter,
        "deque": collections.deque, "defaultdict": collections.defaultdict,
        "namespace": argparse.Namespace, "simple_namespace": types.SimpleNamespace,
    }

    def new_object(self, cls: Any, args: Any, kwargs: Any, offset: int) -> Any:
        """``cls.__new__(cls, *args, **kwargs)`` as CPython runs it: the containers that
        ``__init__`` fills come out empty whatever the arguments (APPENDS, SETITEMS,
        ADDITEMS or BUILD fill them next); the immutable builtins take their arguments."""
        if isinstance(cls, Known):
            empty = self._EMPTY_FROM_NEW.get(cls.name if cls.rule == "builtin" else cls.rule)
            if empty is not None:
                return empty()
            if cls.rule == "builtin":
                if kwargs or (cls.name == "object" and args):
                    raise PickleError(f"{cls}.__new__ takes no keyword arguments"
                                      if kwargs else f"{cls}.__new__ takes no arguments",
                                      offset=offset)
                if cls.name == "object":
                    return Opaque(cls, (), newobj=True)
                return self.call(cls, args, offset)
            if cls.rule == "np_ndarray":
                return Pending("ndarray", args)
        if isinstance(cls, (Global, Opaque, Known)):
            return super().new_object(cls, args, kwargs, offset)
        raise PickleError(f"NEWOBJ of a non-class {type(cls).__name__}", offset=offset)

    def build(self, obj: Any, state: Any, offset: int) -> Any:
        if isinstance(obj, Opaque):
            c = obj.callable
            if (isinstance(c, Known) and c.rule in ("tensor_class", "parameter_class")
                    and not obj.args and isinstance(state, tuple) and len(state) in (4, 5)):
                return self._old_tensor(c, state, offset)
            return super().build(obj, state, offset)
        if isinstance(obj, Pending):
            obj.state = state
            try:
                self._finish_pending(obj, state)
            except (TypeError, ValueError) as e:
                raise PickleError(f"bad NumPy state: {e}", offset=offset) from None
            return obj
        if isinstance(obj, (collections.OrderedDict, argparse.Namespace, types.SimpleNamespace)):
            if state is None:
                return obj
            if not isinstance(state, dict):
                raise PickleError(f"BUILD of {type_phrase(obj)} with a "
                                  f"{type(state).__name__}", offset=offset)
            target = vars(obj)
            for key, value in state.items():
                if isinstance(obj, (argparse.Namespace, types.SimpleNamespace)):
                    if type(key) is str:
                        target[key] = value
                elif type(key) is str and key.isidentifier() and not key.startswith("__"):
                    target[key] = value
            return obj
        raise PickleError(f"BUILD applied to {type_phrase(obj)}", offset=offset)

    def append(self, obj: Any, items: list[Any], offset: int) -> None:
        if isinstance(obj, collections.deque):
            if len(obj) + len(items) > self.limits.max_container_len:
                raise PickleError("deque too long", offset=offset)
            obj.extend(items)
            return
        super().append(obj, items, offset)

    def persistent_load(self, pid: Any, offset: int) -> Any:
        if self._persistent_load is None:
            raise StorageError("the pickle references a storage but this file has none "
                               "(a plain pickle cannot hold tensor data)", offset=offset)
        try:
            return self._persistent_load(pid, offset)
        except CheckpointError as e:
            if e.offset is None:
                e.offset = offset
            raise


def _storage_type(name: str) -> StorageType:
    """torch's ``StorageType(name)`` for a name of its table (each has a dtype of ours)."""
    dtype = _dtypes.by_storage_name(name)
    assert dtype is not None, name  # a subset (tests/rules/test_findclass_torch)
    return StorageType(name, dtype)


def _imported(found: Import | Failure, module: str, name: str, offset: int) -> tuple[str, str]:
    """The module and dotted name an import reads; a failing resolution is a PickleError."""
    if isinstance(found, Failure):
        raise PickleError(f"global {module[:80]!r} {name[:80]!r}: {found.reason}",
                          offset=offset)
    return found.module, found.name


def _refusal_hint(qualname: str, reason: str) -> str:
    """What to do about a refused global: names no real object has cannot be allowed."""
    if reason.startswith(("is not a valid", "reaches a dunder", "walks attributes")):
        return ("no class has such a name; only an attack writes one: do not torch.load "
                "this file")
    if reason.startswith("is outside the rebuild rules (strict"):
        return (f"strict mode refuses every name outside the rebuild rules; without it the "
                f"name is kept as an inert record, or allow this one alone: "
                f"allow_globals=['{qualname}'] / --allow-global {qualname}")
    return (f"do not torch.load this file: loading it would call {qualname}. If you trust "
            f"it and need its contents, torchless.open(FILE, allow_globals=['{qualname}']) "
            f"or --allow-global {qualname} (inspect, convert, verify) keeps the name as an "
            f"inert record (never called)")
