"""``inspect --tree``: the saved object as an indented tree, tensors with their dtype and
shape, known bulk records (RNG states) on one line, and a container reached a second time
(or in a cycle) shown as a reference instead of again."""

from __future__ import annotations

import argparse
import collections
import types
from collections.abc import Iterator
from typing import Any

from torchless.cli.summaries import clipped_repr, compact
from torchless.core.text import line_writer
from torchless.model.graph import ModuleDict
from torchless.model.tensor import Tensor, UnsupportedTensor
from torchless.model.walk import children
from torchless.pickle.values import Global, Opaque

__all__ = ["tree_lines", "tree_text"]

_BRANCHES = (dict, list, tuple, collections.deque, argparse.Namespace, types.SimpleNamespace,
             Opaque, ModuleDict)


def _inline(obj: Any) -> bool:
    """A short sequence of scalars, printed on its key's line."""
    return isinstance(obj, (list, tuple)) and len(obj) <= 16 and all(
        isinstance(v, (str, int, float, bool, type(None))) for v in obj)


def _label(obj: Any) -> str:
    if _inline(obj):
        inner = ", ".join(clipped_repr(v, 80) for v in obj)
        text = f"[{inner}]" if isinstance(obj, list) else (
            f"({inner},)" if len(obj) == 1 else f"({inner})")
        return text if len(text) <= 80 else text[:77] + "..."
    if isinstance(obj, Tensor):
        kind = "Parameter" if obj.is_parameter else "Tensor"
        shape = "x".join(map(str, obj.shape)) or "scalar"
        return f"{kind} {obj.dtype.name} {shape}"
    if isinstance(obj, UnsupportedTensor):
        return f"unsupported tensor ({obj.kind})"
    bulk = compact(obj)
    if bulk is not None:
        return bulk
    if isinstance(obj, (Opaque, Global)):  # a name from the file: any length
        text = f"<{obj.class_path}>" if isinstance(obj, Opaque) else f"<global {obj.path}>"
        return text if len(text) <= 80 else text[:76] + "...>"
    if isinstance(obj, _BRANCHES):
        n = len(obj) if hasattr(obj, "__len__") else len(vars(obj))
        return f"{type(obj).__name__} ({n})"
    text = clipped_repr(obj, 80)
    return text if len(text) <= 80 else text[:77] + "..."


def tree_lines(tree: Any, pattern: Any = None) -> Iterator[str]:
    """One line per value, indented two spaces per level. ``pattern`` (a callable on a flat
    name) keeps the tensors it accepts and the branches that lead to them; other leaves are
    kept when no pattern is given."""
    seen: set[int] = set()
    stack: list[tuple[int, str, str, Any]] = [(0, "", "", tree)]
    while stack:
        depth, key, flat, obj = stack.pop()
        if pattern is not None and not _wanted(obj, flat, pattern, set()):
            continue
        shown = key if len(key) <= 80 else key[:77] + "..."
        head = f"{'  ' * depth}{shown + ': ' if key else ''}"
        if isinstance(obj, _BRANCHES) and compact(obj) is None and not _inline(obj):
            if id(obj) in seen:
                yield f"{head}<the {type(obj).__name__} shown above>"
                continue
            seen.add(id(obj))
            yield f"{head}{_label(obj)}"
            kids = [(n, c) for n, c in children(obj) if n is not None]
            for n, c in reversed(kids):
                # flat names only for the pattern: a long key down a deep chain repeats
                inner = (f"{flat}.{n}" if flat and n else flat or n) if pattern else ""
                stack.append((depth + 1, n or "''", inner, c))
        else:
            yield f"{head}{_label(obj)}"


def _wanted(obj: Any, flat: str, pattern: Any, seen: set[int]) -> bool:
    """Whether ``obj`` is a tensor the pattern accepts or leads to one."""
    if isinstance(obj, Tensor):
        return bool(pattern(flat))
    if isinstance(obj, _BRANCHES) and id(obj) not in seen:
        seen.add(id(obj))
        return any(_wanted(c, f"{flat}.{n}" if flat and n else flat or n, pattern, seen)
                   for n, c in children(obj) if n is not None)
    return False


def tree_text(tree: Any, out: Any, pattern: Any = None) -> None:
    w = line_writer(out)
    for line in tree_lines(tree, pattern):
        w(line + "\n")
