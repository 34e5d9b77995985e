"""Type annotations a checkpoint holds are inert records, never a reason to refuse the file.

A module saved whole keeps its signature's annotations (torch_geometric's ``Inspector``):
pickle writes ``typing.Optional[torch.Tensor]`` as ``operator.getitem(typing.Union,
(torch.Tensor, type(None)))``. ``getitem`` of a typing form with classes is an
``Annotation`` naming the form, ``type(x)`` of a plain value its class (a reference); any
other ``getitem`` or ``type`` call is an inert record. torch is the oracle: the text is the
annotation's ``repr``, the record's arguments what ``__reduce_ex__`` gives.
"""

from __future__ import annotations

import typing
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import torchless
from torchless.pickle.values import Global, Opaque
from torchless.rules.stdlib import Annotation


def _g(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _path(obj: Any) -> Any:
    """What torchless keeps of what ``__reduce_ex__`` names: classes as their path."""
    if isinstance(obj, type):
        module = {"torch._tensor": "torch"}.get(obj.__module__, obj.__module__)
        return f"{module}.{obj.__qualname__}"
    if isinstance(obj, (tuple, list, str, int)):
        return type(obj)(_path(v) for v in obj) if isinstance(obj, (tuple, list)) else obj
    reduced = obj.__reduce_ex__(2)
    if isinstance(reduced, str):  # typing.Union: pickled by name
        return f"{obj.__module__}.{reduced}"
    assert reduced[0].__name__ == "getitem", reduced
    return ("getitem", _path(reduced[1][0]), _path(reduced[1][1]))


def _ours(value: Any) -> Any:
    if isinstance(value, Global):
        return value.path
    if isinstance(value, Annotation):
        return ("getitem", _ours(value.args[0]), _ours(value.args[1]))
    if isinstance(value, (tuple, list)):
        return type(value)(_ours(v) for v in value)
    return value


@pytest.mark.torch
@pytest.mark.parametrize("proto", [2, 4])
def test_annotations_are_inert_records_named_as_python_spells_them(
    torch: ModuleType, tmp_path: Path, proto: int
) -> None:
    forms = {
        "optional": typing.Optional[torch.Tensor],  # noqa: UP045
        "union": typing.Union[int, str, None],  # noqa: UP007
        "nested": typing.Dict[str, typing.List[int]],  # noqa: UP006
        "callable": typing.Callable[[int], str],
        "literal": typing.Literal["a", 1],
    }
    path = tmp_path / f"forms{proto}.pt"
    torch.save({**forms, "none": type(None), "w": torch.arange(3.0)}, path, pickle_protocol=proto)
    loaded = torchless.load(path)
    for key, form in forms.items():
        got = loaded[key]
        assert isinstance(got, Annotation), key
        assert got.text == repr(form), key
        assert got.class_path in ("operator.getitem", "_operator.getitem")
        assert _ours(got) == _path(form), key
    assert loaded["none"] == Global("builtins", "NoneType")
    assert list(torchless.open(path).tensors) == ["w"]


@pytest.mark.parametrize(
    ("body", "callable_path"),
    [
        # getitem of something other than a typing form: a record, nothing subscripted
        (_g("collections", "OrderedDict") + b")R" + b"K\x00\x86R", "_operator.getitem"),
        (
            _g("typing", "Union") + _g("collections", "OrderedDict") + b")R\x85\x86R",
            "_operator.getitem",
        ),
        # type(name, bases, namespace) would make a class: a record
        (b"X\x01\x00\x00\x00C" + _g("builtins", "object") + b"\x85}\x87R", "builtins.type"),
        # type() of a record: a record
        (_g("mylib", "Thing") + b")R\x85R", "builtins.type"),
    ],
)
def test_other_getitem_and_type_calls_are_inert_records(
    tmp_path: Path, body: bytes, callable_path: str
) -> None:
    func = (
        _g("_operator", "getitem")
        if callable_path.endswith("getitem")
        else _g("__builtin__", "type")
    )
    path = tmp_path / "x.pkl"
    path.write_bytes(b"\x80\x02" + func + body + b".")
    value = torchless.load(path)
    assert type(value) is Opaque
    assert value.class_path == callable_path
