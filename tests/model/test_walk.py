"""The one walker (torchless.model.walk) and the names flatten() builds from it: each row of the
naming table in docs/formats.md, on hand-built graphs, with the names written out by hand."""

from __future__ import annotations

import argparse
import collections
import types
from typing import Any

import numpy as np
import pytest

from torchless.core.dtypes import by_torch_name
from torchless.core.limits import Limits
from torchless.errors import LimitError
from torchless.model.graph import finish, flatten
from torchless.model.tensor import Storage, Tensor, UnsupportedTensor
from torchless.model.walk import children
from torchless.pickle.values import Global, Opaque

FLOAT32 = by_torch_name("float32")
assert FLOAT32 is not None


def tensor(key: str = "0", n: int = 2) -> Tensor:
    data = np.arange(n, dtype=np.float32).tobytes()
    return Tensor(Storage(key, FLOAT32, len(data), lambda: data), FLOAT32, (n,), (1,), 0)


def names(root: Any) -> list[str]:
    lim = Limits()
    tensors, unsupported = flatten(finish(root, lim), lim)
    return [*tensors, *unsupported]


def record(cls: str = "m.C", *args: Any, state: Any = None, newobj: bool = False,
           kwargs: dict[str, Any] | None = None) -> Opaque:
    o = Opaque(Global(*cls.rsplit(".", 1)), args, kwargs, newobj=newobj)
    if state is not None:
        o.state = state
    return o


def test_containers() -> None:
    t = tensor()
    root = {"d": {1: t, None: t, b"k": t, (1, 2): t}, "l": [t, (t,)],
            "q": collections.deque([t]), "n": argparse.Namespace(a=t),
            "s": types.SimpleNamespace(b=t)}
    assert names(root) == ["d.1", "d.None", "d.k", "d.(1, 2)", "l.0", "l.1.0", "q.0", "n.a",
                           "s.b"]


def test_a_key_that_is_a_tensor_names_the_entry_by_position() -> None:
    k, v = tensor("0"), tensor("1")
    assert names({"x": {"a": v, k: v}}) == ["x.a", "x.1.0", "x.1.1"]


def test_sets_are_named_in_a_canonical_order() -> None:
    a, b = tensor("0"), tensor("1")
    for members in ([a, b], [b, a]):
        out = names({"s": set(members)})
        assert out == ["s.0", "s.1"]
    lim = Limits()
    tensors, _ = flatten(finish({"s": frozenset([b, a])}, lim), lim)
    assert tensors["s.0"] is a and tensors["s.1"] is b  # by storage key


def test_records() -> None:
    t = tensor()
    root = {
        "state_dict": record(state={"w": t}),
        "slots": record(state=(None, {"x": t})),
        "both": record(state=({"a": t}, {"b": t})),
        "tuple_state": record(state=(1, None, t)),
        "other_state": record(state=t),
        "args": record("m.C", t, state={"k": 1}),
        "kwargs": record("m.C", newobj=True, kwargs={"t": t}),
        "named_tuple": record("m.P", t, 3, newobj=True),
        "ret": record("torch.return_types.max", (t, t), {}),
    }
    assert names(root) == [
        "state_dict.w", "slots.x", "both.a", "both.b", "tuple_state.2", "other_state.state",
        "args.args.0", "kwargs.kwargs.t", "named_tuple.0", "ret.0", "ret.1"]


def test_appended_and_set_items_of_a_record() -> None:
    t = tensor()
    o = record(newobj=True)
    o.items = [t]
    o.dict_items = [("k", t)]
    assert names({"o": o}) == ["o.0", "o.k"]


def test_the_class_a_record_names_is_walked_but_not_named() -> None:
    inner = record()
    outer = Opaque(inner, (tensor(),))
    assert [n for n, _ in children(outer)][:2] == ["callable", "args.0"]
    assert names({"o": outer}) == ["o.args.0"]


def test_tensor_attributes_and_unsupported() -> None:
    t = tensor()
    t.attrs = {"extra": tensor("1"), "note": "x"}
    assert names({"t": t, "u": UnsupportedTensor("sparse")}) == ["t", "t.extra", "u"]


def test_a_storage_held_as_a_value_is_a_one_dimensional_tensor() -> None:
    data = np.arange(3, dtype=np.float32).tobytes()
    st = Storage("0", FLOAT32, len(data), lambda: data)
    lim = Limits()
    tree = finish({"s": st, "again": st}, lim)
    tensors, _ = flatten(tree, lim)
    assert list(tensors) == ["s", "again"] and tensors["s"] is tensors["again"]
    assert tensors["s"].is_storage and tensors["s"].shape == (3,)
    assert tensors["s"].numpy().tolist() == [0.0, 1.0, 2.0]


def test_paths_never_go_round_a_cycle() -> None:
    t = tensor()
    parent = record(state={"w": t})
    child = record(state={"_parent": parent, "v": t})
    parent.state["child"] = child
    assert names({"cfg": parent}) == ["cfg.w", "cfg.child.v"]


def test_aliases_are_listed_per_path() -> None:
    t = tensor()
    shared = {"w": t}
    assert names({"a": shared, "b": shared}) == ["a.w", "b.w"]


def test_two_paths_spelling_one_name_are_told_apart() -> None:
    t, u = tensor("0"), tensor("1")
    lim = Limits()
    tensors, _ = flatten(finish({1: t, "1": u}, lim), lim)
    assert list(tensors) == ["1", "1~2"] and tensors["1"] is t and tensors["1~2"] is u


def test_deep_chains_are_walked_without_recursion() -> None:
    depth = 5000  # far past the interpreter's recursion limit
    node: Any = tensor()
    for _ in range(depth):
        node = [node]
    lim = Limits(max_depth=depth + 1)
    tensors, _ = flatten(finish(node, lim), lim)
    assert list(tensors) == [".".join(["0"] * depth)]
    with pytest.raises(LimitError, match="max_depth"):
        finish(node, Limits(max_depth=depth - 10))
