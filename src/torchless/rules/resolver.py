"""Reconstruction rules: what torch's, the stdlib's and NumPy's pickled callables mean.

A table keyed by ``(module, name)`` maps each global we understand to a
rebuild function that turns the (already inert) arguments into a safe value:
tensors, OrderedDicts, sets, datetimes, Namespaces, NumPy arrays … Nothing is
ever imported from a name found in a file; the table holds our own code.

Every other global is judged by :mod:`._policy` and, if it may stand, stays an
inert :class:`Global`; calls on it become :class:`Opaque` records.
"""

from __future__ import annotations

import _compat_pickle
import argparse
import collections
import re
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from torchless.core import dtypes as _dtypes
from torchless.core.dtypes import DType, StorageType
from torchless.core.limits import Limits
from torchless.errors import (
    CheckpointError,
    PickleError,
    StorageError,
    UnsafeGlobalError,
    type_phrase,
)
from torchless.model.tensor import (
    DATALESS,
    MissingStorage,
    Storage,
    Tensor,
    UnsupportedTensor,
    make_tensor,
)
from torchless.pickle.known import Known, Pending
from torchless.pickle.values import Global, Opaque
from torchless.rules.arrays import NumpyRules
from torchless.rules.policy import judge
from torchless.rules.stdlib import StdlibRules, system_zone

__all__ = ["GlobalRecord", "Pending", "StorageType", "TorchResolver"]


@dataclass(frozen=True)
class GlobalRecord:
    """A global the file named, where, and what became of it."""

    module: str
    name: str
    offset: int
    verdict: Literal["rebuilt", "opaque"]


_UNSUPPORTED_TENSORS = {
    "_rebuild_sparse_tensor": "sparse",
    "_rebuild_sparse_csr_tensor": "sparse",
    "_rebuild_nested_tensor": "nested",
    "_rebuild_qtensor": "quantized",
    "_rebuild_meta_tensor_no_storage": "meta",
    "_rebuild_wrapper_subclass": "wrapper-subclass",
    "_rebuild_xla_tensor": "XLA",
    "_rebuild_mtia_tensor": "MTIA",
}

#: Tensor kinds rebuilt outside ``torch._utils``, and what they are.
_UNSUPPORTED_ELSEWHERE = {
    ("torch.nested._internal.nested_tensor", "_rebuild_njt"): "nested (jagged)",
    ("torch.nn.parameter", "UninitializedParameter"): "uninitialized parameter",
    ("torch.nn.parameter", "UninitializedBuffer"): "uninitialized buffer",
}

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
    ("re", "_compile"): "opaque",
    ("torch.serialization", "_get_layout"): "layout",
    # a Generator saved whole: its state (a ByteTensor, seed, offset) is set by BUILD
    ("torch._C", "Generator"): "opaque",
    ("builtins", "getattr"): "getattr",
    ("zoneinfo", "ZoneInfo._unpickle"): "zoneinfo",
    # torch 0.3/0.4 full-model saves pickle each module's _backend through this call
    ("torch.nn.backends.thnn", "_get_thnn_function_backend"): "opaque",
    ("numpy.random._pickle", "__randomstate_ctor"): "opaque",
    ("numpy.random._pickle", "__generator_ctor"): "opaque",
    ("numpy.random._pickle", "__bit_generator_ctor"): "opaque",
}
for _n in _UNSUPPORTED_TENSORS:
    _RULES[("torch._utils", _n)] = "unsupported_tensor"
for _mn in _UNSUPPORTED_ELSEWHERE:
    _RULES[_mn] = "unsupported_tensor"
for _n in ("set", "frozenset", "complex", "slice", "bytearray", "bytes", "list", "dict",
           "tuple", "int", "float", "str", "bool", "range", "object"):
    _RULES[("builtins", _n)] = "builtin"
for _n in ("datetime", "date", "time", "timedelta", "timezone"):
    _RULES[("datetime", _n)] = "datetime"
for _n in ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"):
    _RULES[("pathlib", _n)] = "path"

#: torch attributes that are plain enumeration values (layouts, memory formats, qschemes).
_TORCH_CONSTANTS = frozenset({
    "strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "_mkldnn",
    "jagged", "contiguous_format", "channels_last", "channels_last_3d", "preserve_format",
    "per_tensor_affine", "per_channel_affine", "per_tensor_symmetric", "per_channel_symmetric",
    "per_channel_affine_float_qparams",
})
_MODULE_RENAMES = {"torch.tensor": "torch._tensor"}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_LAYOUTS = frozenset({"strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr",
                      "sparse_bsc", "_mkldnn", "jagged"})
class TorchResolver(StdlibRules, NumpyRules):
    """Rebuilds what the rules know, judges every other global, keeps the rest inert."""

    def __init__(
        self,
        limits: Limits,
        persistent_load: Callable[[Any, int], Any] | None = None,
        *,
        strict: bool = False,
        allow: frozenset[str] = frozenset(),
    ) -> None:
        self.limits = limits
        self._persistent_load = persistent_load
        self.strict = strict
        self.allow = allow
        self.globals: list[GlobalRecord] = []

    # ---- names ----------------------------------------------------------------------

    def find_global(self, module: str, name: str, offset: int) -> Any:
        if module in ("__builtin__", "copy_reg"):
            self.python2_strings = True
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        module = _MODULE_RENAMES.get(module, module)
        value = self._known(module, name, offset)
        reason = judge(module, name, known=value is not None, strict=self.strict,
                       allow=self.allow)
        if reason is not None:
            raise UnsafeGlobalError(f"refused global {module}.{name}: it {reason}",
                                    names=(f"{module}.{name}",), offset=offset,
                                    hint=_refusal_hint(f"{module}.{name}", reason))
        self.globals.append(GlobalRecord(module, name, offset,
                                         "opaque" if value is None else "rebuilt"))
        return Global(module, name, offset) if value is None else value

    def _known(self, module: str, name: str, offset: int | None = None) -> Any:
        rule = _RULES.get((module, name))
        if rule is not None:
            return Known(module, name, rule=rule)
        if module == "torch.return_types" and _IDENTIFIER.match(name):
            # struct sequences (torch.max(x, 1) …): a tuple of tensors with field names
            return Known(module, name, rule="opaque")
        if module.startswith("torch") and name.endswith("Storage") and "." not in name:
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
            if name in _TORCH_CONSTANTS:
                return Global(module, name)
        return None

    def extension(self, code: int, offset: int) -> Any:
        raise UnsafeGlobalError(
            f"refused copyreg extension code {code}: it names a global through the loading "
            "process's extension registry", names=(f"copyreg.extension:{code}",), offset=offset,
            hint="torch.save never writes extension codes; what they name depends on the "
                 "loading process, so do not torch.load this file")

    # ---- calls ----------------------------------------------------------------------

    def call(self, func: Any, args: Any, offset: int) -> Any:
        if isinstance(func, Known):
            try:
                return getattr(self, "_r_" + func.rule)(func, args)
            except CheckpointError as e:
                if e.offset is None:
                    e.offset = offset
                raise
            except (TypeError, ValueError, OverflowError, UnicodeError) as e:
                raise PickleError(f"bad arguments for {func}: {e}", offset=offset) from None
        if isinstance(func, Opaque):
            if _calls_a_method(func):
                raise UnsafeGlobalError(
                    "refused call of an attribute of an object the file builds "
                    f"(getattr(…, {_method_name(func)!r})(…)): torch.load would call that "
                    "method", names=("builtins.getattr",), offset=offset,
                    hint=_METHOD_CALL_HINT)
            made = self._call_partial(func, args, offset)
            if made is not None:
                return made
        if isinstance(func, (Global, Opaque)):
            return Opaque(func, args)
        raise PickleError(f"REDUCE of a non-callable {type(func).__name__}", offset=offset)

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

    def _old_tensor(self, cls: Known, state: tuple[Any, ...], offset: int) -> Any:
        """``torch.Tensor()`` then ``__setstate__``: the form torch wrote before
        ``_rebuild_tensor`` (``(storage, offset, size, stride)``; a Variable's
        ``(data, _, backward_hooks, requires_grad, _)``)."""
        is_parameter = cls.rule == "parameter_class"
        if len(state) == 4:
            storage = state[0]
            if isinstance(storage, MissingStorage):
                return DATALESS
            if not isinstance(storage, Storage):
                raise PickleError(f"old tensor state holds {type_phrase(storage)}, not a "
                                  "storage", offset=offset)
            t = make_tensor(storage, state[1], state[2], state[3], storage.dtype, self.limits)
            return t.with_flags(requires_grad=False, is_parameter=is_parameter) \
                if is_parameter else t
        data, requires_grad = state[0], state[3]
        if isinstance(data, UnsupportedTensor):
            return data
        if not isinstance(data, Tensor) or type(requires_grad) is not bool:
            raise PickleError("old Variable state is not (tensor, _, hooks, requires_grad, _)",
                              offset=offset)
        return data.with_flags(requires_grad=requires_grad, is_parameter=is_parameter)

    # ---- tensor rules ---------------------------------------------------------------

    def _r_rebuild_tensor(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) != 4:
            raise PickleError(f"{f} takes 4 arguments, got {len(a)}")
        storage = a[0]
        if isinstance(storage, MissingStorage):
            return DATALESS
        dtype = storage.dtype if isinstance(storage, Storage) else _dtypes.UINT8
        return make_tensor(storage, a[1], a[2], a[3], dtype, self.limits)

    def _tensor_flags(self, f: Known, requires_grad: Any, hooks: Any, metadata: Any) -> None:
        if type(requires_grad) is not bool:
            raise PickleError(f"{f}: requires_grad is {type_phrase(requires_grad)}")
        if hooks is not None and not isinstance(hooks, dict):
            raise PickleError(f"{f}: backward hooks are {type_phrase(hooks)}")
        if metadata is not None and not isinstance(metadata, dict):
            raise PickleError(f"{f}: metadata is {type_phrase(metadata)}")

    def _r_rebuild_tensor_v2(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) not in (6, 7):
            raise PickleError(f"{f} takes 6 or 7 arguments, got {len(a)}")
        metadata = a[6] if len(a) == 7 else None
        self._tensor_flags(f, a[4], a[5], metadata)
        if metadata and any(metadata.values()):
            return UnsupportedTensor("conjugate/negative-bit")
        storage = a[0]
        if isinstance(storage, MissingStorage):
            return DATALESS
        dtype = storage.dtype if isinstance(storage, Storage) else _dtypes.UINT8
        return make_tensor(storage, a[1], a[2], a[3], dtype, self.limits,
                           requires_grad=a[4])

    def _r_rebuild_tensor_v3(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) not in (7, 8):
            raise PickleError(f"{f} takes 7 or 8 arguments, got {len(a)}")
        metadata = a[7] if len(a) == 8 else None
        self._tensor_flags(f, a[4], a[5], metadata)
        if not isinstance(a[6], DType):
            raise PickleError(f"{f}: dtype is {type_phrase(a[6])}, not a torch dtype")
        if metadata and any(metadata.values()):
            return UnsupportedTensor("conjugate/negative-bit")
        if isinstance(a[0], MissingStorage):
            return DATALESS
        return make_tensor(a[0], a[1], a[2], a[3], a[6], self.limits, requires_grad=a[4])

    def _r_rebuild_parameter(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) not in (3, 4):
            raise PickleError(f"{f} takes 3 or 4 arguments, got {len(a)}")
        data, requires_grad = a[0], a[1]
        self._tensor_flags(f, requires_grad, a[2], None)
        if isinstance(data, UnsupportedTensor):
            return data
        if not isinstance(data, Tensor):
            raise PickleError(f"{f}: data is {type_phrase(data)}, not a tensor")
        return data.with_flags(requires_grad=requires_grad, is_parameter=True,
                               attrs=_attrs(f, a[3]) if len(a) == 4 else None)

    def _r_rebuild_from_type(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) not in (3, 4):
            raise PickleError(f"{f} takes 3 or 4 arguments, got {len(a)}")
        func, new_type, args = a[0], a[1], a[2]
        if not isinstance(args, tuple):
            raise PickleError(f"{f}: arguments are not a tuple")
        value = self.call(func, args, -1)
        if isinstance(value, Tensor):
            attrs = _attrs(f, a[3]) if len(a) == 4 else None
            is_parameter = value.is_parameter or (
                isinstance(new_type, Known) and new_type.rule == "parameter_class")
            if attrs or is_parameter != value.is_parameter:
                return value.with_flags(requires_grad=value.requires_grad,
                                        is_parameter=is_parameter, attrs=attrs)
        return value

    def _r_layout(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) != 1 or type(a[0]) is not str or not a[0].startswith("torch.") \
                or a[0][6:] not in _LAYOUTS:
            raise PickleError(f"{f} takes the name of a torch layout")
        return Global("torch", a[0][6:])

    def _r_getattr(self, f: Known, a: tuple[Any, ...]) -> Any:
        """``getattr(Class, "Inner")``: how protocols < 4 name a nested class or a class's
        function; resolved here, by name, into the global ``Class.Inner`` (judged like any
        global). ``getattr(cls, "__new__")`` is the first half of ``cls.__new__(cls, …)``."""
        if len(a) != 2 or type(a[1]) is not str or not _IDENTIFIER.match(a[1]) or (
                a[1].startswith("__") and (a[1] != "__new__" or not isinstance(a[0], Global))):
            raise UnsafeGlobalError(
                "refused global builtins.getattr: it is asked for something other than a plain "
                "attribute name", names=("builtins.getattr",),
                hint=_METHOD_CALL_HINT)
        if not isinstance(a[0], Global):
            # an attribute of an object the file builds (a bound method a module keeps as a
            # hook): kept as a record; calling it is refused (see call)
            return Opaque(f, a)
        target, attr = a[0], a[1]
        if attr == "__new__":
            return Known(target.module, f"{target.name}.__new__", rule="class_new")
        return self.find_global(target.module, f"{target.name}.{attr}", target.offset)

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

    def _r_device_tensor(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) != 4 or not isinstance(a[0], Tensor) or a[1] != a[0].dtype:
            return UnsupportedTensor("device-converted")
        return a[0].with_flags(requires_grad=bool(a[3]), is_parameter=False)

    def _r_unsupported_tensor(self, f: Known, a: tuple[Any, ...]) -> Any:
        kind = _UNSUPPORTED_ELSEWHERE.get((f.module, f.name)) or _UNSUPPORTED_TENSORS[f.name]
        return UnsupportedTensor(kind)

    def _r_size(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) != 1 or not isinstance(a[0], (tuple, list)) \
                or any(type(x) is not int for x in a[0]):
            raise PickleError("torch.Size takes one sequence of ints")
        return tuple(a[0])

    def _r_device(self, f: Known, a: tuple[Any, ...]) -> Any:
        if not a or type(a[0]) is not str or len(a) > 2:
            raise PickleError("torch.device takes a type string and an optional index")
        if len(a) == 2 and a[1] is not None:
            if type(a[1]) is not int:
                raise PickleError("torch.device index must be an int")
            return f"{a[0]}:{a[1]}"
        return a[0]

    def _r_str(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) != 1 or type(a[0]) is not str:
            raise PickleError(f"{f} takes one str")
        return a[0]

    def _r_identity(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) != 1 or not isinstance(a[0], list):
            raise PickleError(f"{f} takes one list")
        return a[0]

    def _r_first(self, f: Known, a: tuple[Any, ...]) -> Any:
        if len(a) != 2:
            raise PickleError(f"{f} takes 2 arguments")
        return a[0]

    def _r_tensor_class(self, f: Known, a: tuple[Any, ...]) -> Any:
        return Opaque(f, a)

    _r_parameter_class = _r_tensor_class
    _r_opaque = _r_tensor_class


def _attrs(f: Known, state: Any) -> dict[str, Any] | None:
    """The Python attributes torch's ``_set_obj_state`` would set on a tensor: a ``__dict__``,
    or a ``(__dict__, slots)`` pair. Any other state (a subclass with its own
    ``__setstate__``) is kept whole as the attribute ``state``."""
    parts = list(state) if (type(state) is tuple and len(state) == 2) else [state]
    if not all(p is None or (isinstance(p, dict) and all(type(k) is str for k in p))
               for p in parts):
        return {"state": state}
    attrs: dict[str, Any] = {}
    for part in parts:
        if part:
            attrs.update(part)
    return attrs or None


_METHOD_CALL_HINT = (
    "torch.load would call a method of an object this file builds (how gadget chains run "
    "code): do not torch.load it. Nothing here can allow it; a method the file only keeps "
    "as a value (a module's hook) is read as an inert record")


def _calls_a_method(func: Opaque) -> bool:
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


def _method_name(func: Opaque) -> str:
    current: Any = func
    while isinstance(current, Opaque) and not (
            isinstance(current.callable, Known) and current.callable.rule == "getattr"):
        state = current.state
        current = state[0] if isinstance(state, tuple) and state else current.args[0]
    return str(current.args[1]) if isinstance(current, Opaque) and len(current.args) == 2 \
        else "?"


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
