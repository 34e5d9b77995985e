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


@pytest.mark.torch
@pytest.mark.parametrize("proto", [2, 4])
def test_builtin_generics_and_unions_are_annotations(
    torch: ModuleType, tmp_path: Path, proto: int
) -> None:
    """``list[int]`` is pickled as ``types.GenericAlias(list, (int,))``, ``int | None`` as
    ``functools.reduce(operator.or_, (int, NoneType))``: both are annotations, read and
    scanned clean; the text is what ``repr`` of torch.load's value says."""
    import collections

    from torchless.scanner.files import scan

    forms = {
        "list": list[int],
        "nested": dict[str, list[int]],
        "ordered": collections.OrderedDict[str, int],
        "union": int | None,
        "union3": int | str | None,
        "inner": list[int | None],
        "mixed": typing.Optional[list[int]],  # noqa: UP045
        "empty": tuple[()],
    }
    path = tmp_path / f"generics{proto}.pt"
    torch.save({**forms, "w": torch.arange(3.0)}, path, pickle_protocol=proto)
    reference = torch.load(path, weights_only=False)
    loaded = torchless.load(path)
    for key in forms:
        got = loaded[key]
        assert isinstance(got, Annotation), key
        assert got.text == repr(reference[key]), key
    report = scan(path).files[0]
    assert report.status == "clean", [a for a in report.actions if a.severity != "vetted"]


@pytest.mark.parametrize(
    "body",
    [
        # reduce with a function other than or_: it calls it on the file's values
        _g("functools", "reduce") + _g("_operator", "add") + b"K\x01K\x02\x86\x86R",
        # | of an object the file built: its class's __or__ runs
        _g("functools", "reduce") + _g("_operator", "or_")
        + _g("mylib", "Thing") + b")R" + _g("__builtin__", "int") + b"\x86\x86R",
        _g("_operator", "or_") + _g("mylib", "Thing") + b")R" + b"K\x01\x86R",
    ],
)
def test_other_reduce_and_or_calls_are_refused_and_not_clean(
    tmp_path: Path, body: bytes
) -> None:
    from torchless.scanner.files import scan

    path = tmp_path / "x.pkl"
    path.write_bytes(b"\x80\x02" + body + b".")
    with pytest.raises(torchless.UnsafeGlobalError):
        torchless.load(path)
    assert scan(path).files[0].status != "clean"


def test_a_generic_alias_of_a_callable_is_a_record_and_not_clean(tmp_path: Path) -> None:
    """``types.GenericAlias`` keeps its origin; attribute reads and calls of the alias go to
    it, so an alias of a callable the file built is no annotation."""
    from torchless.scanner.files import scan

    path = tmp_path / "x.pkl"
    partial = _g("functools", "partial") + _g("mylib", "hook") + b"\x85R"
    path.write_bytes(b"\x80\x02" + _g("types", "GenericAlias") + partial + b")\x86R.")
    value = torchless.load(path)
    assert type(value) is Opaque and value.class_path == "types.GenericAlias"
    assert scan(path).files[0].status != "clean"


@pytest.mark.parametrize("origin", [("builtins", "eval"), ("collections", "namedtuple"),
                                    ("typing", "get_type_hints"), ("mylib", "Thing")])
def test_a_generic_alias_of_a_function_is_not_clean(
    tmp_path: Path, origin: tuple[str, str]
) -> None:
    """Calling an alias calls its origin: only classes make a vetted annotation."""
    from torchless.scanner.files import scan

    path = tmp_path / "x.pkl"
    path.write_bytes(b"\x80\x02" + _g("types", "GenericAlias") + _g(*origin)
                     + _g("__builtin__", "int") + b"\x85\x86R.")
    assert scan(path).files[0].status != "clean"
