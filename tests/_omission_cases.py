"""Torch-side builders for tests/reader/test_nothing_vanishes.py (imports torch: import it only
through the ``torch`` fixture). Module-level classes, so that torch.save can pickle them and
torch.load can find them again."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import types
import warnings
import zoneinfo
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class WithArgs:
    """Pickled as ``WithArgs(t)`` plus BUILD state: the constructor argument holds a tensor."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t
        self.s = 1

    def __reduce__(self) -> Any:
        return (WithArgs, (self.t,), {"s": 2})


class NewEx:
    """An object whose class has ``__getnewargs_ex__``: NEWOBJ_EX (protocol 4), or
    ``partial(cls.__new__, cls, **kwargs)()`` (protocol 2)."""

    def __new__(cls, *, t: Any = None) -> NewEx:
        obj = object.__new__(cls)
        obj.k = t
        return obj

    def __getnewargs_ex__(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (), {"t": self.k}

    def __getstate__(self) -> dict[str, Any]:
        return {"other": 1}


@dataclasses.dataclass(slots=True)
class Slotted:
    x: Any
    y: int = 1


Pair = collections.namedtuple("Pair", "a b")


class Outer:
    class Inner:
        pass


def _with_attr() -> dict[str, Any]:
    t = torch.arange(3.0)
    t.foo = 1
    t.bar = torch.ones(2)
    p = nn.Parameter(torch.ones(2))
    p.note = "x"
    return {"t": t, "p": p}


def _storages() -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is deprecated
        typed = torch.arange(3.0).storage()
    return {"typed": typed, "untyped": torch.arange(4, dtype=torch.int16).untyped_storage()}


def _cycle() -> dict[str, Any]:
    a: list[Any] = [torch.ones(2)]
    a.append(a)
    d: dict[str, Any] = {"w": torch.zeros(1)}
    d["self"] = d
    return {"a": a, "d": d}


def _empty_two_dtypes() -> dict[str, Any]:
    x = torch.empty(0)
    return {"a": x, "b": x.view(torch.int32)}


#: name -> (builder, {flat name: path of the tensor in torch.load's result}, protocols).
#: A path is a tuple of keys/indices/attribute names applied to torch.load's result; the
#: flat names are the documented rule (docs/formats.md) written out by hand.
CASES: dict[str, tuple[Callable[[], Any], dict[str, tuple[Any, ...]]]] = {
    "set": (lambda: {"s": {torch.ones(2)}}, {"s.0": ("s", "*set")}),
    "frozenset": (lambda: {"s": frozenset([torch.ones(2)])}, {"s.0": ("s", "*set")}),
    "simple_namespace": (lambda: {"n": types.SimpleNamespace(w=torch.ones(2))},
                         {"n.w": ("n", ".w")}),
    "args_and_state": (lambda: {"o": WithArgs(torch.ones(2))}, {"o.args.0": ("o", ".t")}),
    "newobj_ex_kwargs": (lambda: {"o": NewEx(t=torch.ones(2))},
                         {"o.kwargs.t": ("o", ".k")}),
    "slots_dataclass": (lambda: {"all": Slotted(torch.ones(2))}, {"all.x": ("all", ".x")}),
    "namedtuple": (lambda: {"p": Pair(torch.ones(2), 3)}, {"p.0": ("p", 0)}),
    "packed_sequence": (
        lambda: {"p": nn.utils.rnn.pack_padded_sequence(torch.ones(3, 2, 1), [3, 2])},
        {"p.0": ("p", 0), "p.1": ("p", 1)}),
    "return_types": (lambda: {"m": torch.max(torch.arange(6.0).reshape(2, 3), 1)},
                     {"m.0": ("m", 0), "m.1": ("m", 1)}),
    "tensor_attributes": (_with_attr, {"t": ("t",), "t.bar": ("t", ".bar"), "p": ("p",)}),
    "storages": (_storages, {"typed": ("typed",), "untyped": ("untyped",)}),
    "storage_whole_file": (lambda: torch.arange(5, dtype=torch.int16).untyped_storage(),
                           {"": ()}),
    "typed_storage_whole_file": (lambda: _storages()["typed"], {"": ()}),
    "typed_storages": (lambda: {"typed": _storages()["typed"]}, {"typed": ("typed",)}),
    "cycles": (_cycle, {"a.0": ("a", 0), "d.w": ("d", "w")}),
    "empty_two_dtypes": (_empty_two_dtypes, {"a": ("a",), "b": ("b",)}),
    "nested_class": (lambda: {"c": Outer.Inner, "w": torch.ones(1)}, {"w": ("w",)}),
    "zoneinfo_datetime": (
        lambda: {"d": datetime.datetime(2020, 1, 1, tzinfo=zoneinfo.ZoneInfo("Europe/Berlin")),
                 "w": torch.ones(1)}, {"w": ("w",)}),
    "generator_state": (lambda: {"g": torch.Generator().manual_seed(3).get_state()},
                        {"g": ("g",)}),
}

#: Tensors torchless lists as unsupported, by flat name, and the kind it names.
UNSUPPORTED: dict[str, tuple[Callable[[], Any], dict[str, str], dict[str, tuple[Any, ...]]]] = {
    "uninitialized": (lambda: nn.LazyLinear(3).state_dict(),
                      {"weight": "uninitialized parameter", "bias": "uninitialized parameter"},
                      {}),
    "nested_jagged": (
        lambda: {"n": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)],
                                                 layout=torch.jagged), "w": torch.ones(1)},
        {"n": "jagged"}, {"w": ("w",)}),
    "wrapper_subclass": (lambda: {"t": _two_tensor(), "w": torch.ones(1)},
                         {"t": "wrapper-subclass"}, {"w": ("w",)}),
}


def _two_tensor() -> Any:
    from torch.testing._internal.two_tensor import TwoTensor

    return TwoTensor(torch.ones(2), torch.zeros(2))


def follow(obj: Any, path: tuple[Any, ...]) -> Any:
    """The value at ``path`` in torch.load's result (``.x`` an attribute, ``*set`` the one
    member of a set)."""
    for step in path:
        if step == "*set":
            (obj,) = tuple(obj)
        elif isinstance(step, str) and step.startswith("."):
            obj = getattr(obj, step[1:])
        else:
            obj = obj[step]
    return obj


def raw_bytes(value: Any) -> tuple[str, tuple[int, ...], bytes]:
    """dtype name, shape and contiguous bytes of a torch tensor or storage."""
    if isinstance(value, torch.storage.TypedStorage):
        value = torch.tensor([], dtype=value.dtype).set_(value)
    elif isinstance(value, torch.UntypedStorage):
        value = torch.tensor([], dtype=torch.uint8).set_(value)
    t = value.detach().contiguous()
    if t.is_conj():
        t = t.resolve_conj()
    data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return str(t.dtype).removeprefix("torch."), tuple(t.shape), data
