"""The execution model: what each hand-built pickle makes torch.load do, action by action.

Each pickle is spelled out opcode by opcode here, so the expected actions come from the bytes
(and CPython's unpickler semantics), not from the scanner's output.
"""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path

import pytest

import torchless
from torchless.rules.allowlist import CALLS, FORWARDS, NEW_ONLY, call_verdict, import_verdict
from torchless.scanner.files import FileScan, scan


def _g(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _s(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _scan(tmp_path: Path, body: bytes, name: str = "x.pkl") -> FileScan:
    p = tmp_path / name
    p.write_bytes(b"\x80\x02" + body + b".")
    return scan(p).files[0]


def _bad(f: FileScan) -> list[tuple[str, str, str]]:
    return [(a.kind, a.target, a.severity) for a in f.actions if a.severity != "vetted"]


def test_a_reference_never_called_is_clean(tmp_path: Path) -> None:
    """A function or class kept as a value: only its module's import runs."""
    body = b"(" + _g("torch.nn.functional", "gelu") + _g("numpy", "float32") + \
        _g("math", "sqrt") + _g("torch._C._nn", "gelu") + b"l"
    f = _scan(tmp_path, body)
    assert (f.status, _bad(f)) == ("clean", [])
    assert [a.kind for a in f.actions] == ["import"] * 4
    assert torchless.load(tmp_path / "x.pkl")  # the reader keeps them as references


def test_a_dangerous_name_is_dangerous_even_unused(tmp_path: Path) -> None:
    f = _scan(tmp_path, _g("os", "system"))
    assert _bad(f) == [("import", "os.system", "dangerous")]


def test_calling_an_unvetted_function_names_its_package(tmp_path: Path) -> None:
    f = _scan(tmp_path, _g("mylib.io", "load_all") + b"(" + _s("a") + b"tR")
    assert f.status == "unvetted"
    (call,) = [a for a in f.actions if a.kind == "call"]
    assert (call.target, call.severity, call.args) == ("mylib.io.load_all", "unvetted",
                                                       "('a',)")
    assert "mylib" in call.reason
    with pytest.raises(torchless.UnsafeGlobalError):
        torchless.load(tmp_path / "x.pkl")


def test_partial_forwards_when_called(tmp_path: Path) -> None:
    """partial(mylib.fn) kept is an unvetted import; calling it forwards: dangerous."""
    kept = _g("functools", "partial") + b"(" + _g("torch.optim.adamw", "AdamW") + b"tR"
    assert _scan(tmp_path, kept).status == "clean"
    called = _g("functools", "partial") + b"(" + _g("mylib", "fn") + b"tR)R"
    f = _scan(tmp_path, called)
    assert ("call", "mylib.fn", "dangerous") in _bad(f)
    assert f.status == "dangerous"


def test_newobj_and_build_of_the_loading_programs_class(tmp_path: Path) -> None:
    """A dataclass of __main__ saved by a training script: NEWOBJ + BUILD of its dict."""
    body = _g("__main__", "Config") + b")\x81}" + _s("lr") + b"G?\xb9\x99\x99\x99\x99\x99\x9a" \
        + b"sb"
    f = _scan(tmp_path, body)
    assert f.status == "clean"
    assert [(a.kind, a.target) for a in f.actions] == [
        ("import", "__main__.Config"), ("call", "__main__.Config.__new__"),
        ("build", "__main__.Config")]


def test_enum_of_the_loading_program(tmp_path: Path) -> None:
    assert _scan(tmp_path, _g("__main__", "Color") + b"(" + _s("red") + b"tR").status == "clean"
    planet = _g("__main__", "Planet") + b"((G@\x00\x00\x00\x00\x00\x00\x00K\x03ttR"
    assert _scan(tmp_path, planet).status == "clean"  # a tuple value
    two = _g("__main__", "Runner") + b"(" + _s("a") + _s("b") + b"tR"
    assert _bad(_scan(tmp_path, two)) == [("call", "__main__.Runner", "unvetted")]


def test_build_on_a_class_itself_is_dangerous(tmp_path: Path) -> None:
    body = _g("argparse", "Namespace") + b"N}" + _s("__eq__") + _g("math", "sqrt") + b"s\x86b"
    f = _scan(tmp_path, body)
    assert ("build", "argparse.Namespace", "dangerous") in _bad(f)


def test_getattr_method_call_and_zoneinfo(tmp_path: Path) -> None:
    zone = _g("builtins", "getattr") + b"(" + _g("zoneinfo", "ZoneInfo") + _s("_unpickle") + \
        b"tR(" + _s("UTC") + b"K\x01tR"
    assert _scan(tmp_path, zone).status == "clean"
    method = _g("builtins", "getattr") + b"(" + _g("pathlib", "Path") + b"(" + _s("/x") + \
        b"tR" + _s("touch") + b"tR)R"
    f = _scan(tmp_path, method)
    assert f.status == "dangerous"
    # the getattr (of an object whose class is not known: Path(...) makes a PosixPath) and
    # the call of what it read
    assert [(a.kind, a.target) for a in f.actions if a.severity == "dangerous"] == [
        ("call", "builtins.getattr"), ("call", "pathlib.Path.touch")]


def test_names_past_a_break_c_also_stops_at_are_not_actions(tmp_path: Path) -> None:
    """The run stops where the C unpickler stops (a POP on an empty stack): the name after
    it never runs, so it is no action, but the break is an anomaly (never clean)."""
    data = b"\x80\x02)0" + b"0" + _g("mylib", "Thing") + b")R."
    looked_up: list[tuple[str, str]] = []

    class Recording(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> object:
            looked_up.append((module, name))
            return object

    import io

    with pytest.raises(pickle.UnpicklingError):
        Recording(io.BytesIO(data)).load()
    assert looked_up == []  # C stops at the second POP, before the GLOBAL
    p = tmp_path / "broken.pkl"
    p.write_bytes(data)
    f = scan(p).files[0]
    assert f.status == "anomalous"
    assert not any(a.target == "mylib.Thing" for a in f.actions)
    assert [a.offset for a in f.anomalies if a.kind == "pickle"] == [4]


def test_json_carries_each_action(tmp_path: Path) -> None:
    p = tmp_path / "j.pkl"
    p.write_bytes(pickle.dumps({"a": 1}, protocol=2)[:2] + _g("wave", "open") + b"(" +
                  _s("/tmp/x") + _s("wb") + b"tR.")
    doc = json.loads(scan(p).to_json())
    acts = doc["files"][0]["actions"]
    assert {(a["kind"], a["target"], a["severity"]) for a in acts} == {
        ("import", "wave.open", "dangerous"), ("call", "wave.open", "dangerous")}
    assert [a["args"] for a in acts if a["kind"] == "call"] == ["('/tmp/x', 'wb')"]
    assert doc["exit_code"] == 1


def test_every_entry_has_a_reason() -> None:
    for table in (CALLS, NEW_ONLY, FORWARDS):
        for path, reason in table.items():
            assert "." in path and len(reason) > 4, path
    assert call_verdict("torch.nn.modules.linear", "Linear", new=True)[0] == "vetted"
    assert call_verdict("torch.nn.modules.linear", "Linear")[0] == "unvetted"  # __init__
    assert call_verdict("transformers.training_args", "TrainingArguments")[0] == "unvetted"
    assert import_verdict("antigravity", "x")[0] == "dangerous"
    assert import_verdict("json.__main__", "main")[0] == "dangerous"


def test_a_repeated_payload_is_counted_not_listed(tmp_path: Path) -> None:
    """10,000 calls of one unvetted function: the first 1,000 are listed, the rest counted."""
    call = _g("mylib", "Thing") + b")R0"
    f = _scan(tmp_path, call * 10_000 + b"N")
    calls = [a for a in f.actions if a.kind == "call"]
    assert sum(a.count for a in calls) == 10_000
    assert len(f.actions) <= 1_002


def test_a_chain_of_calls_on_results_stays_linear(tmp_path: Path) -> None:
    """mylib.f()()()… 20,000 times (two bytes a call): every call is counted (one on the
    name, 19,999 on results, hand-counted from the bytes), and the report stays small; the
    makers' names grew with the chain, and the JSON report of this 40 KB pickle was 800 MB."""
    f = _scan(tmp_path, _g("mylib", "f") + b")R" * 20_000)
    calls = [a for a in f.actions if a.kind == "call"]
    assert sum(a.count for a in calls) == 20_000
    assert all(a.severity != "vetted" for a in calls)
    assert len(f.actions) <= 1_002
    assert len(scan(tmp_path / "x.pkl").to_json()) < 2_000_000


def test_a_long_name_named_again_keeps_the_report_small(tmp_path: Path) -> None:
    """One memoised 100 KB name, 2,000 STACK_GLOBALs (12 KB of opcodes) and a call of it:
    each global is listed, its name cut to 256 characters and its length; the report
    repeated the whole name each time (200 MB of JSON here, 2.6 GB for 20,000)."""
    name = "a" * 100_000
    body = (b"\x8c\x05mymod\x940X" + struct.pack("<I", len(name)) + name.encode()
            + b"\x940](" + b"h\x00h\x01\x93" * 2000 + b"e0h\x00h\x01\x93)R")
    f = _scan(tmp_path, body)
    shown = "a" * 256 + "…(100000 characters)"
    assert len(f.globals) == 2001 and {g.name for g in f.globals} == {shown}
    calls = [a for a in f.actions if a.kind == "call"]
    assert [a.target for a in calls] == ["mymod." + "a" * 250 + "…(100006 characters)"]
    assert len(scan(tmp_path / "x.pkl").to_json()) < 2_000_000


def test_codecs_encode_is_vetted_for_text_codecs_only(tmp_path: Path) -> None:
    text = _g("_codecs", "encode") + b"(" + _s("abc") + _s("latin1") + b"tR"
    assert _scan(tmp_path, text).status == "clean"
    other = _g("_codecs", "encode") + b"(" + _s("abc") + _s("rot13") + b"tR"
    assert _bad(_scan(tmp_path, other)) == [("call", "_codecs.encode", "unvetted")]


def test_partial_keywords_reach_the_forwarding_rule(tmp_path: Path) -> None:
    """partial(__generator_ctor) whose BUILD sets bit_generator_ctor=wave.Wave_write, then
    called with a path: NumPy would call Wave_write(path)."""
    body = (_g("functools", "partial") + b"(" + _g("numpy.random._pickle", "__generator_ctor")
            + b"tR(" + _g("numpy.random._pickle", "__generator_ctor") + b")}"
            + _s("bit_generator_ctor") + _g("wave", "Wave_write") + b"sNtb(" + _s("/tmp/x")
            + b"tR")
    f = _scan(tmp_path, body)
    assert ("call", "wave.Wave_write", "dangerous") in _bad(f)
