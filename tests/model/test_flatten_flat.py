"""flatten()'s shortcut for a plain dict of tensors (``graph._flat_state_dict``) against its
general walk: the same names in the same order, the same tensors, the same limit errors; and
every other tree left to the walk."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import pytest

from torchless.core.dtypes import by_torch_name
from torchless.core.limits import Limits
from torchless.errors import LimitError
from torchless.model import graph
from torchless.model.graph import flatten
from torchless.model.tensor import Storage, Tensor

FLOAT32 = by_torch_name("float32")
assert FLOAT32 is not None


def _tensor(n: int = 2, attrs: dict[str, Any] | None = None) -> Tensor:
    data = np.zeros(n, dtype=np.float32).tobytes()
    return Tensor(Storage("0", FLOAT32, len(data), lambda: data), FLOAT32, (n,), (1,), 0,
                  attrs=attrs)


def _outcome(root: Any, limits: Limits, root_name: str = "") -> Any:
    try:
        tensors, unsupported = flatten(root, limits, root_name)
    except LimitError as e:
        return ("LimitError", str(e))
    return [(k, id(v)) for k, v in tensors.items()], [(k, id(v)) for k, v in unsupported.items()]


def _both(root: Any, limits: Limits, monkeypatch: pytest.MonkeyPatch,
          root_name: str = "") -> tuple[Any, Any]:
    fast = _outcome(root, limits, root_name)
    with monkeypatch.context() as m:
        m.setattr(graph, "_flat_state_dict", lambda root, limits, root_name: None)
        walk = _outcome(root, limits, root_name)
    return fast, walk


FLAT = {"layer.0.weight": _tensor(), "": _tensor(), "é": _tensor(3), "a.b": _tensor(),
        "a": _tensor(), "x~2": _tensor()}


@pytest.mark.parametrize("limits", [Limits(), Limits(max_tensors=6), Limits(max_tensors=5),
                                    Limits(max_name_bytes=22), Limits(max_name_bytes=21),
                                    Limits(max_tensors=0)])
def test_a_flat_dict_names_alike(limits: Limits, monkeypatch: pytest.MonkeyPatch) -> None:
    fast, walk = _both(dict(FLAT), limits, monkeypatch)
    assert fast == walk
    assert graph._flat_state_dict(dict(FLAT), Limits(), "") is not None


def _with_attribute(d: Any) -> Any:
    d.extra = _tensor()
    return d


@pytest.mark.parametrize("make", [collections.OrderedDict, graph.ModuleDict])
@pytest.mark.parametrize("limits", [Limits(), Limits(max_tensors=5), Limits(max_name_bytes=21)])
def test_an_ordered_dict_without_attributes_names_alike(
        make: Any, limits: Limits, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make(FLAT)
    assert graph._flat_state_dict(root, Limits(), "") is not None
    fast, walk = _both(root, limits, monkeypatch)
    assert fast == walk


def test_the_names_are_the_keys_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    fast, _ = _both(dict(FLAT), Limits(), monkeypatch)
    assert [k for k, _ in fast[0]] == list(FLAT)  # written out: the keys, as they are
    assert _both({}, Limits(), monkeypatch) == (([], []), ([], []))


@pytest.mark.parametrize("root", [
    {"a": _tensor(), "b": _tensor(attrs={"x": _tensor()})},  # a tensor with attributes
    _with_attribute(collections.OrderedDict(a=_tensor())),  # its attributes are children
    _with_attribute(graph.ModuleDict(a=_tensor())),
    {1: _tensor(), "b": _tensor()},  # a key that is not a str
    {"a": _tensor(), "b": [_tensor()]},  # a container
    {"a": _tensor(), "b": 3},  # another value
])
def test_other_trees_take_the_walk(root: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert graph._flat_state_dict(root, Limits(), "") is None
    fast, walk = _both(root, Limits(), monkeypatch)
    assert fast == walk


def test_a_root_name_takes_the_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    assert graph._flat_state_dict(dict(FLAT), Limits(), "model") is None
    fast, walk = _both(dict(FLAT), Limits(), monkeypatch, "model")
    assert fast == walk
