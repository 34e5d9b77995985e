"""The order in which a set's members are written, the same in every process.

A set iterates in hash order, and that order is not a property of its members: ``str``
hashes are salted per process (``PYTHONHASHSEED``) and records, NaNs and most objects hash
by identity, so one checkpoint read twice gives the same set in two orders. Written in that
order, the tree of one object would differ from run to run, and ``verify``, which encodes
the source again and compares the text, would call a faithful conversion different. The
members are sorted instead by a text that depends on their values only.
"""

from __future__ import annotations

import struct
from typing import Any

from torchless.pickle.values import NOTSET, Opaque

__all__ = ["member_key"]

#: How deep and how many values the key of one member looks at: bounded work for a member
#: that is a large or widely shared structure (a file could make one whose expansion is
#: exponential in its size). Members that differ only beyond that tie.
_DEPTH = 6
_VALUES = 256


def member_key(value: Any) -> str:
    """A text that orders ``value`` among other set members, independent of hashes and
    addresses: equal for members the tree writes alike (deterministic ``repr`` for atoms,
    the contents for tuples, frozensets and records)."""
    parts: list[str] = []
    budget = [_VALUES]
    _key(value, 0, parts, budget)
    return "".join(parts)


def _key(value: Any, depth: int, out: list[str], budget: list[int]) -> None:
    budget[0] -= 1
    kind = type(value)
    if isinstance(value, str) and kind is str:
        out.append("s" + value + "\0")
        return
    if kind is float:
        out.append("f" + struct.pack(">d", value).hex())  # NaN payloads, -0.0: by their bits
        return
    if depth < _DEPTH and budget[0] > 0:
        if kind is tuple or kind is list:
            out.append("t(")
            for v in value:
                _key(v, depth + 1, out, budget)
            out.append(")")
            return
        if kind is frozenset or kind is set:
            keys = []
            for v in value:
                sub: list[str] = []
                _key(v, depth + 1, sub, budget)
                keys.append("".join(sub))
            out.append("f(" + "".join(sorted(keys)) + ")")
            return
        if kind is dict:
            out.append("d(")
            for k, v in value.items():
                _key(k, depth + 1, out, budget)
                _key(v, depth + 1, out, budget)
            out.append(")")
            return
        if isinstance(value, Opaque):
            out.append(f"o{value.class_path}(")
            _key(value.args, depth + 1, out, budget)
            if value.state is not NOTSET:
                _key(value.state, depth + 1, out, budget)
            out.append(")")
            return
    out.append(f"{kind.__module__}.{kind.__qualname__}:{_repr(value)}\0")


_CONTAINERS = (tuple, list, dict, set, frozenset, Opaque)


def _repr(value: Any) -> str:
    """``repr(value)``; nothing for a container past the bounds (its ``repr`` would expand
    it whole) or an object whose ``repr`` names its address (which would order it by
    where it was allocated)."""
    if isinstance(value, _CONTAINERS):
        return ""
    try:
        text = repr(value)
    except Exception:
        return ""
    return "" if " at 0x" in text else text
