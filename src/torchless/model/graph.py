"""Walks over the object graph a pickle produced: finishing it and naming its tensors.

The graph is a DAG in general (the memo shares objects) and may hold cycles (objects that
point back at their parents), so every walk here is iterative (deep nesting cannot overflow
the stack), visits each object once (a value shared a million times costs one visit), and
never follows an edge round a cycle. What a node's children are is :mod:`._walk`'s alone.
"""

from __future__ import annotations

import argparse
import collections
import types
from collections.abc import Callable
from typing import Any, Literal

from torchless.core.dtypes import DType
from torchless.core.limits import Limits
from torchless.core.ndarrays import is_ndarray
from torchless.errors import LimitError
from torchless.model.chunks import detached
from torchless.model.metrics import metric_states
from torchless.model.qmodules import quantized_conv, quantized_entries
from torchless.model.tensor import DATALESS, MissingStorage, Storage, Tensor, UnsupportedTensor
from torchless.model.walk import LEAVES, children, depth_first, is_module_state, is_node
from torchless.pickle.known import Known, Pending
from torchless.pickle.values import NOTSET, Global, Opaque

__all__ = ["ModuleDict", "ModuleMode", "finish", "flatten", "keep_modules", "module_state_dict"]


class ModuleDict(collections.OrderedDict[str, Any]):
    """The ``state_dict()`` of a module saved whole; stands where the module was.

    ``record`` is the module's own record (its ``__dict__``, whose submodules are their
    state dicts in turn) when it was read from one, for what describes the module
    (``inspect``'s summaries read ``names`` or ``config`` there). A slot, not an attribute:
    no walk sees it, so it names no tensor and is stored nowhere."""

    __slots__ = ("record",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.record: Opaque | None = None


ModuleHook = Callable[[Opaque], "ModuleDict | None"]

#: How a module saved whole stands in a loaded tree: ``"record"``, the :class:`Opaque`
#: record of its pickled ``__dict__`` (class, attributes, parameters, buffers, submodules);
#: ``"state_dict"``, its ``state_dict()`` (a :class:`ModuleDict`).
ModuleMode = Literal["record", "state_dict"]


def keep_modules(base: ModuleHook) -> ModuleHook:
    """The hook of ``modules="record"``: a module whose pickled ``__dict__`` holds its
    parameters, buffers and submodules stays that record, every attribute in it, its tensors
    named as ``state_dict()`` names them (:func:`~torchless.model.walk.is_module_state`);
    anything else is what ``base`` makes of it (a quantized conv's packed state, a
    TorchScript module: their ``state_dict()``)."""
    def hook(obj: Opaque) -> ModuleDict | None:
        return None if is_module_state(obj.state) else base(obj)

    return hook


def module_state_dict(obj: Opaque) -> ModuleDict | None:
    """``nn.Module.state_dict()`` of a module saved whole, from its pickled ``__dict__``.

    Parameters, then persistent buffers, then the entries torch's quantized modules add
    (:mod:`.qmodules`), then each child's entries under ``child.``, then a torchmetrics
    metric's persistent states (:mod:`.metrics`); ``None`` parameters and
    buffers are skipped, as torch does. Children were already turned into ModuleDicts (the
    walk is post-order); a child that could not be (a class with a ``__getstate__`` of its
    own) stays an inert record under its name.
    """
    state = obj.state
    if not isinstance(state, dict):
        conv = quantized_conv(obj)
        return None if conv is None else ModuleDict(conv)
    params, buffers, modules = state.get("_parameters"), state.get("_buffers"), \
        state.get("_modules")
    if not (isinstance(params, dict) and isinstance(buffers, dict) and isinstance(modules, dict)):
        return None
    non_persistent = state.get("_non_persistent_buffers_set") or ()
    if not isinstance(non_persistent, (set, frozenset, list, tuple)):
        non_persistent = ()
    out = ModuleDict()
    out.record = obj
    for name, value in params.items():
        if value is not None:
            out[str(name)] = value
    for name, value in buffers.items():
        if value is not None and name not in non_persistent:
            out[str(name)] = value
    for name, value in quantized_entries(obj, state):
        out[name] = value
    for name, child in modules.items():
        if isinstance(child, ModuleDict):
            for key, value in child.items():
                out[f"{name}.{key}"] = value
        elif isinstance(child, Opaque):  # its class pickles a state of its own: kept whole,
            out[str(name)] = child       # so that the tensors it holds are not lost
    for name, value in metric_states(obj, state):  # after the children: Metric.state_dict
        out[name] = value
    return out


def finish(
    root: Any,
    limits: Limits,
    module_hook: ModuleHook = module_state_dict,
    leaf: Callable[[Any], Any] | None = None,
    leaf_types: tuple[type, ...] = LEAVES,
) -> Any:
    """Resolve pending NumPy values, replace saved modules by their state dicts, turn storages
    held as values into 1-D tensors, make the rules' names left as values (``dict``,
    ``numpy.ndarray`` kept by reference, the callable of a record) plain :class:`Global`
    values, and check depth. Mutable containers are updated in place;
    cycles are kept (a reference back into a cycle is patched once its target is finished).

    With ``leaf``, every tensor leaf (every value of ``leaf_types``) is replaced by
    ``leaf(value)``."""
    done: dict[int, Any] = {}
    as_leaf: dict[int, Any] = {}
    back: list[tuple[Any, Any]] = []

    plain = _PLAIN if leaf is None else frozenset(
        t for t in _PLAIN if not issubclass(t, leaf_types))

    def new(v: Any) -> Any:
        kind = type(v)
        if kind in plain:  # most values: nothing to finish
            return v
        if kind is Tensor and not v.attrs:  # the commonest leaf: no node, no storage
            return leaf(v) if leaf is not None and isinstance(v, leaf_types) else v
        if is_node(v):
            v = done.get(id(v), v)
        elif type(v) is Known:  # a rule's name kept as a value (a class by reference)
            return _plain(v)
        if isinstance(v, (Storage, MissingStorage)):
            known = as_leaf.get(id(v))
            if known is None:
                known = as_leaf[id(v)] = (Tensor.of_storage(v) if isinstance(v, Storage)
                                          else DATALESS)
            v = known
        if leaf is not None and isinstance(v, leaf_types):
            v = leaf(v)
        return v

    alive: list[Any] = []  # every original stays alive, so that no id in done is reused

    def post(node: Any) -> None:
        alive.append(node)
        done[id(node)] = _rebuild(node, new, module_hook, plain)

    depth_first(root, limits, post, lambda parent, _, child: back.append((parent, child)))
    for parent, child in back:
        target = done.get(id(child), child)
        if target is not child:
            _rebuild(done.get(id(parent), parent), new, None, plain)
    return new(root)


#: Exact types of values :func:`finish` keeps as they are (never a node or a storage; a
#: leaf only if the caller's ``leaf_types`` say so).
_PLAIN: frozenset[type] = frozenset({str, int, float, bool, bytes, complex, type(None), Global})


def _plain(g: Known) -> Global:
    """The :class:`Global` a rule's name stands for once the pickle has run: a ``Known``
    compares unequal to the ``Global`` of the same name, and an inert file stores it as one."""
    return Global(g.module, g.name, g.offset)


def _hashable(new: Callable[[Any], Any], v: Any) -> Any:
    """``new(v)`` where it can stand in a set or as a dict key; a tensor whose leaf cannot
    (a NumPy array) stays a tensor, detached from the file."""
    out = new(v)
    if out is v:
        return v
    try:
        hash(out)
    except TypeError:
        return detached(v) if isinstance(v, Tensor) else v
    return out


def _rebuild(obj: Any, new: Callable[[Any], Any], module_hook: ModuleHook | None,
             kept: frozenset[type] = frozenset()) -> Any:
    """``obj`` with ``new`` applied to what it holds (``kept``: exact types of values
    ``new`` returns as they are, which need not be passed to it)."""
    kind = type(obj)
    if kind is Opaque:  # the commonest nodes first, by their exact types
        return _rebuild_opaque(obj, new, module_hook)
    if kind is dict:
        _rebuild_dict(obj, new, kept)
        return obj
    if isinstance(obj, Pending):
        return new(obj.resolved())
    if isinstance(obj, list):
        for i, v in enumerate(obj):
            obj[i] = new(v)
        return obj
    if isinstance(obj, dict):
        _rebuild_dict(obj, new, kept)
        if type(obj) is not dict and hasattr(obj, "__dict__"):
            _rebuild_attrs(vars(obj), new)
        return obj
    if isinstance(obj, tuple):
        items = tuple(new(v) for v in obj)
        return obj if all(a is b for a, b in zip(items, obj, strict=True)) else items
    if isinstance(obj, (set, frozenset)):
        members = [_hashable(new, v) for v in obj]
        if all(a is b for a, b in zip(members, obj, strict=True)):
            return obj
        if isinstance(obj, frozenset):
            return frozenset(members)
        obj.clear()
        obj.update(members)
        return obj
    if isinstance(obj, collections.deque):
        values = [new(v) for v in obj]
        obj.clear()
        obj.extend(values)
        return obj
    if isinstance(obj, (argparse.Namespace, types.SimpleNamespace)):
        _rebuild_attrs(vars(obj), new)
        return obj
    if isinstance(obj, Tensor):
        if obj.attrs:
            _rebuild_attrs(obj.attrs, new)
        return obj
    if is_ndarray(obj):
        import numpy as np

        for index in np.ndindex(obj.shape):
            obj[index] = new(obj[index])
        return obj
    assert isinstance(obj, Opaque)
    return _rebuild_opaque(obj, new, module_hook)


def _rebuild_opaque(obj: Opaque, new: Callable[[Any], Any],
                    module_hook: ModuleHook | None) -> Any:
    obj.callable = new(obj.callable)
    obj.args = tuple([new(v) for v in obj.args]) if obj.args else ()
    if obj.kwargs:
        obj.kwargs = {k: new(v) for k, v in obj.kwargs.items()}
    if obj.state is not NOTSET:
        obj.state = new(obj.state)
    obj.items = [new(v) for v in obj.items] if obj.items else []
    obj.dict_items = [(_hashable(new, k), new(v)) for k, v in obj.dict_items] \
        if obj.dict_items else []
    module = module_hook(obj) if module_hook is not None else None
    return obj if module is None else module


def _rebuild_attrs(attrs: dict[str, Any], new: Callable[[Any], Any]) -> None:
    for k, v in attrs.items():
        nv = new(v)
        if nv is not v:
            attrs[k] = nv


def _rebuild_dict(obj: dict[Any, Any], new: Callable[[Any], Any],
                  kept: frozenset[type] = frozenset()) -> None:
    keys_change = False
    for k, v in obj.items():
        if type(k) is not str and (is_node(k) or isinstance(k, (Tensor, Storage, DType, Global))) \
                and _hashable(new, k) is not k:
            keys_change = True
            break
        if type(v) in kept:  # new(v) is v (a module's flags, sizes and names)
            continue
        nv = new(v)
        if nv is not v:
            obj[k] = nv  # replacing a value keeps the order and the iteration valid
    if keys_change:
        items = [(_hashable(new, k), new(v)) for k, v in obj.items()]
        obj.clear()
        obj.update(items)


def _tensor_counts(root: Any, limits: Limits, cut: dict[int, set[int]]) -> dict[int, int]:
    """Tensor names below each node, counted once per node (post-order, memoised).

    A DAG that reaches one tensor by 2^30 paths is refused here, in time linear in its
    size, before any name is built."""
    counts: dict[int, int] = {}
    chars: dict[int, int] = {}  # characters of the names below, relative to the node

    def post(node: Any) -> None:
        n = size = 0
        skip = cut.get(id(node), ())
        for pos, (name, c) in enumerate(children(node)):
            if name is None or type(c) in _PLAIN or pos in skip:  # plain: no tensor below
                continue
            if isinstance(c, LEAVES):
                n += 1
                size += len(name)
            below = counts.get(id(c), 0) if is_node(c) else 0
            if below:
                n += below
                size += below * (len(name) + 1 if name else 0) + chars[id(c)]
        if n > limits.max_tensors:
            raise LimitError("max_tensors", limits.max_tensors, n,
                             "tensor names, aliases included")
        if size > limits.max_name_bytes:
            raise LimitError("max_name_bytes", limits.max_name_bytes, size,
                             "characters of the flat tensor names")
        counts[id(node)] = n
        chars[id(node)] = size

    depth_first(root, limits, post,
                lambda parent, pos, _: cut.setdefault(id(parent), set()).add(pos))
    return counts


def flatten(
    root: Any, limits: Limits, root_name: str = ""
) -> tuple[dict[str, Tensor], dict[str, UnsupportedTensor]]:
    """Name every tensor by its path: keys, indices and attributes joined with '.'
    (:mod:`._walk` gives each segment). A path never goes round a cycle; two different
    paths that spell the same name get ``~2``, ``~3`` … after it, in walk order."""
    flat = _flat_state_dict(root, limits, root_name)
    if flat is not None:
        return flat, {}
    tensors: dict[str, Tensor] = {}
    unsupported: dict[str, UnsupportedTensor] = {}
    cut: dict[int, set[int]] = {}
    counts = _tensor_counts(root, limits, cut)
    count = 0
    stack: list[tuple[str, Any]] = [(root_name, root)]
    while stack:
        full, obj = stack.pop()
        if isinstance(obj, LEAVES):
            count += 1
            if count > limits.max_tensors:
                raise LimitError("max_tensors", limits.max_tensors, count,
                                 "tensor names, aliases included")
            name = full
            n = 1
            while name in tensors or name in unsupported:
                n += 1
                name = f"{full}~{n}"
            if isinstance(obj, Tensor):
                tensors[name] = obj
            elif isinstance(obj, UnsupportedTensor):
                unsupported[name] = obj
        if not is_node(obj) or not counts.get(id(obj)):
            continue
        skip = cut.get(id(obj), ())
        kids = [(f"{full}.{name}" if full and name else full or name, child)
                for pos, (name, child) in enumerate(children(obj))
                if name is not None and type(child) not in _PLAIN and pos not in skip
                and (isinstance(child, LEAVES) or (is_node(child) and counts.get(id(child))))]
        stack.extend(reversed(kids))
    return tensors, unsupported


def _flat_state_dict(root: Any, limits: Limits, root_name: str) -> dict[str, Tensor] | None:
    """:func:`flatten` of the commonest tree, a plain dict of str keys and tensors without
    attributes, at once: each tensor is named by its key, in the dict's order, with the
    same limits checked (:func:`_tensor_counts`); None for any other tree. An OrderedDict or
    a :class:`ModuleDict` (a module saved whole, opened) without attributes is such a dict:
    :func:`~torchless.model.walk.children` gives it no other child."""
    kind = type(root)
    if root_name or not (kind is dict or (kind in _FLAT_MAPPINGS and not vars(root))):
        return None
    size = 0
    for key, value in root.items():
        if type(key) is not str or type(value) is not Tensor or value.attrs:
            return None
        size += len(key)
    if len(root) > limits.max_tensors:
        raise LimitError("max_tensors", limits.max_tensors, len(root),
                         "tensor names, aliases included")
    if size > limits.max_name_bytes:
        raise LimitError("max_name_bytes", limits.max_name_bytes, size,
                         "characters of the flat tensor names")
    return dict(root)


#: The dict subclasses :func:`_flat_state_dict` takes when they hold no attributes.
_FLAT_MAPPINGS = (collections.OrderedDict, ModuleDict)


_MISSING: Any = object()


def find(root: Any, name: str) -> Any:
    """The value whose flat name (as :func:`flatten` names things) is ``name``, or
    ``MISSING``. Only children whose names lead towards ``name`` are visited."""
    stack: list[tuple[str, Any]] = [("", root)]
    seen: set[int] = set()
    while stack:
        full, obj = stack.pop()
        if full == name and full:
            return obj
        if not is_node(obj) or id(obj) in seen:
            continue
        seen.add(id(obj))
        for child_name, child in children(obj):
            if child_name is None:
                continue
            path = f"{full}.{child_name}" if full and child_name else full or child_name
            if not path or name == path or name.startswith(path + "."):
                stack.append((path, child))
    return _MISSING


MISSING = _MISSING
