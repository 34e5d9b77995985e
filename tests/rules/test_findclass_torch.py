"""rules/findclass against torch 2.13's own resolution, case by case.

Each case is a one-GLOBAL pickle read by one of torch's loaders: a ZIP archive's data.pkl
(``_load``'s wrapper), a legacy stream's object pickle (``_legacy_load``'s wrapper) and a
legacy stream's sys_info (a plain ``pickle.load`` pass). In a subprocess with real torch,
``torch.load(weights_only=False)`` reads each file with a ``pickle_module`` whose Unpickler
only records what the C unpickler's own ``find_class`` is asked and what it returns (or
raises), so torch's wrappers run unchanged above it. The outcome is compared with what
:func:`find_class` states: a storage type (torch returns a ``StorageType`` and the C
``find_class`` is never asked), or an import of M and a walk of P (the subprocess imports M
and walks P itself: the same object, or the same error), or a failure before any import.

Only harmless names are loaded: standard-library modules without side effects, torch, and
modules that do not exist.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from torchless.core import dtypes
from torchless.core.limits import Limits
from torchless.pickle.machine import Machine, Resolver
from torchless.rules.findclass import (
    TORCH_STORAGE_NAMES,
    Failure,
    Import,
    Loader,
    StorageName,
    find_class,
)

pytest.importorskip("torch")

#: (module, name, the PROTO opcodes before the GLOBAL, loader)
CASES: list[tuple[str, str, tuple[int, ...], Loader]] = [
    ("collections", "OrderedDict", (2,), "torch"),
    ("collections", "FloatStorage", (2,), "torch"),
    ("collections", "FloatStorage", (2,), "plain"),
    ("collections", "FloatStorage", (2,), "legacy"),
    ("no_such_mod", "Float8_e4m3fnStorage", (2,), "torch"),
    ("no_such_mod", "Float8_e4m3fnStorage", (2,), "plain"),
    ("no_such_mod", "FloatStorage", (2,), "torch"),
    ("no_such_mod", "FloatStorage", (2,), "plain"),
    ("no_such_mod", "thing", (2,), "torch"),
    ("torch", "FloatStorage", (2,), "plain"),
    ("torch", "FloatStorage", (2,), "torch"),
    ("torch", "UntypedStorage", (2,), "torch"),
    ("torch.storage", "UntypedStorage", (2,), "torch"),
    ("torch", "EvilStorage", (2,), "torch"),
    ("torch", "Float8_e4m3fnStorage", (2,), "legacy"),
    ("copy_reg", "_reconstructor", (2,), "torch"),
    ("copy_reg", "_reconstructor", (4,), "torch"),
    ("copy_reg", "_reconstructor", (), "torch"),  # no PROTO: protocol 0
    ("copy_reg", "_reconstructor", (3,), "plain"),
    ("copy_reg", "_reconstructor", (4, 2), "torch"),  # the last PROTO is in force
    ("copy_reg", "_reconstructor", (2, 4), "legacy"),
    ("__builtin__", "set", (2,), "torch"),
    ("__builtin__", "set", (4,), "torch"),
    ("__builtin__", "xrange", (1,), "plain"),
    ("exceptions", "StandardError", (2,), "legacy"),
    ("UserDict", "UserDict", (2,), "torch"),
    ("UserDict", "UserDict", (3,), "torch"),
    ("torch.tensor", "_rebuild_from_type_v2", (2,), "torch"),
    ("torch.tensor", "_rebuild_from_type_v2", (2,), "legacy"),
    ("torch.tensor", "_rebuild_from_type_v2", (2,), "plain"),
    ("collections", "abc.Mapping", (2,), "torch"),
    ("collections", "abc.Mapping", (3,), "torch"),
    ("collections", "abc.Mapping", (4,), "torch"),
    ("collections", "abc.Mapping", (5,), "plain"),
    ("os", "path.join", (4,), "legacy"),
    ("os", "path.join", (2,), "legacy"),
    ("collections", "<locals>.x", (4,), "torch"),
    ("collections", "", (4,), "torch"),
    ("", "thing", (4,), "torch"),
    ("", "FloatStorage", (4,), "torch"),
    ("", "FloatStorage", (4,), "plain"),
]


def _text(s: str) -> bytes:
    data = s.encode()
    return b"\x8c" + bytes([len(data)]) + data


def payload(module: str, name: str, protos: tuple[int, ...]) -> bytes:
    """PROTO opcodes, the name (STACK_GLOBAL, which takes any strings, empty ones too), STOP.
    The C unpickler runs every opcode whatever protocol is in force."""
    head = b"".join(b"\x80" + bytes([p]) for p in protos)
    return head + _text(module) + _text(name) + b"\x93."


_TORCH = r"""
import functools, importlib, io, json, os, pickle, sys, tempfile, types, zipfile
import torch
import torch.storage

MAGIC = 0x1950A86A20F9469CFC6C
calls = []

def missing(e):
    # the module an import misses (an AttributeError: the import went through)
    return e.name if isinstance(e, ImportError) else None

class Recording(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            value = super().find_class(module, name)
        except Exception as e:
            calls.append(("raise", type(e).__name__, missing(e)))
            raise
        calls.append(("value", id(value)))
        return value

recording = types.ModuleType("recording")
recording.Unpickler = Recording
recording.load = lambda f, **kw: Recording(f, **kw).load()
recording.__name__ = "pickle"

def zip_file(path, data):
    buf = io.BytesIO()
    torch.save(0, buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as out:
        for info in src.infolist():
            out.writestr(info.filename, data if info.filename.endswith("/data.pkl")
                         else src.read(info))

def legacy_file(path, sys_info, obj):
    with open(path, "wb") as f:
        f.write(pickle.dumps(MAGIC, protocol=2) + pickle.dumps(1001, protocol=2) + sys_info
                + obj + pickle.dumps([], protocol=2))

def reference(resolution):
    if resolution[0] != "import":
        return None
    _, module, path = resolution
    try:
        value = importlib.import_module(module)
        for step in path:
            value = getattr(value, step)
    except Exception as e:
        return ("raise", type(e).__name__, missing(e))
    return ("value", id(value))

out = {"table": sorted(torch.storage._storage_type_to_dtype_map()),
       "dtypes": {k: str(v).removeprefix("torch.")
                  for k, v in torch.storage._storage_type_to_dtype_map().items()},
       "cases": []}
tmp = tempfile.mkdtemp()
for i, (data, loader, resolution) in enumerate(json.load(sys.stdin)):
    data = bytes.fromhex(data)
    path = os.path.join(tmp, f"case{i}")
    if loader == "torch":
        zip_file(path, data)
    elif loader == "legacy":
        legacy_file(path, pickle.dumps({}, protocol=2), data)
    else:
        legacy_file(path, data, pickle.dumps(None, protocol=2))
    del calls[:]
    try:
        result = torch.load(path, weights_only=False, pickle_module=recording)
        loaded = type(result).__name__
    except Exception as e:
        loaded = "raise " + type(e).__name__
    ours = [c for c in calls]
    out["cases"].append({"calls": ours, "loaded": loaded, "reference": reference(resolution)})
print(json.dumps(out))
"""


def _resolution(r: Any) -> list[Any]:
    if isinstance(r, StorageName):
        return ["storage", r.name]
    if isinstance(r, Import):
        return ["import", r.module, list(r.path)]
    return ["failure", r.reason]


@pytest.fixture(scope="module")
def torch_outcomes() -> dict[str, Any]:
    cases = [[payload(m, n, protos).hex(), loader,
              _resolution(find_class(m, n, protos[-1] if protos else 0, loader))]
             for m, n, protos, loader in CASES]
    cp = subprocess.run([sys.executable, "-c", _TORCH], input=json.dumps(cases),
                        capture_output=True, text=True, timeout=600, check=False)
    assert cp.returncode == 0, cp.stderr[-3000:]
    out: dict[str, Any] = json.loads(cp.stdout.splitlines()[-1])
    return out


def test_storage_table_is_torchs(torch_outcomes: dict[str, Any]) -> None:
    assert sorted(TORCH_STORAGE_NAMES) == torch_outcomes["table"]
    for name, dtype in torch_outcomes["dtypes"].items():
        ours = dtypes.by_storage_name(name)
        assert ours is not None and ours.name == dtype, name


@pytest.mark.parametrize("index", range(len(CASES)))
def test_find_class_is_torchs(torch_outcomes: dict[str, Any], index: int) -> None:
    module, name, protos, loader = CASES[index]
    ours = find_class(module, name, protos[-1] if protos else 0, loader)
    got = torch_outcomes["cases"][index]
    detail = (CASES[index], ours, got)
    if isinstance(ours, StorageName):
        assert got["calls"] == [] and got["loaded"] == "StorageType", detail
    elif isinstance(ours, Import):
        assert len(got["calls"]) == 1, detail
        assert [*got["calls"][0]] == got["reference"], detail
    else:
        assert isinstance(ours, Failure)
        assert len(got["calls"]) == 1 and got["calls"][0][:2] == ["raise", "ValueError"], detail


def test_cases_cover_every_kind() -> None:
    """The case list reaches each outcome and each loader (so a test above can fail)."""
    kinds = {type(find_class(m, n, p[-1] if p else 0, ld)).__name__ for m, n, p, ld in CASES}
    assert kinds == {"StorageName", "Import", "Failure"}
    assert {c[3] for c in CASES} == {"torch", "legacy", "plain"}


class _Seen(Resolver):
    def __init__(self) -> None:
        self.seen: list[int] = []

    def find_global(self, module: str, name: str, offset: int) -> Any:
        self.seen.append(self.proto)
        return super().find_global(module, name, offset)


@pytest.mark.parametrize(("protos", "expected"), [((), 0), ((2,), 2), ((4, 2), 2), ((2, 5), 5)])
def test_machine_tells_the_resolver_the_protocol(protos: tuple[int, ...], expected: int) -> None:
    """The protocol in force is the last PROTO's (0 without one), as the C unpickler keeps it."""
    resolver = _Seen()
    Machine(payload("collections", "OrderedDict", protos), resolver, Limits()).run(0)
    assert resolver.seen == [expected]
