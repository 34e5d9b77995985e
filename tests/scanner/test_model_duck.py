"""The execution model's duck-typed calls, pickle by pickle (hand-written opcodes).

``json.dump`` is the probe: importing ``json`` is vetted, calling ``json.dump`` is not, so an
``unvetted`` call of it appears exactly where the model counts the value as called. What each
vetted callable does with its arguments comes from CPython's and torch's code (cited inline).
"""

from __future__ import annotations

import struct
import time
from pathlib import Path
from types import ModuleType

import pytest

from torchless.scanner.files import FileScan, scan


def _g(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _s(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _scan(tmp_path: Path, body: bytes) -> FileScan:
    p = tmp_path / "x.pkl"
    p.write_bytes(b"\x80\x02" + body + b".")
    return scan(p).files[0]


def _probe_calls(f: FileScan) -> list[str]:
    return [a.severity for a in f.actions if a.kind == "call" and a.target == "json.dump"]


#: SimpleNamespace pickles as (SimpleNamespace, (), {'keys': json.dump}) + BUILD.
_NS = _g("types", "SimpleNamespace") + b")R}" + _s("keys") + _g("json", "dump") + b"sb"


def test_a_namespace_handed_where_keys_is_called(tmp_path: Path) -> None:
    """dict(x) calls x.keys() on a non-dict (CPython dict_update_arg)."""
    f = _scan(tmp_path, _g("builtins", "dict") + b"(" + _NS + b"tR0N")
    assert (f.status, _probe_calls(f)) == ("unvetted", ["unvetted"])


def test_the_same_namespace_where_nothing_is_called_is_clean(tmp_path: Path) -> None:
    """torch.Size(x) iterates x in C (a type slot): no attribute of x is called; the
    namespace is not kept, so it is not in the value torch.load returns."""
    f = _scan(tmp_path, _g("torch", "Size") + b"(" + _NS + b"tR0N")
    assert (f.status, _probe_calls(f)) == ("clean", [])


def test_a_namespace_returned_is_in_the_object_graph(tmp_path: Path) -> None:
    f = _scan(tmp_path, _NS)
    assert (f.status, _probe_calls(f)) == ("unvetted", ["unvetted"])


def _built(cls: tuple[str, str]) -> bytes:
    """cls.__new__(cls) (NEWOBJ), BUILD with defaultdict(json.dump), then dropped (POP)."""
    factory = _g("collections", "defaultdict") + b"(" + _g("json", "dump") + b"tR"
    return _g(*cls) + b")\x81" + factory + b"b0N"


def test_a_defaultdict_state_subscripted_runs_its_factory(tmp_path: Path) -> None:
    """UUID.__setstate__ reads state['int']: a missing key of a defaultdict calls it."""
    f = _scan(tmp_path, _built(("uuid", "UUID")))
    assert (f.status, _probe_calls(f)) == ("unvetted", ["unvetted"])


def test_a_defaultdict_state_set_by_load_build_is_clean(tmp_path: Path) -> None:
    """SimpleNamespace has no __setstate__: C's load_build walks the dict with PyDict_Next,
    which never calls __missing__."""
    f = _scan(tmp_path, _built(("types", "SimpleNamespace")))
    assert (f.status, _probe_calls(f)) == ("clean", [])


def test_a_callable_handed_to_an_entry_without_a_spec_counts_as_called(
        tmp_path: Path) -> None:
    f = _scan(tmp_path, _g("torch._utils", "_rebuild_qtensor") + b"(" + _g("json", "dump")
              + b"tR0N")
    assert (f.status, _probe_calls(f)) == ("unvetted", ["unvetted"])


def test_a_partial_rebuilt_after_it_was_handed_on_is_judged_again(tmp_path: Path) -> None:
    """partial(dict) is vetted where it is handed on; its BUILD then swaps in json.dump."""
    partial = _g("functools", "partial") + b"(" + _g("builtins", "dict") + b"tRq\x00"
    handed = _g("torch._utils", "_rebuild_qtensor") + b"(" + partial + b"tR0"
    swap = b"h\x00(" + _g("json", "dump") + b")}Ntb0N"
    f = _scan(tmp_path, handed + swap)
    assert (f.status, _probe_calls(f)) == ("unvetted", ["unvetted"])


def test_hydra_partial_is_clean_and_numpy_save_is_not(tmp_path: Path) -> None:
    adamw = _g("functools", "partial") + b"(" + _g("torch.optim.adamw", "AdamW") + b"tR"
    assert _scan(tmp_path, adamw).status == "clean"
    save = _g("functools", "partial") + b"(" + _g("numpy", "save") + _s("/tmp/x") + b"tR"
    assert _scan(tmp_path, save).status == "dangerous"


def test_a_dag_of_tuples_handed_on_stays_linear(tmp_path: Path) -> None:
    """t(i+1) = (t(i), t(i)) 22 times: 2**22 paths, 22 tuples; each is followed once (a walk
    of every path would take seconds). From 24 levels on, the tuple's expanded size passes
    the interpreter's own bound on nested tuples (max_container_len) and the scan stops there
    as an anomaly."""
    body = b"N" + b"q\x00h\x00h\x00\x86q\x00" * 22
    start = time.perf_counter()
    f = _scan(tmp_path, _g("torch._utils", "_rebuild_qtensor") + b"(" + body + b"tR0N")
    assert time.perf_counter() - start < 2
    assert f.status == "clean"



def test_a_name_read_with_getattr_and_returned_counts_as_called(tmp_path: Path) -> None:
    """getattr(pathlib.Path, 'touch') is a name no GLOBAL gave (its import is not reported):
    returned, the program may call it."""
    touch = _g("builtins", "getattr") + b"(" + _g("pathlib", "Path") + _s("touch") + b"tR"
    f = _scan(tmp_path, b"(" + touch + b"l")
    assert [(a.kind, a.target, a.severity) for a in f.actions if a.severity != "vetted"] == [
        ("call", "pathlib.Path.touch", "dangerous")]


def test_torch_constants_returned_are_not_calls(tmp_path: Path) -> None:
    """torch pickles a dtype, layout or qscheme by name (dtype.__reduce__ gives 'float16'):
    a value, not a callable."""
    body = b"(" + _g("torch", "float16") + _g("torch", "bfloat16") + _g("torch", "strided") + \
        _g("torch", "per_tensor_affine") + b"l"
    assert _scan(tmp_path, body).status == "clean"


@pytest.mark.torch
def test_typing_forms_and_initializers_kept_in_a_checkpoint_are_clean(
        torch: ModuleType, tmp_path: Path) -> None:
    """torch.save of typing forms at protocol 4 names ``_operator.getitem`` (the module the
    function says it is from), and a Hydra-style partial of an initializer; both are benign.
    ``_operator.getitem`` of anything but a typing form stays dangerous."""
    import functools
    import typing

    obj = {"t": typing.Optional[int], "d": typing.Dict[str, int],  # noqa: UP006, UP045
           "init": functools.partial(torch.nn.init.normal_, std=0.02),
           "fn": torch.nn.init.xavier_uniform_}
    for proto in (2, 4):
        path = tmp_path / f"forms{proto}.pt"
        torch.save(obj, path, pickle_protocol=proto)
        assert scan(path).files[0].status == "clean", proto
    bad = b"\x8c\x09_operator\x8c\x07getitem\x93" + _g("os", "environ") + _s("HOME") + b"\x86R"
    assert _scan(tmp_path, bad).status == "dangerous"


_GETITEM = _g("_operator", "getitem")


def _getitem_verdict(f: FileScan) -> list[str]:
    return [a.severity for a in f.actions if a.kind == "call" and a.target.endswith("getitem")]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        # typing.Optional[torch.Tensor]: getitem(Union, (Tensor, type(None))): typing's code
        (_GETITEM + _g("typing", "Union") + _g("torch", "Tensor") + _g("__builtin__", "type")
         + b"N\x85R\x86\x86R", "clean"),
        # Dict[str, List[int]]: a vetted typing result inside the key
        (_GETITEM + _g("typing", "Dict") + _g("builtins", "str") + _GETITEM
         + _g("typing", "List") + _g("builtins", "int") + b"\x86R\x86\x86R", "clean"),
        # Literal["a", 1]: plain values
        (_GETITEM + _g("typing", "Literal") + _s("a") + b"K\x01\x86\x86R", "clean"),
        # a typing form subscripted with an object a vetted call built: typing hashes and
        # compares it (_deduplicate, _type_check), which runs its class's code
        (_GETITEM + _g("typing", "Union") + _g("collections", "OrderedDict") + b")R"
         + _g("builtins", "int") + b"\x86\x86R", "unvetted"),
        # getitem of an object the file built: its __getitem__ runs, not vetted
        (_GETITEM + _g("collections", "OrderedDict") + b")R" + _s("k") + b"\x86R", "unvetted"),
        # a defaultdict subscripted: its factory runs on the missing key, judged as called
        (_GETITEM + _g("collections", "defaultdict") + _g("builtins", "list") + b"\x85R"
         + _s("k") + b"\x86R", "unvetted"),
    ],
)
def test_getitem_is_vetted_only_for_a_typing_form_over_classes(
        tmp_path: Path, body: bytes, status: str) -> None:
    f = _scan(tmp_path, body)
    assert f.status == status
    assert _getitem_verdict(f)[-1] == ("vetted" if status == "clean" else status)


def test_a_defaultdict_factory_a_getitem_runs_is_judged_as_called(tmp_path: Path) -> None:
    body = _GETITEM + _g("collections", "defaultdict") + _g("json", "dump") + b"\x85R" + \
        _s("k") + b"\x86R"
    assert "unvetted" in _probe_calls(_scan(tmp_path, body))


def test_type_makes_a_class_unvetted_and_reads_a_type_vetted(tmp_path: Path) -> None:
    """type(x) is Py_TYPE(x); type(name, bases, ns) runs the bases' metaclass and
    __init_subclass__: code nobody vetted, not a known danger."""
    one = _g("__builtin__", "type") + b"K\x01\x85R"
    assert _scan(tmp_path, one).status == "clean"
    three = _g("__builtin__", "type") + _s("C") + _g("builtins", "object") + b"\x85}\x87R"
    assert _scan(tmp_path, three).status == "unvetted"
