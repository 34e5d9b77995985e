"""Torch-side flat names: what the naming rule of issue 12 says torchless must list.

Given what ``torch.load`` returned, :func:`expected_names` walks it by the flat-name rule
(keys and indices joined by '.'; aliases named once per path; a path never goes round a
cycle; unknown objects by ``obj.__reduce_ex__(2)``; see the rule in the issue) and gives
every tensor and storage it reaches with what it is: a tensor (dtype, shape, sha256 of
its values laid out contiguously) or a kind torchless does not read (sparse, quantized,
nested, meta, uninitialized, wrapper subclass, conjugate/negative bit). It never calls
torchless: this is the independent side of the differential tests.

Set members have no name of their own in torch (a set has no order); the rule lets
torchless choose one. :func:`canonical` makes both sides comparable: it replaces each set
member's segment by a digest of what the member holds, so the members compare as a
multiset under the set's name.

Imports torch at top level (only through the ``torch`` fixture).
"""

from __future__ import annotations

import argparse
import collections
import copyreg
import hashlib
import re
import types
from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.nn.parameter import UninitializedTensorMixin

#: First character of a set member's segment in an expected name (torch gives it no name).
SET_MEMBER = "\x00"

_DICTS = (dict, collections.OrderedDict, collections.defaultdict, collections.Counter)
_NO_CHILDREN = (str, bytes, bytearray, int, float, complex, bool, type(None), type,
                types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                types.ModuleType, np.ndarray, np.generic, torch.dtype, torch.device,
                torch.layout, torch.memory_format, torch.qscheme, range, slice)


@dataclass(frozen=True)
class Leaf:
    """A tensor or storage torch's object reaches. ``kind`` is "tensor" or "unsupported"."""

    kind: str
    dtype: str = ""
    shape: tuple[int, ...] = ()
    sha256: str = ""
    why: str = field(default="", compare=False)

    def key(self, coarse: bool = False) -> Hashable:
        """What the comparison looks at: all of it, or (coarse) only that a leaf is there."""
        if coarse:
            return "leaf"
        if self.kind == "unsupported":
            return ("unsupported",)
        return ("tensor", self.dtype, self.shape, self.sha256)


@dataclass
class Expected:
    """``leaves``: (name, leaf) per path; ``sets``: (depth, regex) of every set's name, the
    member segments of outer sets as wildcards."""

    leaves: list[tuple[str, Leaf]]
    sets: list[tuple[int, str]]

    def entries(self, coarse: bool = False) -> list[tuple[str, Hashable]]:
        return [(name, leaf.key(coarse)) for name, leaf in self.leaves]


# ---- what a value is --------------------------------------------------------------------------


def unsupported_kind(t: torch.Tensor) -> str:
    """Why torchless does not read this tensor ("" if it does)."""
    if isinstance(t, UninitializedTensorMixin):
        return "uninitialized"
    if t.is_nested:
        return "nested"
    if t.layout != torch.strided:
        return "sparse"
    if t.is_quantized:
        return "quantized"
    if t.device.type == "meta":
        return "meta"
    if type(t).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__:
        return "wrapper subclass"
    if t.is_conj() or t.is_neg():
        return "conjugate/negative-bit"
    return ""


def _storage_bytes(storage: torch.UntypedStorage) -> bytes:
    if storage.nbytes() == 0:
        return b""
    return bytes(torch.tensor([], dtype=torch.uint8).set_(storage).numpy().tobytes())


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The tensor's elements in C order, raw (any dtype: no torch kernel is needed)."""
    if t.numel() == 0:
        return b""
    size = t.element_size()
    raw = np.frombuffer(_storage_bytes(t.untyped_storage()), dtype=np.dtype((np.void, size)))
    view = np.lib.stride_tricks.as_strided(raw[t.storage_offset():], shape=tuple(t.shape),
                                           strides=tuple(s * size for s in t.stride()))
    return bytes(np.ascontiguousarray(view).tobytes())


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def leaf_of(obj: Any) -> Leaf | None:
    """The leaf a value is, or None if it is not a tensor or storage."""
    if isinstance(obj, torch.Tensor):
        why = unsupported_kind(obj)
        if why:
            return Leaf("unsupported", why=why)
        return Leaf("tensor", str(obj.dtype).removeprefix("torch."), tuple(obj.shape),
                    _sha(tensor_bytes(obj)))
    if isinstance(obj, torch.TypedStorage):
        data = _storage_bytes(obj._untyped_storage)
        return Leaf("tensor", str(obj.dtype).removeprefix("torch."), (obj._size(),), _sha(data))
    if isinstance(obj, torch.UntypedStorage):
        data = _storage_bytes(obj)
        return Leaf("tensor", "uint8", (len(data),), _sha(data))
    return None


# ---- the edges of the walk --------------------------------------------------------------------


def key_name(key: Any) -> str:
    """A dict key as a name segment."""
    if type(key) is str:
        return key
    if type(key) in (int, float, bool) or key is None:
        return str(key)
    if isinstance(key, bytes):
        return key.decode("utf-8", "backslashreplace")
    return repr(key)


def _state_children(state: Any) -> list[tuple[str, Any]]:
    """BUILD state: a dict by its keys, a (dict or None, slots) pair by the keys of both, a
    list or tuple by index, anything else as "state"."""
    if state is None:
        return []
    if isinstance(state, dict):
        return [(key_name(k), v) for k, v in state.items()]
    if (isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict)
            and (state[0] is None or isinstance(state[0], dict))):
        return [(key_name(k), v) for part in state if part for k, v in part.items()]
    if isinstance(state, (list, tuple)):
        return [(str(i), v) for i, v in enumerate(state)]
    return [("state", state)]


def _tensor_state_children(state: Any) -> list[tuple[str, Any]]:
    """A tensor's Python state (``_get_obj_state``): its attributes from a dict or a
    (dict, slots) pair; any other state (a subclass's own ``__getstate__``) as "state"."""
    if state is None or isinstance(state, dict) or (
            isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict)
            and (state[0] is None or isinstance(state[0], dict))):
        return _state_children(state)
    return [("state", state)]


class _Graph:
    """Children of each value, computed once (temporaries kept alive so ids stay unique)."""

    def __init__(self) -> None:
        self._kids: dict[int, list[tuple[str, Any]]] = {}
        self._keep: list[Any] = []

    def children(self, obj: Any) -> list[tuple[str, Any]]:
        oid = id(obj)
        kids = self._kids.get(oid)
        if kids is None:
            kids = self._compute(obj)
            self._kids[oid] = kids
            self._keep.append((obj, kids))
        return kids

    def holds_leaf(self, obj: Any) -> bool:
        seen: set[int] = set()
        stack = [obj]
        while stack:
            o = stack.pop()
            if id(o) in seen:
                continue
            seen.add(id(o))
            if leaf_of_cheap(o):
                return True
            stack.extend(c for _, c in self.children(o))
        return False

    def _dict_children(self, items: Iterable[tuple[Any, Any]]) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        for i, (k, v) in enumerate(items):
            if self.holds_leaf(k):
                out += [(f"{i}.0", k), (f"{i}.1", v)]
            else:
                out.append((key_name(k), v))
        return out

    def _compute(self, obj: Any) -> list[tuple[str, Any]]:
        if isinstance(obj, torch.Tensor):
            if unsupported_kind(obj):  # listed whole; its parts are not tensors of the file
                return []
            return _tensor_state_children(torch._utils._get_obj_state(obj))
        if isinstance(obj, (torch.TypedStorage, torch.UntypedStorage, *_NO_CHILDREN)):
            return []
        if isinstance(obj, torch.nn.Module):
            return list(obj.state_dict(keep_vars=True).items())
        if type(obj) in _DICTS:
            return self._dict_children(obj.items())
        if type(obj) in (list, collections.deque) or isinstance(obj, tuple):
            return [(str(i), v) for i, v in enumerate(obj)]
        if type(obj) in (set, frozenset):
            return [(f"{SET_MEMBER}{i}", v) for i, v in enumerate(obj)]
        if isinstance(obj, (argparse.Namespace, types.SimpleNamespace)):
            return [(key_name(k), v) for k, v in vars(obj).items()]
        return self._reduce_children(obj)

    def _reduce_children(self, obj: Any) -> list[tuple[str, Any]]:
        try:
            r = obj.__reduce_ex__(2)
        except Exception:  # not picklable again: nothing the rule can name
            return []
        if isinstance(r, str):
            return []
        func, args = r[0], tuple(r[1])
        state = r[2] if len(r) > 2 else None
        items = list(r[3]) if len(r) > 3 and r[3] is not None else []
        dict_items = list(r[4]) if len(r) > 4 and r[4] is not None else []
        self._keep.append(r)
        self._keep.append((items, dict_items))
        if func is copyreg.__newobj__ and state is None and not items and not dict_items:
            return [(str(i), a) for i, a in enumerate(args[1:])]
        kwargs: dict[Any, Any] = {}
        if func is copyreg.__newobj__:
            positional = args[1:]
        elif func is copyreg.__newobj_ex__:
            positional, kwargs = tuple(args[1]), dict(args[2])
            self._keep.append((positional, kwargs))
        else:
            positional = args
        out = [(f"args.{i}", a) for i, a in enumerate(positional)]
        out += [(f"kwargs.{key_name(k)}", v) for k, v in kwargs.items()]
        out += _state_children(state)
        out += [(str(i), v) for i, v in enumerate(items)]
        out += self._dict_children(dict_items)
        return out


def leaf_of_cheap(obj: Any) -> bool:
    return isinstance(obj, (torch.Tensor, torch.TypedStorage, torch.UntypedStorage))


# ---- the walk ---------------------------------------------------------------------------------


def expected_names(root: Any) -> Expected:
    """Every tensor and storage ``root`` reaches, once per path, by the flat-name rule."""
    graph = _Graph()
    # 1. which values lead to a leaf at all (so the path enumeration skips the rest)
    parents: dict[int, list[int]] = collections.defaultdict(list)
    seen: dict[int, Any] = {}
    stack = [root]
    leaves: list[int] = []
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen[id(obj)] = obj
        if leaf_of_cheap(obj):
            leaves.append(id(obj))
        for _, child in graph.children(obj):
            parents[id(child)].append(id(obj))
            stack.append(child)
    useful: set[int] = set()
    todo = list(leaves)
    while todo:
        oid = todo.pop()
        if oid in useful:
            continue
        useful.add(oid)
        todo.extend(parents[oid])
    # 2. every path from the root that never revisits a value on it
    out: list[tuple[str, Leaf]] = []
    sets: set[tuple[int, str]] = set()
    cache: dict[int, Leaf | None] = {}
    active: set[int] = set()

    def visit(obj: Any, path: tuple[str, ...]) -> None:
        oid = id(obj)
        if oid not in cache:
            cache[oid] = leaf_of(obj)
        leaf = cache[oid]
        if leaf is not None:
            out.append((".".join(path), leaf))
        if type(obj) in (set, frozenset):
            sets.add((len(path), r"\.".join(
                "[^.]+" if seg.startswith(SET_MEMBER) else re.escape(seg) for seg in path)))
        active.add(oid)
        for seg, child in graph.children(obj):
            if id(child) in useful and id(child) not in active:
                visit(child, (*path, seg))
        active.discard(oid)

    if id(root) in useful:
        visit(root, ())
    return Expected(out, sorted(sets))


# ---- comparing names with set members --------------------------------------------------------


def canonical(entries: Iterable[tuple[str, Hashable]],
              sets: Iterable[tuple[int, str]]) -> Counter[tuple[str, Hashable]]:
    """The entries as a multiset, each set member's segment replaced by a digest of the
    member's content (innermost sets first), so either side's member names compare."""
    names = list(entries)
    for depth, pattern in sorted(set(sets), reverse=True):
        head = f"({pattern})\\." if depth else "()"
        rx = re.compile(head + r"([^.]+)(?:\.(.*))?", re.S)
        groups: dict[tuple[str, str], list[tuple[str | None, Hashable]]] = (
            collections.defaultdict(list))
        kept: list[tuple[str, Hashable]] = []
        for name, key in names:
            m = rx.fullmatch(name)
            if m is None:
                kept.append((name, key))
            else:
                groups[(m.group(1), m.group(2))].append((m.group(3), key))
        for (prefix, _member), content in groups.items():
            digest = hashlib.sha1(repr(sorted(content, key=repr)).encode()).hexdigest()[:16]
            label = f"{prefix}.{{{digest}}}" if depth else f"{{{digest}}}"
            kept += [(label if rest is None else f"{label}.{rest}", key)
                     for rest, key in content]
        names = kept
    return Counter(names)
