"""What hashing a decoded dict key or set member costs.

Python does not cache a tuple's hash: hashing one walks every tuple inside it, once per
path. A tree can define a tuple once and refer to it three times from the next tuple, and so
on: a few hundred bytes of JSON then make a key whose hash takes longer than the universe
has existed. The decoder counts that work (each shared tuple measured once) and refuses a
file whose keys would cost more than its container limit in all.
"""

from __future__ import annotations

from typing import Any

__all__ = ["hash_work"]


def hash_work(key: Any, sizes: dict[int, int]) -> int:
    """How many tuples and leaves hashing ``key`` visits (1 for anything but a tuple, whose
    hash is cached or does not descend). ``sizes`` remembers the tuples measured, by id:
    the caller keeps them alive."""
    if type(key) is not tuple:
        return 1
    stack: list[tuple[tuple[Any, ...], bool]] = [(key, False)]
    while stack:
        t, expanded = stack.pop()
        if id(t) in sizes:
            continue
        if expanded:
            sizes[id(t)] = 1 + sum(sizes[id(v)] if type(v) is tuple else 1 for v in t)
            continue
        stack.append((t, True))
        stack.extend((v, False) for v in t if type(v) is tuple and id(v) not in sizes)
    return sizes[id(key)]
