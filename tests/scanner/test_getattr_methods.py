"""``getattr(obj, name)``: a bound method kept in a whole-model save is unvetted, gadgets stay
dangerous.

``torch.save(model)`` of a model that keeps a bound method as an attribute (peft's
``base_model_prepare_inputs_for_generation``, gpytorch's load-state hooks) pickles it as
``getattr(<object>, '<method>')``. torch.load then runs the class's attribute lookup and keeps
the method, which counts as called: code of the class the file imported (unvetted), not a
known danger. A subprocess writes each file (``torch.save`` for the real case, the pickles
spelled out opcode by opcode for the gadgets) and runs ``torch.load(weights_only=False)`` on
it; a marker file says which cases torch runs.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from torchless.scanner.files import FileScan, scan

_HELPER = """
import pathlib


class A:
    def f(self, path=None):
        pathlib.Path(path or self.path).touch()
        return {}


class B:
    def f(self, path=None):
        pathlib.Path(path or self.path).touch()
        return {}
"""

_SCRIPT = r"""
import json, os, sys, types, warnings
warnings.simplefilter("ignore")
out = sys.argv[1]
sys.path.insert(0, os.path.join(out, "lib"))
import torch
import ga_helper
cases = json.loads(open(os.path.join(out, "cases.json")).read())
# the real thing: a bound method kept as an attribute, as torch.save writes it
a = ga_helper.A()
a.path = os.path.join(out, "m", "bound")
a.m = a.f
torch.save({"a": a}, os.path.join(out, "bound.pt"))
torch.save({"a": a}, os.path.join(out, "bound_legacy.pt"), _use_new_zipfile_serialization=False)
cases["bound"] = {"file": os.path.join(out, "bound.pt"), "marker": a.path}
cases["bound_legacy"] = {"file": os.path.join(out, "bound_legacy.pt"), "marker": a.path}
result = {}
for name, case in cases.items():
    try:
        got = torch.load(case["file"], weights_only=False)
        loaded = True
        if name.startswith("bound"):
            m = got["a"].m
            loaded = type(m).__name__ == "method" and m.__func__ is ga_helper.A.f
    except BaseException:
        loaded = False
    result[name] = {**case, "loaded": loaded, "ran": os.path.exists(case["marker"])}
print("RESULT" + json.dumps(result))
"""


def _g(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _s(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


_GETATTR = _g("builtins", "getattr")


def _new(cls: bytes, *args: bytes) -> bytes:
    """``cls.__new__(cls, *args)`` (NEWOBJ)."""
    return cls + b"(" + b"".join(args) + b"t\x81"


def _getattr(obj: bytes, name: bytes) -> bytes:
    return _GETATTR + b"(" + obj + name + b"tR"


def _call(func: bytes, *args: bytes) -> bytes:
    return func + b"(" + b"".join(args) + b"tR"


def _namespace_keys(value: bytes) -> bytes:
    """``dict(SimpleNamespace(keys=value))``: dict calls ``ns.keys()``."""
    ns = _g("types", "SimpleNamespace") + b")R}" + _s("keys") + value + b"sb"
    return _call(_g("builtins", "dict"), ns)


def _a(marker: str, cls: str = "A") -> bytes:
    """A ``ga_helper`` object made by NEWOBJ, its ``path`` set by BUILD."""
    return _new(_g("ga_helper", cls)) + b"}" + _s("path") + _s(marker) + b"sb"


def _gadgets(m: Path) -> dict[str, bytes]:
    """Each pickle body, given the directory of the markers."""
    builtins = _getattr(_getattr(_g("re", "compile"), _s("__globals__")), _s("get"))
    evaluate = _call(_getattr(_call(builtins, _s("__builtins__")), _s("get")), _s("eval"))
    return {
        # a bound method of a class the file imported, handed to dict() (which calls it):
        # torch runs A.f, code of the class (unvetted, not dangerous)
        "held": _namespace_keys(_getattr(_a(str(m / "held")), _s("f"))),
        # the os module (torch.os) and one of its functions
        "os_module": _call(
            _getattr(_g("torch", "os"), _s("system")), _s(f"touch {m / 'os_module'}")
        ),
        # a name that is not a constant string (str('f') is 'f' at load)
        "computed_name": _call(
            _getattr(_a(str(m / "x")), _call(_g("builtins", "str"), _s("f"))),
            _s(str(m / "computed_name")),
        ),
        # a function's __globals__ reach its module's __builtins__, and eval
        "globals": _call(
            evaluate, _s(f"__import__('pathlib').Path({str(m / 'globals')!r}).touch()")
        ),
        # a vetted class (pathlib.PosixPath) whose method is on the dangerous list
        "path_touch": _namespace_keys(
            _getattr(_new(_g("pathlib", "PosixPath"), _s(str(m / "path_touch"))), _s("touch"))
        ),
        # slot state set with setattr changes the object's class: B.f, not A.f
        "class_swap": _namespace_keys(
            _getattr(
                _new(_g("ga_helper", "A"))
                + b"N}"
                + _s("__class__")
                + _g("ga_helper", "B")
                + b"s"
                + _s("path")
                + _s(str(m / "class_swap"))
                + b"s\x86b",
                _s("f"),
            )
        ),
        # an attribute a vetted class keeps (a namespace's BUILD state) shadows its methods:
        # getattr finds a partial of torch.serialization.save (a reference to it runs nothing)
        "kept": _namespace_keys(
            _getattr(
                _new(_g("argparse", "Namespace"))
                + b"}"
                + _s("f")
                + _call(
                    _g("functools", "partial"),
                    _g("torch.serialization", "save"),
                    b"}",
                    _s(str(m / "kept")),
                )
                + b"sb",
                _s("f"),
            )
        ),
        # the method of a built object called in the stream with the file's arguments
        "explicit_call": _call(_getattr(_a(str(m / "x")), _s("f")), _s(str(m / "explicit_call"))),
    }


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("getattr")
    (out / "lib").mkdir()
    (out / "m").mkdir()
    (out / "lib" / "ga_helper.py").write_text(_HELPER)
    spec = {}
    for name, body in _gadgets(out / "m").items():
        p = out / f"{name}.pkl"
        p.write_bytes(b"\x80\x02" + body + b".")
        spec[name] = {"file": str(p), "marker": str(out / "m" / name)}
    (out / "cases.json").write_text(json.dumps(spec))
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT"))
    got: dict[str, dict[str, Any]] = json.loads(line[len("RESULT") :])
    return got


def _scan(case: dict[str, Any]) -> FileScan:
    return scan(Path(case["file"])).files[0]


@pytest.mark.parametrize("name", ["bound", "bound_legacy"])
def test_a_bound_method_torch_save_keeps_is_unvetted(
    cases: dict[str, dict[str, Any]], name: str
) -> None:
    case = cases[name]
    assert case["loaded"] and not case["ran"]  # torch.load rebuilt a bound method of A.f
    f = _scan(case)
    assert f.status == "unvetted"
    assert not [a for a in f.actions if a.severity == "dangerous"]
    reads = [a for a in f.actions if a.target == "builtins.getattr" and a.kind == "call"]
    assert [a.severity for a in reads] == ["unvetted"]
    assert "may call ga_helper.A.f" in reads[0].reason
    # the method, kept, counts as called (with unknown arguments)
    assert any(a.target == "ga_helper.A.f" and a.severity == "unvetted" for a in f.actions)


def test_a_bound_method_torch_calls_is_reported_unvetted(cases: dict[str, dict[str, Any]]) -> None:
    case = cases["held"]
    assert case["ran"]  # dict() called ns.keys(), that is A.f (then the magic-number check
    # of a file that is only a pickle fails)
    f = _scan(case)
    assert f.status == "unvetted"
    assert any(a.target == "ga_helper.A.f" and a.severity == "unvetted" for a in f.actions)


@pytest.mark.parametrize(
    "name",
    ["os_module", "computed_name", "globals", "path_touch", "class_swap", "explicit_call", "kept"],
)
def test_getattr_gadgets_torch_runs_are_dangerous(
    cases: dict[str, dict[str, Any]], name: str
) -> None:
    case = cases[name]
    assert case["ran"]  # torch.load ran the gadget
    f = _scan(case)
    assert f.status == "dangerous"
    if name in ("computed_name", "globals", "path_touch", "class_swap"):
        # the getattr itself is what reaches the danger
        assert any(a.target == "builtins.getattr" and a.severity == "dangerous" for a in f.actions)


@pytest.mark.parametrize(
    "attr",
    [
        "__class__",
        "__subclasses__",
        "__reduce__",
        "__init__",
        "__builtins__",
        "__dict__",
        "__getattribute__",
    ],
)
def test_every_dunder_but_cls_new_is_dangerous(tmp_path: Path, attr: str) -> None:
    p = tmp_path / "d.pkl"
    p.write_bytes(b"\x80\x02" + _getattr(_a("/nonexistent"), _s(attr)) + b".")
    f = scan(p).files[0]
    reads = [a for a in f.actions if a.target == "builtins.getattr" and a.kind == "call"]
    assert [a.severity for a in reads] == ["dangerous"]
