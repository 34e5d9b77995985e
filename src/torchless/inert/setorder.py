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

#: How deep the key looks into nested members; below it, members of one type tie (and a
#: tie changes the text only between members whose own trees differ that deeply).
_DEPTH = 6


def member_key(value: Any, depth: int = 0) -> str:
    """A text that orders ``value`` among other set members, independent of hashes and
    addresses: equal for members the tree writes alike (deterministic ``repr`` for atoms,
    the contents for tuples, frozensets and records)."""
    kind = type(value)
    if isinstance(value, str) and kind is str:
        return "s" + value
    if kind is float:
        return "f" + struct.pack(">d", value).hex()  # NaN payloads, -0.0: by their bits
    if depth < _DEPTH:
        if kind is tuple or kind is list:
            return "t(" + ",".join(member_key(v, depth + 1) for v in value) + ")"
        if kind is frozenset or kind is set:
            return "f(" + ",".join(sorted(member_key(v, depth + 1) for v in value)) + ")"
        if kind is dict:
            return "d(" + ",".join(f"{member_key(k, depth + 1)}:{member_key(v, depth + 1)}"
                                   for k, v in value.items()) + ")"
        if isinstance(value, Opaque):
            state = "" if value.state is NOTSET else member_key(value.state, depth + 1)
            return f"o{value.class_path}({member_key(value.args, depth + 1)};{state})"
    return f"{kind.__module__}.{kind.__qualname__}:{_repr(value)}"


def _repr(value: Any) -> str:
    """``repr(value)``, or nothing for an object whose ``repr`` names its address (which
    would order it by where it was allocated)."""
    try:
        text = repr(value)
    except Exception:
        return ""
    return "" if " at 0x" in text else text
