"""The one walker: every place a loaded object can hold a value, and the name each place gives.

Every traversal of a loaded object (finishing it, naming its tensors, finding one by name,
showing its values, encoding it in the inert format) asks :func:`children`, so they all see
the same graph. A place that no walk knew of was, each time, a tensor that silently vanished.

Flat names join the segments :func:`children` gives with ``"."`` (``docs/formats.md``):

- dict and its subclasses: the key (``str`` as is; ``int``, ``float``, ``bool``, ``None`` as
  ``str()``; ``bytes`` decoded UTF-8 with backslash escapes; other scalars ``repr()``). A key
  that is not plain data (a tensor, an object) names its entry by position ``i``: the key is
  ``i.0``, the value ``i.1``. Attributes of a dict subclass (an OrderedDict's ``_metadata``)
  by attribute name.
- list, tuple, deque, an object ndarray: the index.
- set and frozenset: the index in a canonical order (:func:`_canonical`), so that names do
  not depend on hash order.
- argparse.Namespace, types.SimpleNamespace, a tensor's Python attributes: the attribute.
- an :class:`Opaque` record, as pickle described the object: a tuple subclass made by
  ``NEWOBJ`` with no state (a namedtuple, ``PackedSequence``; at protocols 0 and 1
  ``copyreg._reconstructor(cls, tuple, fields)``) and a ``torch.return_types``
  struct sequence are sequences (``p.0``); otherwise the keys of a dict state, of both dicts
  of a ``(dict, slots)`` state, the indices of a list or tuple state, ``state`` for any other
  state (a module's pickled ``__dict__`` too, except that its ``_parameters``, ``_buffers``
  and ``_modules`` add no segment: a module record names its tensors as ``state_dict()``
  does), ``args.i`` for constructor arguments, ``kwargs.k`` for keyword arguments,
  the index for APPENDed items and the key for SETITEMs; ``callable`` for a call made on the
  result of another call.

A reference that is part of the graph but names nothing of its own (the class an object
names, a plain dict key) comes with the name ``None``: walks that count or finish every
object still see it. A reference named ``""`` adds no segment: the names inside it are the
parent's own (an object's state dict, whose keys are the object's attribute names).
"""

from __future__ import annotations

import argparse
import collections
import types
from collections.abc import Callable, Iterator
from operator import length_hint
from typing import Any

from torchless.core.limits import Limits
from torchless.core.ndarrays import is_ndarray
from torchless.errors import LimitError
from torchless.model.tensor import Tensor, UnsupportedTensor
from torchless.pickle.known import Known, Pending
from torchless.pickle.values import NOTSET, Global, Opaque

__all__ = ["LEAVES", "MODULE_DICTS", "NODES", "arg_names", "children", "depth_first",
           "entry_name", "is_module_state", "is_node", "key_text", "plain_key"]

#: Values that hold other values (and an object ndarray: :func:`is_node`).
NODES: tuple[type, ...] = (dict, list, tuple, set, frozenset, collections.deque,
                           argparse.Namespace, types.SimpleNamespace, Opaque, Pending, Tensor)
#: Values that are tensors for naming (a Tensor is both: its attributes are children).
LEAVES: tuple[type, ...] = (Tensor, UnsupportedTensor)

_SCALARS = (str, int, float, bool, bytes, complex, type(None))

#: The entries of an ``nn.Module``'s ``__dict__`` that hold its parameters, buffers and
#: submodules by name.
MODULE_DICTS = ("_parameters", "_buffers", "_modules")


def is_module_state(state: Any) -> bool:
    """Whether a record's state is an ``nn.Module``'s pickled ``__dict__``: a dict whose
    ``_parameters``, ``_buffers`` and ``_modules`` are dicts."""
    return (type(state) is dict and isinstance(state.get("_parameters"), dict)
            and isinstance(state.get("_buffers"), dict)
            and isinstance(state.get("_modules"), dict))  # MODULE_DICTS, unrolled


#: Plain containers: nodes while they hold anything.
_CONTAINERS = frozenset({dict, list, tuple, set, frozenset})
#: Exact types that are never nodes (most values of a loaded tree): decided at once.
_NEVER_NODES = frozenset({str, int, float, bool, bytes, complex, type(None), Global, Known})


def is_node(obj: Any) -> bool:
    """Whether ``obj`` holds other values: containers and records that hold any, a tensor
    with Python attributes, an object ndarray. An empty container holds none: it has no
    :func:`children` and walks pass it as a value (a module's dozen empty hook dicts)."""
    kind = type(obj)
    if kind in _CONTAINERS:
        return len(obj) > 0
    if kind is Opaque:
        return True
    if kind is collections.OrderedDict:  # an empty one may still hold attributes
        return len(obj) > 0 or len(obj.__dict__) > 0
    if kind is Tensor:
        return bool(obj.attrs)
    if kind in _NEVER_NODES:
        return False
    if is_ndarray(obj):
        return obj.dtype.hasobject and obj.dtype.fields is None
    return isinstance(obj, NODES)


#: The most values a plain key may hold: a longer one (a tuple reached through many paths
#: holds 3**20 values in a hundred bytes) names its entry by position, not by a repr of that
#: size.
MAX_KEY_VALUES = 4096


def plain_key(key: Any) -> bool:
    """Whether a dict key is plain data (scalars, and tuples or frozensets of them, of at
    most :data:`MAX_KEY_VALUES` values in all), which names its value; any other key names
    its entry by position."""
    stack = [key]
    seen = 0
    while stack:
        k = stack.pop()
        seen += 1
        if seen > MAX_KEY_VALUES:
            return False
        if isinstance(k, (tuple, frozenset)):
            stack.extend(k)
        elif not isinstance(k, _SCALARS) or isinstance(k, Global):
            return False
    return True


def key_text(key: Any) -> str:
    """The name segment of a plain dict key."""
    if type(key) is str:
        return key
    if type(key) is int or type(key) is bool or key is None or type(key) is float:
        return str(key)
    if isinstance(key, bytes):
        return key.decode("utf-8", "backslashreplace")
    try:
        return repr(key)
    except ValueError:  # an int too long for str(): the VM bounds them, but not every caller
        return f"<int of {key.bit_length()} bits>"


def entry_name(index: int, key: Any) -> str:
    """The name segment of the value of a mapping's entry number ``index``: the text of its
    key when the key is plain data, else its position (``i.1``; the key is ``i.0``). Every
    writer that names a value of a mapping (the inert encoder too) asks this."""
    if type(key) is str:
        return key
    return key_text(key) if plain_key(key) else f"{index}.1"


Child = tuple[str | None, Any]

_STR_ONLY = frozenset({str})


def _entries(mapping: Any) -> list[Child]:
    """The entries of a dict, each value named by its key (see the module docstring)."""
    if _STR_ONLY.issuperset(map(type, mapping)):
        return list(mapping.items())  # nearly every dict: str keys name their values
    return _items(mapping.items())


def _items(pairs: Any) -> list[Child]:
    """The entries of a mapping as ``(key, value)`` pairs, each value named by its key."""
    named: list[Child] = []
    for i, (k, v) in enumerate(pairs):
        if type(k) is str:
            named.append((k, v))
        elif plain_key(k):
            named.append((None, k))
            named.append((key_text(k), v))
        else:
            named.append((f"{i}.0", k))
            named.append((entry_name(i, k), v))
    return named


def _attrs(obj: Any) -> list[Child]:
    return [((k if type(k) is str else key_text(k)), v) for k, v in vars(obj).items()]


def _canonical(members: Any) -> list[Any]:
    """A set's members in an order that does not depend on hashes: plain values first by
    type and value, then tensors by storage and geometry, then other objects by class.
    (Members that compare equal by this key keep the set's order.)"""
    def order(v: Any) -> tuple[Any, ...]:
        if isinstance(v, Tensor):
            return (1, v.storage.key, v.storage_offset, v.shape, v.stride, v.dtype.name)
        if isinstance(v, Opaque):
            return (2, v.class_path, "")
        if isinstance(v, (str, bytes)):
            return (0, type(v).__name__, v)
        if type(v) in (int, float, bool):
            return (0, "number", float(v) if abs(v) < 2**53 else 0.0)
        return (3, type(v).__name__, "")

    try:
        return sorted(members, key=order)
    except TypeError:  # str against bytes never meets (type names differ); defensive
        return list(members)


def _state(state: Any) -> list[Child]:
    if isinstance(state, (dict, list, tuple)) and not _is_slots_pair(state):
        return [("", state)]  # its keys or indices name the object's values directly
    if isinstance(state, tuple):
        return [("", state[0]), ("", state[1])] if state[0] else [("", state[1])]
    return [("state", state)]


def _is_slots_pair(state: Any) -> bool:
    """``(__dict__ or None, {slot: value})``: what copyreg pickles for an object with
    ``__slots__``; both dicts name the object's attributes."""
    return (type(state) is tuple and len(state) == 2 and isinstance(state[1], dict)
            and (state[0] is None or isinstance(state[0], dict)))


def _is_sequence_record(obj: Opaque) -> bool:
    """A namedtuple-like record: ``cls.__new__(cls, *fields)`` and nothing else."""
    return (obj.newobj and obj.state is NOTSET and not obj.items and not obj.dict_items
            and not obj.kwargs)


def _is_reconstructed_tuple(obj: Opaque) -> bool:
    """``copyreg._reconstructor(cls, tuple, fields)``: how pickle protocols 0 and 1 write
    what protocol 2 writes as ``cls.__new__(cls, *fields)`` (a namedtuple,
    ``PackedSequence``), named the same way."""
    c, args = obj.callable, obj.args
    return (isinstance(c, Global) and c.module == "copyreg" and c.name == "_reconstructor"
            and len(args) == 3 and type(args[2]) is tuple and isinstance(args[1], Global)
            and args[1].module == "builtins" and args[1].name == "tuple"
            and obj.state is NOTSET and not obj.items and not obj.dict_items
            and not obj.kwargs)


def arg_names(obj: Opaque) -> list[str | None]:
    """The name segment of each of an :class:`Opaque` record's constructor arguments (see
    the module docstring): what :func:`children` gives them, for the inert encoder too."""
    c, args = obj.callable, obj.args
    if (isinstance(c, Global) and c.module == "torch.return_types" and args
            and isinstance(args[0], (tuple, list))):
        return ["", *(f"args.{i}" for i in range(1, len(args)))]
    if _is_reconstructed_tuple(obj):
        return [None, None, ""]  # the fields, named by their index
    if _is_sequence_record(obj):
        return [str(i) for i in range(len(args))]
    return [f"args.{i}" for i in range(len(args))]


def _opaque(obj: Opaque) -> list[Child]:
    c = obj.callable
    out: list[Child] = [(("callable" if isinstance(c, Opaque) else None), c)]
    if obj.args:
        out.extend(zip(arg_names(obj), obj.args, strict=True))
    if obj.kwargs:
        for k, v in obj.kwargs.items():
            out.append((None, k))
            out.append((f"kwargs.{key_text(k) if plain_key(k) else '?'}", v))
    state = obj.state
    if is_module_state(state):
        out.append((None, state))  # walked whole, named through its entries:
        out.extend([(("" if name in MODULE_DICTS else name), v)
                    for name, v in _entries(state)])
    elif state is not NOTSET:
        out.extend(_state(state))
    if obj.items:
        out.extend([(str(i), v) for i, v in enumerate(obj.items)])
    if obj.dict_items:
        out.extend(_items(obj.dict_items))
    return out


def children(obj: Any) -> list[Child]:
    """Every reference ``obj`` holds, in a fixed order, each with its name segment (None for
    a reference that names nothing of its own: a plain dict key, the class an object names).
    Values that are not :func:`nodes <is_node>` have none. A new list, made at once (a
    module's record has a few dozen: generators passing each along cost more than the walk
    did with them)."""
    kind = type(obj)
    if kind is Opaque:  # the commonest nodes first, by their exact types
        return _opaque(obj)
    if kind is dict:
        return _entries(obj)
    if isinstance(obj, dict):
        if hasattr(obj, "__dict__"):
            return _entries(obj) + _attrs(obj)
        return _entries(obj)
    if isinstance(obj, (list, tuple, collections.deque)):
        return [(str(i), v) for i, v in enumerate(obj)]
    if isinstance(obj, (set, frozenset)):
        return [(str(i), v) for i, v in enumerate(_canonical(obj))]
    if isinstance(obj, Opaque):
        return _opaque(obj)
    if isinstance(obj, Tensor):
        return _entries(obj.attrs) if obj.attrs else []
    if isinstance(obj, (argparse.Namespace, types.SimpleNamespace)):
        return _attrs(obj)
    if isinstance(obj, Pending):
        return [(None, obj.resolved())]  # the same value each time it is asked
    if is_ndarray(obj) and obj.dtype.hasobject and obj.dtype.fields is None:
        return [(str(i), v) for i, v in enumerate(obj.ravel(order="C"))]
    return []


def depth_first(root: Any, limits: Limits, post: Callable[[Any], None],
                back: Callable[[Any, int, Any], None] | None = None) -> None:
    """Walk the nodes reachable from ``root`` depth-first in child order, each once, calling
    ``post(node)`` after its children. An edge to a node still being walked (one that
    closes a cycle: Hydra's configs point every node back at its parent) is not followed;
    ``back(parent, position, child)`` is told of it. Iterative: deep nesting cannot overflow
    the stack; paths longer than ``limits.max_depth`` are refused."""
    if not is_node(root):
        return
    state: dict[int, bool] = {id(root): False}  # False while being walked, True when done
    kids = children(root)
    # each node with its children and the iterator over them (a child's position, wanted
    # only for an edge back, is what the iterator has left: no enumerate tuple per child)
    stack: list[tuple[Any, list[Child], Iterator[Child]]] = [(root, kids, iter(kids))]
    while stack:
        node, kids, it = stack[-1]
        for _, child in it:
            kind = type(child)
            if kind in _NEVER_NODES or (kind is Tensor and not child.attrs) \
                    or not is_node(child):
                continue
            seen = state.get(id(child))
            if seen is None:
                if len(stack) > limits.max_depth:
                    raise LimitError("max_depth", limits.max_depth, len(stack) + 1,
                                     "nested containers")
                state[id(child)] = False
                grandchildren = children(child)
                stack.append((child, grandchildren, iter(grandchildren)))
                break
            if not seen and back is not None:
                back(node, len(kids) - length_hint(it) - 1, child)
        else:
            stack.pop()
            state[id(node)] = True
            post(node)
