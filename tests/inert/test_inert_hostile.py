"""Hand-made inert files with malformed or malicious trees (docs/inert-format.md, section 2.4).

Every file here is written byte by byte (8-byte length, space-padded JSON header, data), so
nothing depends on the writer. Each must be refused with a torchless error, quickly, with
no other exception escaping, and loading must never import or call anything a file names.
"""

from __future__ import annotations

import base64
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import torchless
from torchless import Global, Limits, Opaque

#: The module, untyped: load is the API under test (docs/inert-format.md).
TL: Any = torchless

#: name -> (safetensors dtype, shape, bytes) of the entries every file below carries.
ENTRIES: dict[str, tuple[str, list[int], bytes]] = {
    "w": ("F32", [2], np.array([1.5, -2.0], dtype="<f4").tobytes()),
    "u7": ("U8", [7], bytes(range(7))),
    "u8": ("U8", [8], bytes(range(8))),
}


def header_bytes(header: dict[str, Any]) -> bytes:
    text = json.dumps(header, ensure_ascii=False).encode("utf-8")
    return text + b" " * (-len(text) % 8)


def file_bytes(tree: str | None, *, version: Any = "1",
               entries: dict[str, tuple[str, list[int], bytes]] | None = None,
               meta: dict[str, Any] | None = None) -> bytes:
    """A safetensors file whose metadata holds ``tree`` (JSON text) and ``version``."""
    entries = ENTRIES if entries is None else entries
    header: dict[str, Any] = {}
    m: dict[str, Any] = {"format": "pt"}
    if version is not None:
        m["torchless.inert"] = version
    if tree is not None:
        m["torchless.tree"] = tree
    m.update(meta or {})
    header["__metadata__"] = m
    data = b""
    for name, (dtype, shape, raw) in entries.items():
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = header_bytes(header)
    return len(h).to_bytes(8, "little") + h + data


def write(tmp_path: Path, data: bytes, name: str = "bad.inert") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def load_tree(tmp_path: Path, tree: str, **kw: Any) -> Any:
    return TL.load(write(tmp_path, file_bytes(tree)), **kw)


def refused(tmp_path: Path, data: bytes, error: type[BaseException] = torchless.CheckpointError,
            seconds: float = 10.0, **kw: Any) -> torchless.CheckpointError:
    """Loading ``data`` raises ``error`` (a torchless error) within ``seconds``."""
    path = write(tmp_path, data)
    start = time.monotonic()
    with pytest.raises(error) as info:
        TL.load(path, **kw)
    assert time.monotonic() - start < seconds, "refusal took too long"
    assert isinstance(info.value, torchless.CheckpointError)
    return info.value


def tensor(name: str = "w", dtype: str = "float32", shape: Any = (2,), **extra: Any) -> str:
    payload: dict[str, Any] = {"name": name, "dtype": dtype, "shape": list(shape), **extra}
    return json.dumps({"$tensor": payload})


def ndarray(name: str = "w", descr: Any = "<f4", shape: Any = (2,), **extra: Any) -> str:
    payload: dict[str, Any] = {"name": name, "descr": descr, "shape": list(shape), **extra}
    return json.dumps({"$ndarray": payload})


B64 = base64.b64encode(b"abc").decode()

# --------------------------------------------------------------------------- controls

VALID: dict[str, tuple[str, Any]] = {
    "plain": ('{"a": [1, 2.5, null, true, "x"]}', {"a": [1, 2.5, None, True, "x"]}),
    "int": ('{"$int": "-123456789012345678901234567890"}', -123456789012345678901234567890),
    "nan": ('{"$float": "nan:7ff0000000000001"}', None),
    "bytes": (json.dumps({"$bytes": B64}), b"abc"),
    "global": ('{"$global": ["os", "system"]}', Global("os", "system")),
    "const": ('[{"$const": "Ellipsis"}, {"$const": "NotImplemented"}]', [..., NotImplemented]),
    "tzname": ('{"$time": "01:02:03-05:30;tzname=EST;x"}',
               datetime.time(1, 2, 3, tzinfo=datetime.timezone(
                   -datetime.timedelta(hours=5, minutes=30), "EST;x"))),
    "dict": ('{"$dict": [[1, "a"], [{"$tuple": [1, 2]}, "b"]]}', {1: "a", (1, 2): "b"}),
}


@pytest.mark.parametrize("tree,want", list(VALID.values()), ids=list(VALID))
def test_valid_controls_load(tmp_path: Path, tree: str, want: Any) -> None:
    """The helpers write files the reader accepts, so refusals below are about the tree."""
    got = load_tree(tmp_path, tree)
    if want is not None:
        assert got == want and type(got) is type(want)
    else:
        assert got != got  # a NaN


def test_valid_tensor_and_array_controls(tmp_path: Path) -> None:
    got = load_tree(tmp_path, f'[{tensor()}, {ndarray()}, '
                              f'{tensor("u8", "float32", [2], raw=True)}]')
    np.testing.assert_array_equal(got[0], np.array([1.5, -2.0], dtype="<f4"))
    np.testing.assert_array_equal(got[1], np.array([1.5, -2.0], dtype="<f4"))
    assert got[2].tobytes() == bytes(range(8))


def test_cycle_through_a_list_holding_a_tuple_is_fine(tmp_path: Path) -> None:
    got = load_tree(tmp_path, '{"$id": 1, "$list": [{"$tuple": [{"$ref": 1}]}]}')
    assert type(got) is list and got[0][0] is got


def test_a_skipped_tensor_of_a_dtype_numpy_lacks_loads(tmp_path: Path) -> None:
    """convert --skip-unsupported records a quantized (or any) tensor it leaves out by its
    dtype; the reader refused such a dtype even there, so the converted file did not load."""
    got = load_tree(tmp_path, '{"$tensor": {"skipped": "torch.qint8", "dtype": "qint8", '
                              '"shape": [1]}}')
    assert isinstance(got, torchless.UnsupportedTensor)
    refused(tmp_path, file_bytes('{"$tensor": {"skipped": "x", "dtype": "float128", '
                                 '"shape": [1]}}'), torchless.FormatError)


def test_convert_skipping_a_quantized_storage_tensor_loads(tmp_path: Path) -> None:
    """A plain rebuild over a QInt8Storage (hand-made: torch's own load fails an internal
    assert on it): convert --skip-unsupported writes a file that loads."""
    from tests._fuzz_inputs import state_dict_pickle, tensor_ops, zip_checkpoint

    data = state_dict_pickle([("q", tensor_ops("0", 4, 0, (4,), (1,), "QInt8Storage")),
                              ("w", tensor_ops("1", 2, 0, (2,), (1,)))])
    src = write(tmp_path, zip_checkpoint(data, {"0": bytes(4), "1": bytes(8)}), "q.pt")
    out = tmp_path / "q.safetensors"
    TL.convert(src, out, skip_unsupported=True, verify=True)
    got = TL.load(out)
    assert isinstance(got["q"], torchless.UnsupportedTensor)
    assert got["w"].tolist() == [0.0, 0.0]


_SELF_CALLING = ('{"$id": 1, "$opaque": {"callable": {"$ref": 1}, "args": [{"$ref": 1}], '
                 '"kwargs": null, "newobj": false, "items": [], "dict_items": []}}')


def test_a_record_that_is_its_own_callable_loads_and_converts(tmp_path: Path) -> None:
    """A cycle through $opaque is allowed (section 2.3), the callable included; naming the
    record walked the callable chain without end (RecursionError in convert and repr)."""
    got = load_tree(tmp_path, _SELF_CALLING)
    assert isinstance(got, Opaque) and got.callable is got and got.args[0] is got
    assert got.class_path == "…" and repr(got) == "Opaque(…)"
    src = tmp_path / "bad.inert"
    out = tmp_path / "out.safetensors"
    with pytest.warns(torchless.OpaqueObjectWarning):
        TL.convert(src, out, verify=True)
    again = TL.load(out)
    assert isinstance(again, Opaque) and again.callable is again and again.args[0] is again


def test_class_path_spells_out_a_few_calls_of_results() -> None:
    inner = Opaque(Global("m", "f"))
    assert Opaque(Opaque(inner)).class_path == "<result of <result of m.f>>"
    deep: Opaque = inner
    for _ in range(50):
        deep = Opaque(deep)
    assert deep.class_path == "<result of " * 8 + "…" + ">" * 8


# --------------------------------------------------------------------------- malformed trees

MALFORMED: dict[str, str] = {
    # unknown tags, several tags, surplus keys
    "unknown tag": '{"$evil": 1}',
    "unknown nested tag": '[1, {"a": {"$pickle": "gASVAAAAAAAAAAA="}}]',
    "empty tag": '{"$": 1}',
    "two tags": '{"$int": "5", "$float": "nan"}',
    "key beside tag": '{"$list": [], "x": 1}',
    "only $id": '{"$id": 1}',
    "surplus tensor field": tensor(extra=1),
    "surplus odict field": '{"$odict": {"items": [], "attrs": {}, "x": 1}}',
    "missing tensor name": '{"$tensor": {"dtype": "float32", "shape": [2]}}',
    "missing deque maxlen": '{"$deque": {"items": []}}',
    # $int
    "$int number": '{"$int": 5}',
    "$int letters": '{"$int": "12a"}',
    "$int plus": '{"$int": "+5"}',
    "$int space": '{"$int": " 5"}',
    "$int underscore": '{"$int": "1_000"}',
    "$int arabic-indic digit": '{"$int": "\\u0663"}',
    "$int fullwidth digit": '{"$int": "\\uff11"}',
    "$int empty": '{"$int": ""}',
    "$int minus only": '{"$int": "-"}',
    "$int trailing newline": '{"$int": "5\\n"}',
    # $float
    "$float decimal": '{"$float": "1.5"}',
    "$float NaN case": '{"$float": "NaN"}',
    "$float Infinity": '{"$float": "Infinity"}',
    "$float number": '{"$float": 1.5}',
    "$float nan bits of inf": '{"$float": "nan:7ff0000000000000"}',
    "$float nan bits of a normal": '{"$float": "nan:0000000000000001"}',
    "$float nan bits upper": '{"$float": "nan:7FF8000000000001"}',
    "$float nan bits short": '{"$float": "nan:7ff800000000001"}',
    "$float nan bits long": '{"$float": "nan:7ff80000000000010"}',
    "JSON NaN": "[NaN]",
    "JSON Infinity": '{"a": Infinity}',
    "JSON -Infinity": "[-Infinity]",
    # other payloads of the wrong shape or type
    "$complex one": '{"$complex": [1]}',
    "$complex text": '{"$complex": [1, "a"]}',
    "$complex object": '{"$complex": {"re": 1, "im": 2}}',
    "$bytes bad chars": '{"$bytes": "!!!!"}',
    "$bytes no padding": '{"$bytes": "YQ"}',
    "$bytes number": '{"$bytes": 5}',
    "$bytes newline": '{"$bytes": "YWJj\\n"}',
    "$bytes urlsafe": '{"$bytes": "-_-_"}',
    "$bytearray list": '{"$bytearray": [1, 2]}',
    "$tuple object": '{"$tuple": {}}',
    "$list text": '{"$list": "abc"}',
    "$set number": '{"$set": 5}',
    "$dict single": '{"$dict": [[1]]}',
    "$dict triple": '{"$dict": [[1, 2, 3]]}',
    "$dict object": '{"$dict": {"a": 1}}',
    "$counter object": '{"$counter": {"a": 1}}',
    "$odict dunder attr": '{"$odict": {"items": [], "attrs": {"__class__": 1}}}',
    "$odict dunder dict": '{"$odict": {"items": [], "attrs": {"__dict__": {}}}}',
    "$odict non-identifier attr": '{"$odict": {"items": [], "attrs": {"a-b": 1}}}',
    "$module dunder attr": '{"$module": {"items": [], "attrs": {"__setstate__": 1}}}',
    "$defaultdict os.system": '{"$defaultdict": {"factory": "os.system", "items": []}}',
    "$defaultdict eval": '{"$defaultdict": {"factory": "eval", "items": []}}',
    "$defaultdict global": '{"$defaultdict": {"factory": {"$global": ["os", "system"]}, '
                           '"items": []}}',
    "$deque negative maxlen": '{"$deque": {"items": [], "maxlen": -1}}',
    "$deque text maxlen": '{"$deque": {"items": [], "maxlen": "3"}}',
    "$deque float maxlen": '{"$deque": {"items": [], "maxlen": 1.5}}',
    "$slice two": '{"$slice": [1, 2]}',
    "$slice text": '{"$slice": [1, 2, "a"]}',
    "$range step 0": '{"$range": [1, 2, 0]}',
    "$range null": '{"$range": [1, null, 1]}',
    "$range float": '{"$range": [1.5, 2, 1]}',
    "$datetime garbage": '{"$datetime": "garbage"}',
    "$datetime month 13": '{"$datetime": "2020-13-01T00:00:00"}',
    "$datetime offset 25h": '{"$datetime": "2020-01-01T00:00:00+25:00"}',
    "$datetime fold 2": '{"$datetime": "2020-01-01T00:00:00;fold=2"}',
    "$datetime tzname without offset": '{"$datetime": "2020-01-01T00:00:00;tzname=EST"}',
    "$datetime zone and tzname": '{"$datetime": "2020-01-01T00:00:00+01:00;zone=Europe/Paris'
                                 ';tzname=CET"}',
    "$datetime tzname too long": json.dumps({"$datetime": "2020-01-01T00:00:00+01:00;tzname="
                                                          + "x" * 256}),
    "$time tzname without offset": '{"$time": "01:02:03;tzname=EST"}',
    "$datetime number": '{"$datetime": 1577836800}',
    "$date garbage": '{"$date": "yesterday"}',
    "$time garbage": '{"$time": "25:00"}',
    "$timedelta overflow": '{"$timedelta": [10000000000, 0, 0]}',
    "$timedelta float": '{"$timedelta": [1.5, 0, 0]}',
    "$timedelta two": '{"$timedelta": [0, 0]}',
    "$path unknown kind": '{"$path": ["Evil", "x"]}',
    "$path one": '{"$path": ["PosixPath"]}',
    "$path number": '{"$path": ["PosixPath", 1]}',
    "$namespace list": '{"$namespace": [1]}',
    "$simplenamespace text": '{"$simplenamespace": "x"}',
    "$npscalar short data": '{"$npscalar": {"dtype": "<f4", "data": "AAA="}}',
    "$npscalar object": '{"$npscalar": {"dtype": "|O8", "data": "AAAAAAAAAAA="}}',
    "$npscalar bad code point": '{"$npscalar": {"dtype": "<U1", "data": "////fw=="}}',
    "$npscalar bad code point BE": '{"$npscalar": {"dtype": ">U1", "data": "f////w=="}}',
    "$npdtype O": '{"$npdtype": "O"}',
    "$npdtype |O8": '{"$npdtype": "|O8"}',
    "$npdtype <O8": '{"$npdtype": "<O8"}',
    "$npdtype structured": '{"$npdtype": [["a", "<f4"]]}',
    "$npdtype structured text": '{"$npdtype": "[(\'a\', \'<f4\')]"}',
    "$npdtype f3": '{"$npdtype": "<f3"}',
    "$npdtype b2": '{"$npdtype": "<b2"}',
    "$npdtype i0": '{"$npdtype": "<i0"}',
    "$npdtype huge": '{"$npdtype": "|V99999999"}',
    "$npdtype M8 no unit": '{"$npdtype": "<M8"}',
    "$npdtype M8 bad unit": '{"$npdtype": "<M8[bogus]"}',
    "$npdtype no order": '{"$npdtype": "f4"}',
    "$npdtype native order": '{"$npdtype": "=f4"}',
    "$npdtype name": '{"$npdtype": "float32"}',
    "$npdtype subarray": '{"$npdtype": "(2,)<f4"}',
    "$npdtype pickle": '{"$npdtype": "|O"}',
    "$dtype unknown": '{"$dtype": "evil"}',
    "$dtype number": '{"$dtype": 5}',
    "$device number": '{"$device": 5}',
    "$size text": '{"$size": [1, "a"]}',
    "$size object": '{"$size": {"a": 1}}',
    "$const other name": '{"$const": "True"}',
    "$const module name": '{"$const": "builtins.Ellipsis"}',
    "$const list": '{"$const": ["builtins", "Ellipsis"]}',
    "$const null": '{"$const": null}',
    "$global one": '{"$global": ["os"]}',
    "$global three": '{"$global": ["os", "system", "x"]}',
    "$global number": '{"$global": ["os", 1]}',
    "$global null": '{"$global": [null, "system"]}',
    "$global text": '{"$global": "os.system"}',
    "$global object": '{"$global": {"module": "os", "name": "system"}}',
    "$opaque kwargs object": '{"$opaque": {"callable": null, "args": [], "kwargs": {}, '
                             '"newobj": false, "items": [], "dict_items": []}}',
    "$opaque newobj text": '{"$opaque": {"callable": null, "args": [], "kwargs": null, '
                           '"newobj": "yes", "items": [], "dict_items": []}}',
    "$opaque missing callable": '{"$opaque": {"args": [], "kwargs": null, "newobj": false, '
                                '"items": [], "dict_items": []}}',
    "$opaque args object": '{"$opaque": {"callable": null, "args": {}, "kwargs": null, '
                           '"newobj": false, "items": [], "dict_items": []}}',
    "$obj type number": '{"$obj": {"type": 1, "state": 0}}',
    "$obj missing state": '{"$obj": {"type": "a:B"}}',
    "$objarray count": '{"$objarray": {"shape": [2, 2], "items": [1, 2, 3]}}',
    "$objarray negative": '{"$objarray": {"shape": [-1], "items": []}}',
    "$objarray items object": '{"$objarray": {"shape": [1], "items": {"a": 1}}}',
    "$unsupported number": '{"$unsupported": {"kind": 1}}',
    "$record kind": '{"$record": {"kind": "os.system", "fields": {}}}',
    "$record kind number": '{"$record": {"kind": 1, "fields": {}}}',
    "$record fields list": '{"$record": {"kind": "meta", "fields": []}}',
    "$record fields text": '{"$record": {"kind": "meta", "fields": "x"}}',
    "$record missing fields": '{"$record": {"kind": "meta"}}',
    "$record extra": '{"$record": {"kind": "meta", "fields": {}, "x": 1}}',
    "$record fields keys": '{"$record": {"kind": "meta", "fields": {"$dict": [[1, 2]]}}}',
    # ids and references
    "$id text": '{"$id": "a", "$list": []}',
    "$id float": '{"$id": 1.5, "$list": []}',
    "$id bool": '{"$id": true, "$list": []}',
    "$ref text": '[{"$id": 1, "$list": []}, {"$ref": "1"}]',
    "$ref bool": '[{"$id": 1, "$list": []}, {"$ref": true}]',
    "$ref undefined": '{"$ref": 5}',
    "$ref undefined nested": '[[{"$ref": 0}]]',
    "$ref forward": '[{"$ref": 1}, {"$id": 1, "$list": []}]',
    "$id duplicate": '[{"$id": 1, "$list": []}, {"$id": 1, "$list": []}]',
    "$id duplicate nested": '{"$id": 1, "$list": [{"$id": 1, "$dict": []}]}',
    "cycle through $tuple": '{"$id": 1, "$tuple": [{"$ref": 1}]}',
    "cycle through nested $tuple": '{"$id": 1, "$list": [{"$id": 2, "$tuple": [[{"$ref": 2}]]}]}',
    "cycle through $frozenset": '{"$id": 1, "$frozenset": [{"$ref": 1}]}',
    "cycle through $set": '{"$id": 1, "$set": [{"$ref": 1}]}',
    "cycle through $objarray": '{"$id": 1, "$objarray": {"shape": [1], "items": [{"$ref": 1}]}}',
    "cycle through $complex": '{"$id": 1, "$complex": [{"$ref": 1}, 0]}',
    "cycle through dict key": '{"$id": 1, "$dict": [[{"$ref": 1}, 1]]}',
    # unhashable keys and members
    "list key": '{"$dict": [[[1, 2], 3]]}',
    "dict key": '{"$dict": [[{"a": 1}, 3]]}',
    "bytearray key": json.dumps({"$dict": [[{"$bytearray": B64}, 1]]}),
    "set key": '{"$dict": [[{"$set": []}, 1]]}',
    "tuple of list key": '{"$dict": [[{"$tuple": [[1]]}, 1]]}',
    "frozenset of dict": '{"$frozenset": [{"$dict": []}]}',
    "set of list": '{"$set": [[1]]}',
    "counter list key": '{"$counter": [[[1], 1]]}',
    "defaultdict list key": '{"$defaultdict": {"factory": null, "items": [[[1], 1]]}}',
    "odict list key": '{"$odict": {"items": [[[1], 1]], "attrs": {}}}',
    "array key": f'{{"$dict": [[{ndarray()}, 1]]}}',
    "tensor key": f'{{"$dict": [[{tensor()}, 1]]}}',
    "ref to list as key": '[{"$id": 1, "$list": []}, {"$dict": [[{"$ref": 1}, 2]]}]',
    "namespace key": '{"$dict": [[{"$namespace": {}}, 1]]}',
    # duplicate keys
    "duplicate plain keys": '{"a": 1, "a": 2}',
    "duplicate tag": '{"$list": [1], "$list": [2]}',
    "duplicate $id": '{"$id": 1, "$id": 2, "$list": []}',
    "duplicate tensor field": '{"$tensor": {"name": "w", "name": "u8", "dtype": "float32", '
                              '"shape": [2]}}',
    "duplicate namespace name": '{"$namespace": {"a": 1, "a": 2}}',
    # not JSON
    "truncated": '{"a": ',
    "trailing comma": "[1,]",
    "empty": "",
    "two values": "1 2",
    "trailing garbage": "[1] x",
    "single quotes": "{'a': 1}",
    "comment": "[1] // x",
    # tensors and arrays against the entries
    "tensor missing entry": tensor("nope"),
    "tensor name number": tensor(1),  # type: ignore[arg-type]
    "tensor dtype mismatch": tensor(dtype="int32"),
    "tensor dtype bf16 vs F32": tensor(dtype="bfloat16"),
    "tensor shape mismatch": tensor(shape=[3]),
    "tensor shape rank": tensor(shape=[1, 2]),
    "tensor shape negative": tensor(shape=[-2]),
    "tensor shape text": tensor(shape=["2"]),
    "tensor shape bool": tensor(shape=[True, True]),
    "tensor shape object": '{"$tensor": {"name": "w", "dtype": "float32", "shape": {}}}',
    "tensor unknown dtype": tensor(dtype="float128"),
    "tensor quantized dtype": tensor("u8", "qint8", [8], raw=True),
    "tensor dtype text junk": tensor(dtype="float32; import os"),
    "tensor raw count short": tensor("u7", "float32", [2], raw=True),
    "tensor raw count long": tensor("u8", "float32", [1], raw=True),
    "tensor raw count complex128": tensor("u8", "complex128", [1], raw=True),
    "tensor raw entry not U8": tensor("w", "int32", [2], raw=True),
    "tensor raw text": tensor(raw="yes"),
    "tensor requires_grad text": tensor(requires_grad="yes"),
    "tensor parameter number": tensor(parameter=1),
    "tensor device number": tensor(device=0),
    "ndarray missing entry": ndarray("nope"),
    "ndarray shape mismatch": ndarray(shape=[3]),
    "ndarray dtype mismatch": ndarray(descr="<i4"),
    "ndarray big-endian count": ndarray("u7", ">f8", [1]),
    "ndarray raw count": ndarray("u8", "<c16", [1]),
    "ndarray O": ndarray("u8", "O", [1]),
    "ndarray |O8": ndarray("u8", "|O8", [1]),
    "ndarray structured": ndarray("u8", [["a", "<f4"], ["b", "<f4"]], [1]),
    "ndarray structured text": ndarray("u8", "[('a', '<f4')]", [1]),
    "ndarray fortran text": ndarray(fortran="yes"),
    "ndarray descr number": ndarray(descr=4),
}


@pytest.mark.parametrize("tree", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_tree_is_refused(tmp_path: Path, tree: str) -> None:
    refused(tmp_path, file_bytes(tree), torchless.FormatError)


@pytest.mark.parametrize("tree", [MALFORMED[k] for k in (
    "tensor missing entry", "tensor dtype mismatch", "tensor shape mismatch",
    "tensor raw count short", "tensor raw entry not U8", "cycle through $tuple",
    "list key", "$ref forward", "unknown tag")])
def test_malformed_tree_is_refused_with_torch_tensors(tmp_path: Path, tree: str) -> None:
    pytest.importorskip("torch")
    refused(tmp_path, file_bytes(tree), torchless.FormatError, framework="pt")


def test_lone_surrogate_in_a_string(tmp_path: Path) -> None:
    """Either refused as not UTF-8 or read as a str; never a UnicodeError escaping."""
    path = write(tmp_path, file_bytes('["\\ud800"]'))
    try:
        got = TL.load(path)
    except torchless.CheckpointError:
        return
    assert got == ["\ud800"]


# --------------------------------------------------------------------------- versions

@pytest.mark.parametrize("version", ["2", "0", "1.0", " 1", "01", "", "one", "1 "])
def test_unknown_version_is_refused_and_named(tmp_path: Path, version: str) -> None:
    err = refused(tmp_path, file_bytes("[1]", version=version), torchless.FormatError)
    if version.strip():
        assert repr(version) in str(err) or version in str(err)


@pytest.mark.parametrize("version", [1, None, True, [1]], ids=["int", "null", "bool", "list"])
def test_non_text_version_is_refused(tmp_path: Path, version: Any) -> None:
    data = file_bytes("[1]", version="PLACEHOLDER")
    data = data.replace(b'"PLACEHOLDER"', json.dumps(version).encode().ljust(13))
    refused(tmp_path, data)


def test_missing_version_does_not_decode_the_tree(tmp_path: Path) -> None:
    """Without ``torchless.inert`` the file is a plain safetensors file: its tensors only."""
    path = write(tmp_path, file_bytes('{"$global": ["os", "system"]}', version=None))
    try:
        got = TL.load(path)
    except torchless.CheckpointError:
        return
    assert isinstance(got, dict) and set(got) == set(ENTRIES)


@pytest.mark.parametrize("tree", ["5", "null", "[1]", '{"a": 1}'])
def test_tree_that_is_not_text_is_refused(tmp_path: Path, tree: str) -> None:
    data = file_bytes("PLACEHOLDER__")
    data = data.replace(b'"PLACEHOLDER__"', tree.encode().ljust(15))
    refused(tmp_path, data)


def test_missing_tree_is_refused(tmp_path: Path) -> None:
    refused(tmp_path, file_bytes(None), torchless.FormatError)


@pytest.mark.parametrize("junk", [b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\xc0\xaf"],
                         ids=["ff-fe", "bad-continuation", "encoded-surrogate", "overlong"])
def test_tree_not_utf8_is_refused(tmp_path: Path, junk: bytes) -> None:
    data = file_bytes('["PLACEHOLDER"]')
    data = data.replace(b"PLACEHOLDER", junk.ljust(11, b"x"))
    refused(tmp_path, data, torchless.FormatError)


def test_unknown_metadata_keys_are_ignored(tmp_path: Path) -> None:
    path = write(tmp_path, file_bytes("[1]", meta={"torchless.future": "x", "source": "a.pt"}))
    assert TL.load(path) == [1]


# --------------------------------------------------------------------------- size and depth

def nest(depth: int, open_: str, close: str, inner: str = "1") -> str:
    return open_ * depth + inner + close * depth


DEEP: dict[str, str] = {
    "lists": nest(100_000, "[", "]"),
    "objects": nest(100_000, '{"a":', "}"),
    "$list tags": nest(100_000, '{"$list":[', "]}"),
    "$tuple tags": nest(100_000, '{"$tuple":[', "]}"),
    "$dict values": nest(100_000, '{"$dict":[[1,', "]]}"),
    "$dict keys": nest(100_000, '{"$dict":[[{"$tuple":[', ']},1]]}'),
    "$namespace": nest(100_000, '{"$namespace":{"a":', "}}"),
    "unclosed": "[" * 100_000,
}


@pytest.mark.parametrize("tree", list(DEEP.values()), ids=list(DEEP))
def test_deep_nesting_is_refused_quickly(tmp_path: Path, tree: str) -> None:
    err = refused(tmp_path, file_bytes(tree), seconds=10.0)
    assert isinstance(err, (torchless.LimitError, torchless.FormatError))


@pytest.mark.parametrize("depth", [300, 1000])
def test_nesting_beyond_max_depth_is_a_limit_error(tmp_path: Path, depth: int) -> None:
    refused(tmp_path, file_bytes(nest(depth, "[", "]")), torchless.LimitError)


def test_max_depth_is_configurable(tmp_path: Path) -> None:
    tree = nest(20, '{"$list":[', "]}")
    refused(tmp_path, file_bytes(tree), torchless.LimitError, limits=Limits(max_depth=10))
    got = TL.load(write(tmp_path, file_bytes(nest(100, "[", "]")), "ok.inert"))
    for _ in range(100):
        got = got[0]
    assert got == 1


@pytest.mark.parametrize("tree", ["[1, 2, 3, 4, 5, 6]", '{"$tuple": [1, 2, 3, 4, 5, 6]}',
                                  '{"$dict": [[1,1],[2,2],[3,3],[4,4],[5,5],[6,6]]}',
                                  '{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6}',
                                  '{"$set": [1, 2, 3, 4, 5, 6]}',
                                  '{"$objarray": {"shape": [6], "items": [1,2,3,4,5,6]}}'])
def test_container_limit(tmp_path: Path, tree: str) -> None:
    refused(tmp_path, file_bytes(tree), torchless.LimitError,
            limits=Limits(max_container_len=5))


def test_objarray_shape_product_is_bounded(tmp_path: Path) -> None:
    tree = '{"$objarray": {"shape": [100000, 100000, 100000], "items": []}}'
    refused(tmp_path, file_bytes(tree))


def test_int_with_a_million_digits_is_refused_quickly(tmp_path: Path) -> None:
    tree = '{"$int": "' + "7" * 1_000_000 + '"}'
    refused(tmp_path, file_bytes(tree), torchless.LimitError, seconds=5.0)


def test_plain_json_int_with_5000_digits_is_refused(tmp_path: Path) -> None:
    err = refused(tmp_path, file_bytes("[" + "1" * 5000 + "]"))
    assert isinstance(err, (torchless.LimitError, torchless.FormatError))


def test_int_with_4301_digits_is_a_limit_error(tmp_path: Path) -> None:
    refused(tmp_path, file_bytes('{"$int": "' + "9" * 4301 + '"}'), torchless.LimitError)


@pytest.mark.parametrize("sign", ["", "-"])
def test_int_with_4300_digits_loads(tmp_path: Path, sign: str) -> None:
    """The limit counts digits (section 2.2): the sign is not a digit."""
    got = load_tree(tmp_path, '{"$int": "' + sign + "9" * 4300 + '"}')
    assert got == int(sign + "9" * 4300)


def test_huge_bytes_value(tmp_path: Path) -> None:
    """A 12 MB base64 string within the header: read back exactly, not copied per level."""
    raw = bytes(range(256)) * (9 * 4096)
    got = load_tree(tmp_path, json.dumps([[[{"$bytes": base64.b64encode(raw).decode()}]]]))
    assert got[0][0][0] == raw


def test_header_length_beyond_the_safetensors_limit(tmp_path: Path) -> None:
    data = file_bytes("[1]")
    data = (200_000_000).to_bytes(8, "little") + data[8:]
    refused(tmp_path, data)


def test_header_length_beyond_the_file(tmp_path: Path) -> None:
    data = file_bytes("[1]")
    data = (len(data)).to_bytes(8, "little") + data[8:]
    refused(tmp_path, data)


def test_many_refs_to_one_big_list_are_cheap(tmp_path: Path) -> None:
    """A billion-laughs shape: 30 levels each naming the previous twice stays linear."""
    parts = ['{"$id": 0, "$list": [1, 2, 3]}']
    for i in range(1, 30):
        parts.append(f'{{"$id": {i}, "$list": [{{"$ref": {i - 1}}}, {{"$ref": {i - 1}}}]}}')
    start = time.monotonic()
    got = load_tree(tmp_path, "[" + ", ".join(parts) + "]")
    assert time.monotonic() - start < 10
    assert got[29][0] is got[28] and got[29][1] is got[28]


# --------------------------------------------------------------------------- never imports

MODULE = "torchless_test_should_not_import_xyz"


@pytest.mark.parametrize("mode", ["numpy", "torch"])
def test_loading_never_imports_named_modules(tmp_path: Path, mode: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    if mode == "torch":
        pytest.importorskip("torch")
    marker = tmp_path / "imported.marker"
    pkg = tmp_path / "mods"
    pkg.mkdir()
    (pkg / f"{MODULE}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n"
        "class Thing:\n    pass\n"
        "def boom(*a, **k):\n    Path(" + repr(str(marker)) + ").write_text('called')\n")
    monkeypatch.syspath_prepend(str(pkg))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    tree = json.dumps({
        "g": {"$global": [MODULE, "boom"]},
        "op": {"$opaque": {"callable": {"$global": [MODULE, "Thing"]},
                           "args": [1], "kwargs": [["k", 2]], "newobj": True,
                           "state": {"a": 1}, "items": [3], "dict_items": [["d", 4]]}},
        "obj": {"$obj": {"type": f"{MODULE}:Thing", "state": [1, 2]}},
        "obj2": {"$obj": {"type": f"{MODULE}.Thing", "state": None}},
        "odict": {"$odict": {"items": [], "attrs": {"_metadata": {"$global": [MODULE, "x"]}}}},
    })
    got = TL.load(write(tmp_path, file_bytes(tree)), framework=mode)
    assert not marker.exists(), marker.read_text()
    assert MODULE not in sys.modules
    assert got["g"] == Global(MODULE, "boom")
    assert type(got["op"]) is Opaque and got["op"].callable == Global(MODULE, "Thing")
    assert got["op"].args == (1,) and got["op"].state == {"a": 1}
    assert type(got["obj"]) is Opaque and got["obj"].callable == Global(MODULE, "Thing")
    assert got["obj"].newobj is True and got["obj"].state == [1, 2]
    assert type(got["obj2"]) is Opaque and got["obj2"].callable.module == f"{MODULE}.Thing"
    # the names are data, never resolved: still not imported after touching the results
    repr(got)
    assert not marker.exists() and MODULE not in sys.modules


def test_refused_defaultdict_factory_does_not_import(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "imported.marker"
    pkg = tmp_path / "mods"
    pkg.mkdir()
    (pkg / f"{MODULE}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n")
    monkeypatch.syspath_prepend(str(pkg))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    for tree in (f'{{"$defaultdict": {{"factory": "{MODULE}.f", "items": []}}}}',
                 f'{{"$path": ["{MODULE}", "x"]}}', f'{{"$dtype": "{MODULE}"}}',
                 f'{{"$npdtype": "{MODULE}"}}', f'{{"${MODULE}": 1}}'):
        refused(tmp_path, file_bytes(tree), torchless.FormatError)
    assert not marker.exists() and MODULE not in sys.modules


@pytest.mark.parametrize("shape", [[0, 2**62], [2**62, 0], [0] * 65])
def test_empty_tensor_with_absurd_shape(tmp_path: Path, shape: list[int]) -> None:
    """Zero bytes but an absurd shape: refused or an empty array, never a crash."""
    entries = {"e": ("U8", [0], b"")}
    data = file_bytes(tensor("e", "float32", shape, raw=True), entries=entries)
    path = write(tmp_path, data)
    try:
        got = TL.load(path)
    except torchless.CheckpointError:
        return
    assert got.size == 0 and list(got.shape) == shape
