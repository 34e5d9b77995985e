"""What hashing the tuples a pickle builds costs, counted as the interpreter builds them.

Python does not cache a tuple's hash: hashing one hashes every tuple inside it, once per path
to it. A pickle can build a tuple once and put it three times in the next one through the
memo, and so on: a hundred bytes then make a tuple of 3**20 paths, and using it as a dict key
or set member (``SETITEM``, ``ADDITEMS``, ``FROZENSET``, or a rule building a set or dict)
takes minutes, and the same again for each use. ``torch.load`` hangs on such a file.

:class:`KeyCost` keeps, for each tuple or frozenset the run built that holds another one,
how many values hashing or walking it visits (its expanded size; a flat one visits its own
length plus one, kept nowhere). A tuple whose expanded size passes ``max_container_len`` is
refused as it is built, and the expanded sizes of all the keys a run hashes may add up to
``max_container_len`` at most: either is a :class:`~torchless.errors.LimitError`. A checkpoint's
keys are strings, ints and small flat tuples, which cost nothing here.

The inert decoder builds its tuples from JSON, not through this count: it measures each key
it reads with :meth:`KeyCost.measure` (every tuple inside measured once) and spends that,
flat tuples included.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torchless.core.limits import Limits
from torchless.errors import LimitError

__all__ = ["KeyCost"]


class KeyCost:
    """The expanded sizes of one run's nested tuples and the hashing work spent on them."""

    __slots__ = ("limit", "sizes", "spent")

    def __init__(self, limits: Limits) -> None:
        self.limit = limits.max_container_len
        #: id -> (the tuple or frozenset, kept alive so the id stays its own; expanded size)
        self.sizes: dict[int, tuple[Any, int]] = {}
        self.spent = 0

    def size(self, value: Any) -> int:
        """How many values hashing ``value`` visits (1 for anything but a tuple or
        frozenset)."""
        if not isinstance(value, (tuple, frozenset)):
            return 1
        entry = self.sizes.get(id(value))
        if entry is not None and entry[0] is value:
            return entry[1]
        return 1 + len(value)

    def keep(self, value: tuple[Any, ...] | frozenset[Any], total: int,
             offset: int | None) -> None:
        """Note a new tuple or frozenset that holds another one, whose expanded size is
        ``total`` (1, plus 1 for each item that is no tuple or frozenset, plus each one's
        :meth:`size`: the interpreter adds it up in the pass that also checks nesting
        depth); refuse it past the limit."""
        if total > self.limit:
            raise LimitError("max_container_len", self.limit, total,
                             "values inside nested tuples (the same tuple reached through "
                             "many paths)", offset=offset)
        self.sizes[id(value)] = (value, total)

    def measure(self, key: Any) -> int:
        """How many values hashing ``key`` visits (1 for anything but a tuple, whose hash is
        cached or does not descend), for a value built outside the interpreter: each tuple
        inside is measured once and kept in :attr:`sizes`, flat ones too."""
        if type(key) is not tuple:
            return 1
        sizes = self.sizes
        stack: list[tuple[tuple[Any, ...], bool]] = [(key, False)]
        while stack:
            t, expanded = stack.pop()
            entry = sizes.get(id(t))
            if entry is not None and entry[0] is t:
                continue
            if expanded:
                sizes[id(t)] = (t, 1 + sum(sizes[id(v)][1] if type(v) is tuple else 1
                                           for v in t))
                continue
            stack.append((t, True))
            stack.extend((v, False) for v in t if type(v) is tuple)
        return sizes[id(key)][1]

    def charge(self, keys: Iterable[Any], offset: int | None) -> None:
        """Count the work of hashing ``keys`` (dict keys or set members about to be
        inserted); refuse the run once it passes the limit. Only tuples are counted:
        anything else hashes in one step (a frozenset caches its hash once computed, and its
        members were charged when it was built)."""
        sizes = self.sizes
        if not sizes:  # no nested tuple yet (a checkpoint's usual run): no key costs more
            return
        if type(keys) is not list:
            keys = list(keys)
        if tuple not in set(map(type, keys)):  # a module's str keys: none costs more
            return
        work = 0
        for k in keys:
            if type(k) is tuple:
                entry = sizes.get(id(k))
                if entry is not None and entry[0] is k:
                    work += entry[1]
        self.spend(work, offset)

    def spend(self, work: int, offset: int | None = None) -> None:
        """Add ``work`` values hashed; refuse once the total passes the limit."""
        spent = self.spent + work
        if spent > self.limit:
            raise LimitError("max_container_len", self.limit, spent,
                             "values hashed for dict keys and set members (tuples reached "
                             "through many paths)", offset=offset)
        self.spent = spent
