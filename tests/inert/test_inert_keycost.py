"""Keys whose hash would never end: a tree that defines a tuple once and refers to it three
times from the next one, n levels deep, is a few hundred bytes whose top tuple Python
hashes by visiting 3**n tuples (it caches no tuple hash). Used as a set member or a dict
key, it is refused by the container limit before it is hashed; shallow ones load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import torchless
from tests.inert.test_inert_hostile import file_bytes, load_tree, refused

TL: Any = torchless


def _tower(levels: int, use: str) -> str:
    """Tuple k+1 is (k, k, k); the last one used as ``use`` ("set" or "key")."""
    items: list[Any] = [{"$id": 0, "$tuple": [1]}]
    for k in range(levels):
        items.append({"$id": k + 1, "$tuple": [{"$ref": k}] * 3})
    top = {"$ref": levels}
    items.append({"$set": [top]} if use == "set" else {"$dict": [[top, "v"]]})
    return json.dumps(items)


def _expected(levels: int) -> tuple[Any, ...]:
    t: tuple[Any, ...] = (1,)
    for _ in range(levels):
        t = (t, t, t)
    return t


@pytest.mark.parametrize("use", ["set", "key"])
def test_a_shallow_tower_loads(tmp_path: Path, use: str) -> None:
    got = load_tree(tmp_path, _tower(4, use))
    want = _expected(4)
    assert got[-1] == ({want} if use == "set" else {want: "v"})


@pytest.mark.parametrize("use", ["set", "key"])
def test_a_deep_tower_is_refused_before_it_is_hashed(tmp_path: Path, use: str) -> None:
    err = refused(tmp_path, file_bytes(_tower(60, use)), torchless.LimitError)
    assert "max_container_len" in str(err)


def test_the_bound_is_the_container_limit(tmp_path: Path) -> None:
    # 3**6 top-level paths: 1 + 3 + … + 3**6 tuples and 3**6 leaves
    work = sum(3 ** i for i in range(7)) + 3 ** 6
    data = file_bytes(_tower(6, "set"))
    refused(tmp_path, data, torchless.LimitError, limits=torchless.Limits(
        max_container_len=work - 1))
    path = tmp_path / "ok.inert"
    path.write_bytes(data)
    assert TL.load(path, limits=torchless.Limits(max_container_len=work))[-1] == {
        _expected(6)}
