"""Tuples reached through many paths (the memo puts one tuple three times in the next, and so
on) cost nothing to build and an exponential time to hash as dict keys or set members, since
Python does not cache a tuple's hash; ``torch.load`` hangs on such a pickle. The interpreter
counts what hashing them costs (:mod:`torchless.pickle.keycost`) and refuses past
``max_container_len``: the expanded sizes below are hand arithmetic (a tuple of three
copies of a tuple of size ``s`` has size ``1 + 3 s``, starting from ``(1,)`` of size 2: ``k``
levels make ``(5 * 3**k - 1) / 2``)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

import torchless
from torchless import LimitError, Limits
from torchless.model.walk import MAX_KEY_VALUES, plain_key
from torchless.pickle.machine import run_pickle
from torchless.rules.resolver import TorchResolver


def _dag(levels: int) -> bytes:
    """Protocol 4: memo 0 = (1,), memo i+1 = (memo i,) * 3; leaves memo ``levels`` on top of
    the stack, built with MEMOIZE and BINGET only."""
    out = bytearray(b"\x80\x04K\x01\x85\x940")  # (1,), MEMOIZE, POP
    for i in range(levels):
        out += b"h" + bytes([i]) + b"h" + bytes([i]) + b"h" + bytes([i]) + b"\x87\x940"
    return bytes(out)


def _size(levels: int) -> int:
    size = 2
    for _ in range(levels):
        size = 1 + 3 * size
    return size


def _run(data: bytes, limits: Limits | None = None) -> Any:
    lim = limits or Limits()
    return run_pickle(data, TorchResolver(lim), lim)[0]


def test_a_tuple_too_large_when_expanded_is_refused_as_it_is_built() -> None:
    """Twenty levels: 3**20 paths in 163 bytes. Built into a set (what torch.load would hash
    for minutes), refused when the tuple past the limit is made, before any hashing."""
    levels = 20
    assert _size(levels) == (5 * 3**20 - 1) // 2 > Limits().max_container_len
    data = _dag(levels) + b"\x8f(h" + bytes([levels]) + b"\x90."  # EMPTY_SET MARK get ADDITEMS
    with pytest.raises(LimitError) as e:
        _run(data)
    assert e.value.limit_name == "max_container_len"


@pytest.mark.parametrize("container", ["set", "dict", "frozenset", "rule set", "rule dict",
                                      "OrderedDict"])
def test_the_hashing_of_keys_adds_up_to_the_limit(container: str) -> None:
    """Eleven levels (size 442,867, each hash well under a second) used as a key 120 times
    through the memo: 53,144,040 values hashed, past the limit of 50,000,000 however they
    are inserted; 100 times (44,286,700) is within it."""
    levels = 11
    assert _size(levels) == (5 * 3**11 - 1) // 2 == 442_867
    get = b"h" + bytes([levels])
    for uses, refused in ((120, True), (100, False)):
        body = bytearray(_dag(levels))
        if container == "set":
            body += b"\x8f(" + get * uses + b"\x90"
        elif container == "dict":
            body += b"}(" + (get + b"N") * uses + b"u"
        elif container == "frozenset":
            body += b"(" + get * uses + b"\x91"
        elif container in ("rule set", "rule dict"):
            name = container.split()[1]
            body += b"\x8c\x08builtins\x8c" + bytes([len(name)]) + name.encode() + b"\x93"
            item = get if name == "set" else get + b"N\x86"
            body += b"](" + item * uses + b"e\x85R"
        else:
            body += b"\x8c\x0bcollections\x8c\x0bOrderedDict\x93](" + (get + b"N\x86") * uses \
                + b"e\x85R"
        data = bytes(body) + b"."
        if refused:
            with pytest.raises(LimitError) as e:
                _run(data)
            assert e.value.limit_name == "max_container_len"
        else:
            value = _run(data)
            assert len(value) == 1  # one distinct key


def test_ordinary_keys_cost_nothing_and_the_limit_can_be_raised() -> None:
    """A checkpoint's keys (strings, ints, small tuples, tensors' argument tuples) are not
    counted; the same DAG passes with a raised limit."""
    obj = {**{f"k{i}": i for i in range(5000)}, **{(i, (i, "a")): i for i in range(5000)},
           "s": {(1, (2, (3,))), frozenset({(4, 5)})}}
    assert _run(pickle.dumps(obj, protocol=4)) == obj
    data = _dag(11) + b"\x8f(" + b"h\x0b" * 200 + b"\x90."  # 88,573,400 values hashed
    assert len(_run(data, Limits(max_container_len=100_000_000))) == 1


def test_keys_of_many_values_name_their_entry_by_position(torch: Any, tmp_path: Any) -> None:
    """A plain tuple key names its value by its repr up to MAX_KEY_VALUES values; past that
    the entry is named by position (``i.1``), not by a repr of that length."""
    small = tuple(range(10))
    big = tuple(range(MAX_KEY_VALUES))  # with the tuple itself: one value more than allowed
    assert plain_key(small) and not plain_key(big)
    assert plain_key(tuple(range(MAX_KEY_VALUES - 1)))
    path = tmp_path / "keys.pt"
    torch.save({"d": {small: torch.ones(2), big: torch.zeros(3)}}, path)
    with torchless.open(path) as ckpt:
        assert sorted(ckpt.tensors) == sorted([f"d.{small!r}", "d.1.1"])
