"""Walks over the object graph a pickle produced: finishing it and naming its tensors.

The graph is a DAG in general (the memo shares objects), so every walk here
is iterative (deep nesting cannot overflow the stack), visits each object
once (a value shared a million times costs one visit), and refuses cycles.
"""

from __future__ import annotations

import argparse
import collections
from collections.abc import Callable, Iterator
from typing import Any

from ._errors import LimitError, PickleError, type_phrase
from ._known import Pending
from ._limits import Limits
from ._tensor import Tensor, UnsupportedTensor
from ._values import NOTSET, Opaque

__all__ = ["ModuleDict", "finish", "flatten", "module_state_dict"]


class ModuleDict(collections.OrderedDict[str, Any]):
    """The ``state_dict()`` of a module saved whole; stands where the module was."""


ModuleHook = Callable[[Opaque], "ModuleDict | None"]

_CONTAINERS = (list, dict, tuple, Opaque, Pending, argparse.Namespace, collections.deque)
_LEAVES = (Tensor, UnsupportedTensor)


def _children(obj: Any) -> Iterator[Any]:
    if isinstance(obj, dict):
        yield from obj.values()
    elif isinstance(obj, (list, tuple, collections.deque)):
        yield from obj
    elif isinstance(obj, Opaque):
        yield obj.callable
        yield from obj.args
        if obj.kwargs:
            yield from obj.kwargs.values()
        if obj.state is not NOTSET:
            yield obj.state
        yield from obj.items
        for _, v in obj.dict_items:
            yield v
    elif isinstance(obj, argparse.Namespace):
        yield from vars(obj).values()


def module_state_dict(obj: Opaque) -> ModuleDict | None:
    """``nn.Module.state_dict()`` of a module saved whole, from its pickled ``__dict__``.

    Parameters, then persistent buffers, then each child's entries under
    ``child.``; ``None`` entries are skipped, as torch does. Children were
    already turned into ModuleDicts (the walk is post-order).
    """
    state = obj.state
    if not isinstance(state, dict):
        return None
    params, buffers, modules = (state.get(k) for k in ("_parameters", "_buffers", "_modules"))
    if not (isinstance(params, dict) and isinstance(buffers, dict) and isinstance(modules, dict)):
        return None
    non_persistent = state.get("_non_persistent_buffers_set") or ()
    if not isinstance(non_persistent, (set, frozenset, list, tuple)):
        non_persistent = ()
    out = ModuleDict()
    for name, value in params.items():
        if value is not None:
            out[str(name)] = value
    for name, value in buffers.items():
        if value is not None and name not in non_persistent:
            out[str(name)] = value
    for name, child in modules.items():
        if isinstance(child, ModuleDict):
            for key, value in child.items():
                out[f"{name}.{key}"] = value
    return out


def finish(
    root: Any,
    limits: Limits,
    module_hook: ModuleHook = module_state_dict,
    leaf: Callable[[Any], Any] | None = None,
) -> Any:
    """Resolve pending NumPy values, replace saved modules by their state dicts,
    and check depth and cycles. Mutable containers are updated in place.

    With ``leaf``, every tensor leaf is replaced by ``leaf(tensor)``."""
    if leaf is not None and isinstance(root, _LEAVES):
        return leaf(root)
    done: dict[int, Any] = {}
    active: set[int] = set()
    stack: list[tuple[Any, int, bool]] = [(root, 0, False)]
    while stack:
        obj, depth, expanded = stack.pop()
        oid = id(obj)
        if expanded:
            active.discard(oid)
            done[oid] = _rebuild(obj, done, module_hook, leaf)
            continue
        if oid in done or not isinstance(obj, _CONTAINERS):
            continue
        if oid in active:
            raise PickleError(f"the object graph contains a cycle ({type_phrase(obj)} "
                              "contains itself)",
                              hint="torch.save of a model or state dict never writes a "
                                   "container that holds itself: the file was made by "
                                   "another tool or by hand; torchless cannot flatten it")
        if depth > limits.max_depth:
            raise LimitError("max_depth", limits.max_depth, depth, "nested containers")
        active.add(oid)
        stack.append((obj, depth, True))
        if isinstance(obj, Pending):
            stack.append((obj.resolved(), depth, False))
            continue
        for child in _children(obj):
            if isinstance(child, _CONTAINERS) and id(child) not in done:
                stack.append((child, depth + 1, False))
    return done.get(id(root), root)


def _rebuild(obj: Any, done: dict[int, Any], module_hook: ModuleHook,
             leaf: Callable[[Any], Any] | None) -> Any:
    def new(v: Any) -> Any:
        if isinstance(v, _CONTAINERS):
            return done.get(id(v), v)
        if leaf is not None and isinstance(v, _LEAVES):
            return leaf(v)
        return v

    if isinstance(obj, Pending):
        return new(obj.resolved())
    if isinstance(obj, list):
        for i, v in enumerate(obj):
            obj[i] = new(v)
        return obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            nv = new(v)
            if nv is not v:
                obj[k] = nv
        return obj
    if isinstance(obj, tuple):
        items = tuple(new(v) for v in obj)
        return obj if all(a is b for a, b in zip(items, obj, strict=True)) else items
    if isinstance(obj, collections.deque):
        values = [new(v) for v in obj]
        obj.clear()
        obj.extend(values)
        return obj
    if isinstance(obj, argparse.Namespace):
        d = vars(obj)
        for k, v in d.items():
            d[k] = new(v)
        return obj
    assert isinstance(obj, Opaque)
    obj.callable = new(obj.callable)
    obj.args = tuple(new(v) for v in obj.args)
    if obj.kwargs:
        obj.kwargs = {k: new(v) for k, v in obj.kwargs.items()}
    if obj.state is not NOTSET:
        obj.state = new(obj.state)
    obj.items = [new(v) for v in obj.items]
    obj.dict_items = [(k, new(v)) for k, v in obj.dict_items]
    module = module_hook(obj)
    return obj if module is None else module


def _key(k: Any) -> str:
    if type(k) is str:
        return k
    if type(k) is int or type(k) is bool or k is None or type(k) is float:
        return str(k)
    if isinstance(k, bytes):
        return k.decode("utf-8", "backslashreplace")
    return repr(k)


def _named_children(obj: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield _key(k), v
    elif isinstance(obj, (list, tuple, collections.deque)):
        for i, v in enumerate(obj):
            yield str(i), v
    elif isinstance(obj, argparse.Namespace):
        yield from vars(obj).items()
    elif isinstance(obj, Opaque):
        if obj.state is not NOTSET:
            if isinstance(obj.state, (dict, list, tuple)):
                yield from _named_children(obj.state)
            else:
                yield "state", obj.state
        elif obj.args:
            for i, v in enumerate(obj.args):
                yield f"args.{i}", v
        for i, v in enumerate(obj.items):
            yield str(i), v
        for k, v in obj.dict_items:
            yield _key(k), v



def _tensor_counts(root: Any, limits: Limits) -> dict[int, int]:
    """Tensor names below each container, counted once per node (post-order, memoised).

    A DAG that reaches one tensor by 2^30 paths is refused here, in time linear in its
    size, before any name is built."""
    counts: dict[int, int] = {}
    chars: dict[int, int] = {}  # characters of the names below, relative to the node
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        obj, expanded = stack.pop()
        if expanded:
            n = size = 0
            for name, c in _named_children(obj):
                if isinstance(c, _LEAVES):
                    n += 1
                    size += len(name)
                elif isinstance(c, _CONTAINERS) and counts.get(id(c), 0):
                    below = counts[id(c)]
                    n += below
                    size += below * (len(name) + 1) + chars.get(id(c), 0)
            if n > limits.max_tensors:
                raise LimitError("max_tensors", limits.max_tensors, n,
                                 "tensor names, aliases included")
            if size > limits.max_name_bytes:
                raise LimitError("max_name_bytes", limits.max_name_bytes, size,
                                 "characters of the flat tensor names")
            counts[id(obj)] = n
            chars[id(obj)] = size
            continue
        if id(obj) in counts or not isinstance(obj, _CONTAINERS):
            continue
        counts[id(obj)] = 0  # placeholder: visited (finish() already refused cycles)
        stack.append((obj, True))
        for _, child in _named_children(obj):
            if isinstance(child, _CONTAINERS) and id(child) not in counts:
                stack.append((child, False))
    return counts


def flatten(
    root: Any, limits: Limits, root_name: str = ""
) -> tuple[dict[str, Tensor], dict[str, UnsupportedTensor]]:
    """Name every tensor by its path: dict keys and sequence indices joined with '.'."""
    tensors: dict[str, Tensor] = {}
    unsupported: dict[str, UnsupportedTensor] = {}
    if isinstance(root, _LEAVES):
        if isinstance(root, Tensor):
            tensors[root_name] = root
        else:
            unsupported[root_name] = root
        return tensors, unsupported
    counts = _tensor_counts(root, limits)
    count = 0
    stack: list[tuple[str, Any]] = [("", root)]
    while stack:
        full, obj = stack.pop()
        if isinstance(obj, _LEAVES):
            count += 1
            if count > limits.max_tensors:
                raise LimitError("max_tensors", limits.max_tensors, count,
                                 "tensor names, aliases included")
            if full in tensors or full in unsupported:
                raise PickleError(f"two tensors are both named {full!r}")
            if isinstance(obj, Tensor):
                tensors[full] = obj
            else:
                unsupported[full] = obj
            continue
        if not isinstance(obj, _CONTAINERS) or not counts.get(id(obj)):
            continue
        children = [(f"{full}.{name}" if full else name, child)
                    for name, child in _named_children(obj)
                    if isinstance(child, _LEAVES)
                    or (isinstance(child, _CONTAINERS) and counts.get(id(child)))]
        stack.extend(reversed(children))
    return tensors, unsupported


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
        if not isinstance(obj, _CONTAINERS) or id(obj) in seen:
            continue
        seen.add(id(obj))
        for child_name, child in _named_children(obj):
            path = f"{full}.{child_name}" if full else child_name
            if name == path or name.startswith(path + "."):
                stack.append((path, child))
    return _MISSING


MISSING = _MISSING
