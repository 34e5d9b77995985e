"""The tree skeleton the corpus benchmark compares: what torch's object is made of, and what
``torchless.load``'s is, in one shape, so that the two sides compare as JSON values.

One rule for both sides (``of_torch`` at build time in the corpus venv, ``of_torchless`` at
measure time):

* a dict (``dict``, ``OrderedDict``, ``defaultdict`` ...) is ``{"d": [[key, skeleton], ...]}``
  in its order, each key as its name segment (``str`` as itself, numbers by ``str()``);
* a list, tuple or deque is ``{"l": [skeleton, ...]}``; a set ``{"set": n}`` (members have
  no order);
* a tensor is ``"T dtype shape"`` (torch's dtype name); a sparse, quantized, nested or meta
  tensor (torchless: a ``TensorRecord``) ``"record"``; a storage ``"storage"``;
* ``None``, ``bool``, ``int``, ``float``, ``complex``, ``str`` and ``bytes`` are their
  ``repr`` (their values compare, not only their types);
* a class, function or dtype the object names is ``{"g": "module.name"}``;
* a NumPy array is a tensor (``"T dtype shape"``), a NumPy scalar ``"np dtype value"``;
  ``torch.Size`` is the list of its sizes and ``torch.device`` its text (``"'cpu'"``), as
  torchless documents it gives them;
* any other object (a module saved whole, a config, a dataclass ...) is
  ``{"o": "module.qualname", "a": arguments, "s": state, "i": items, "di": dict items}`` from
  what pickling it saves: torch's ``obj.__reduce_ex__(2)`` (for a module its ``__dict__``),
  torchless's ``Opaque`` (``args``, ``state``, ``items``, ``dict_items``); the empty parts are
  left out. A dict state and a ``(dict, slots)`` state both compare as one dict, its keys
  sorted: the attributes torch's object has come in the order its code set them (an
  ``__init__`` that runs on load sets some first), the file's in the order it saved them.

A TorchScript module (``torch.load`` of a ``torch.jit.save`` file gives one) is its
``state_dict()``, which is what torchless documents it reads of such a file.

A path that goes round a cycle is ``"cycle"``; past ``MAX_DEPTH`` levels ``"deep"``.
"""

from __future__ import annotations

from typing import Any

MAX_DEPTH = 60


def key_name(key: Any) -> str:
    if type(key) is str:
        return key
    if isinstance(key, bytes):
        return key.decode("utf-8", "backslashreplace")
    if type(key) in (int, float, bool) or key is None:
        return str(key)
    return repr(key)


_PRIMITIVES = (type(None), bool, int, float, complex, str, bytes)


def _state(state: Any, walk: Any, depth: int) -> Any:
    if (
        isinstance(state, tuple)
        and len(state) == 2
        and isinstance(state[1], dict)
        and (state[0] is None or isinstance(state[0], dict))
    ):
        merged: dict[Any, Any] = {}
        for part in state:
            if part:
                merged.update(part)
        state = merged
    if isinstance(state, dict):
        return {
            "d": sorted(
                ([key_name(k), walk(v, depth)] for k, v in state.items()), key=lambda kv: kv[0]
            )
        }
    return walk(state, depth)


def _object(
    cls: str, args: Any, state: Any, items: Any, dict_items: Any, walk: Any, depth: int
) -> dict[str, Any]:
    out: dict[str, Any] = {"o": cls}
    if args:
        out["a"] = [walk(a, depth) for a in args]
    if state is not None:
        out["s"] = _state(state, walk, depth)
    if items:
        out["i"] = [walk(v, depth) for v in items]
    if dict_items:
        out["di"] = [[key_name(k), walk(v, depth)] for k, v in dict_items]
    return out


# ---- torch's side -----------------------------------------------------------------------------


def of_torch(root: Any) -> Any:
    import collections
    import copyreg
    import types

    import numpy as np
    import torch

    active: set[int] = set()
    dicts = (dict, collections.OrderedDict, collections.defaultdict, collections.Counter)

    def path_of(obj: Any) -> str:
        if isinstance(obj, types.BuiltinFunctionType):
            # torch.zeros_like pickles as getattr(torch._C._VariableFunctionsClass, name):
            # named as pickle names it
            try:
                r = obj.__reduce_ex__(2)
            except Exception:
                r = None
            if isinstance(r, tuple) and r[0] is getattr and isinstance(r[1][0], type):
                owner, name = r[1]
                return f"{owner.__module__}.{owner.__qualname__}.{name}"
        return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', '?')}"

    def walk(obj: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            return "deep"
        if isinstance(obj, _PRIMITIVES) and type(obj) in _PRIMITIVES:
            return repr(obj)
        if isinstance(obj, torch.Tensor):
            if (
                obj.layout != torch.strided
                or obj.is_quantized
                or obj.is_nested
                or obj.device.type == "meta"
            ):
                return "record"
            return f"T {str(obj.dtype).removeprefix('torch.')} {list(obj.shape)}"
        if isinstance(obj, (torch.TypedStorage, torch.UntypedStorage)):
            return "storage"
        if isinstance(obj, np.ndarray) and obj.dtype.kind in "biufc?":
            return f"T {obj.dtype.name} {list(obj.shape)}"
        if isinstance(obj, np.generic):
            return f"np {obj.dtype.name} {obj.item()!r}"
        if isinstance(obj, torch.Size):
            return {"l": [repr(int(n)) for n in obj]}
        if isinstance(obj, torch.device):
            return repr(str(obj))
        if isinstance(obj, torch.jit.ScriptModule):  # TorchScript: its state_dict (formats.md)
            return walk(dict(obj.state_dict()), depth)
        if isinstance(obj, torch.dtype):
            return {"g": str(obj)}
        if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
            return {"g": path_of(obj)}
        if id(obj) in active:
            return "cycle"
        active.add(id(obj))
        try:
            if type(obj) in dicts:
                return {"d": [[key_name(k), walk(v, depth + 1)] for k, v in obj.items()]}
            if type(obj) in (list, tuple, collections.deque):
                return {"l": [walk(v, depth + 1) for v in obj]}
            if type(obj) in (set, frozenset):
                return {"set": len(obj)}
            try:
                r = obj.__reduce_ex__(2)
            except Exception:
                return {"o": path_of(type(obj)), "s": "unpicklable"}
            if isinstance(r, str):
                return {"g": f"{type(obj).__module__}.{r}"}
            func, args = r[0], tuple(r[1])
            state = r[2] if len(r) > 2 else None
            items = list(r[3]) if len(r) > 3 and r[3] is not None else []
            dict_items = list(r[4]) if len(r) > 4 and r[4] is not None else []
            if func is copyreg.__newobj__:
                cls, args = args[0], args[1:]
            elif func is copyreg.__newobj_ex__:
                cls, args = args[0], tuple(args[1]) + tuple(dict(args[2]).values())
            elif func is copyreg._reconstructor:
                cls, args = args[0], args[2:] if args[2:] != (None,) else ()
            else:
                cls = func
            return _object(path_of(cls), args, state, items, dict_items, walk, depth + 1)
        finally:
            active.discard(id(obj))

    return walk(root, 0)


# ---- torchless's side -------------------------------------------------------------------------


def of_torchless(root: Any) -> Any:
    import numpy as np

    import torchless
    from torchless.pickle.values import NOTSET

    active: set[int] = set()
    numpy_to_torch = {
        "float64": "float64",
        "float32": "float32",
        "float16": "float16",
        "bfloat16": "bfloat16",
        "int64": "int64",
        "int32": "int32",
        "int16": "int16",
        "int8": "int8",
        "uint8": "uint8",
        "bool": "bool",
        "complex64": "complex64",
        "complex128": "complex128",
        "uint16": "uint16",
        "uint32": "uint32",
        "uint64": "uint64",
    }

    def walk(obj: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            return "deep"
        if isinstance(obj, _PRIMITIVES) and type(obj) in _PRIMITIVES:
            return repr(obj)
        if isinstance(obj, np.ndarray):
            name = numpy_to_torch.get(obj.dtype.name, obj.dtype.name)
            return f"T {name} {list(obj.shape)}"
        if isinstance(obj, np.generic):
            return f"np {obj.dtype.name} {obj.item()!r}"
        if isinstance(obj, torchless.TensorRecord):
            return "record"
        if isinstance(obj, torchless.Global):
            return {"g": obj.path}
        if isinstance(obj, torchless.DType):
            return {"g": f"torch.{obj.name}"}
        if id(obj) in active:
            return "cycle"
        active.add(id(obj))
        try:
            if isinstance(obj, dict):
                return {"d": [[key_name(k), walk(v, depth + 1)] for k, v in obj.items()]}
            if isinstance(obj, (list, tuple)):
                return {"l": [walk(v, depth + 1) for v in obj]}
            if isinstance(obj, (set, frozenset)):
                return {"set": len(obj)}
            if isinstance(obj, torchless.Opaque):
                state = None if obj.state is NOTSET else obj.state
                args = tuple(obj.args) + tuple((obj.kwargs or {}).values())
                return _object(
                    obj.class_path, args, state, obj.items, obj.dict_items, walk, depth + 1
                )
            return {"o": f"{type(obj).__module__}.{type(obj).__qualname__}", "s": "python"}
        finally:
            active.discard(id(obj))

    return walk(root, 0)


def first_difference(a: Any, b: Any, where: str = "") -> str | None:
    """Where two skeletons first differ (None if equal), for the failure list."""
    if a == b:
        return None
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        for k in a:
            if k == "d":
                ka, kb = [x[0] for x in a["d"]], [x[0] for x in b["d"]]
                if ka != kb:
                    return (
                        f"{where or '<root>'}: keys {ka[:8]}{'...' if len(ka) > 8 else ''}"
                        f" != {kb[:8]}{'...' if len(kb) > 8 else ''}"
                    )
                for (key, va), (_, vb) in zip(a["d"], b["d"], strict=True):
                    d = first_difference(va, vb, f"{where}.{key}" if where else key)
                    if d:
                        return d
            elif k == "l":
                if len(a["l"]) != len(b["l"]):
                    return f"{where or '<root>'}: {len(a['l'])} items != {len(b['l'])}"
                for i, (va, vb) in enumerate(zip(a["l"], b["l"], strict=True)):
                    d = first_difference(va, vb, f"{where}.{i}" if where else str(i))
                    if d:
                        return d
            elif a[k] != b[k]:
                d = first_difference(a[k], b[k], where)
                return d if d else f"{where or '<root>'}: {k} {a[k]!r:.80} != {b[k]!r:.80}"
        return None
    return f"{where or '<root>'}: torch {_short(a)} != torchless {_short(b)}"


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 120 else text[:117] + "..."
