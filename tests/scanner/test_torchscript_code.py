"""The scan of TorchScript ``code/`` (issue 14 item 3, issue 25 part 5): real ``torch.jit.save``
outputs, parsed as Python.

A benign scripted module scans clean and lists the operators its code calls; a module whose
``__setstate__`` calls ``torch.from_file(..., shared=True)`` is dangerous, and
``torch.jit.load`` of it in a subprocess creating the marker file proves that it is. Each way
of spelling the call that hid it from the old text patterns (a parenthesised callee, a
backslash continuation, a comment between the name and its arguments, a continued string
before it, an alias, ...) is written into the ``__setstate__`` of an archive torch wrote, and
torch itself (``torch.jit.load`` in a subprocess) shows that the call runs. Code that does not
parse and hostile text are anomalies, in bounded time.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import tracemalloc
import warnings
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from torchless.scanner import script
from torchless.scanner.files import FileScan, scan
from torchless.scanner.script import script_calls

pytestmark = pytest.mark.torch

_EVIL = '''
import torch
from typing import Tuple

class Evil(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.ones(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w

    @torch.jit.export
    def __getstate__(self) -> Tuple[torch.Tensor, bool]:
        return (self.w, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[torch.Tensor, bool]) -> None:
        self.w = torch.from_file(MARKER, True, 4)
        self.training = state[1]

torch.jit.save(torch.jit.script(Evil()), OUT)
'''

#: The line of the holder's ``__setstate__`` (as torch.jit.save writes it) that the tests
#: replace with other code.
_HOLE = "self.w = torch.ones([4])"

#: Spellings of ``torch.from_file(M, True, 4)`` in the holder's ``__setstate__`` (4 spaces in);
#: each hid the call from the text patterns the scanner used before it parsed the code.
HIDDEN = {
    "parenthesised callee": "self.w = (torch.from_file)(M, True, 4)",
    "backslash before the arguments": "self.w = torch.from_file \\\n      (M, True, 4)",
    "backslash inside the name": "self.w = torch.\\\nfrom_file(M, True, 4)",
    "comment between name and arguments": "self.w = (torch.from_file  # note\n    )(M, True, 4)",
    "continued string before the call": '_s = "a\\\nb"\n    self.w = torch.from_file(M, True, 4)',
    "implicitly concatenated string": '_s = "a" "b"\n    self.w = torch.from_file(M, True, 4)',
    "alias of the operator": "f = torch.from_file\n    self.w = f(M, True, 4)",
    "alias of torch": "t = torch\n    u = t\n    self.w = u.from_file(M, True, 4)",
    "ops.aten": "self.w = ops.aten.from_file(M, True, 4)",
    "torch.autograd": "self.w = torch.autograd.from_file(M, True, 4)",
    "getattr with a constant name": 'self.w = getattr(torch, "from_" "file")(M, True, 4)',
    "keywords": "self.w = torch.from_file(filename=M, shared=True, size=4)",
}
#: Spellings torch 2.13's loader refuses (``torch.ops`` is ``aten::ops`` to its source
#: importer, and an operator has no ``.default``): still named, so still dangerous.
REFUSED = {
    "torch.ops.aten.from_file.default": "self.w = torch.ops.aten.from_file.default(M, True, 4)",
    "torch.ops.aten.from_file": "self.w = torch.ops.aten.from_file(M, True, 4)",
    "ops.aten.from_file.default": "self.w = ops.aten.from_file.default(M, True, 4)",
}

_LOAD_ALL = r'''
import json, os, sys, warnings
warnings.simplefilter("ignore")
import torch
out = {}
for path in sys.argv[1:]:
    try:
        torch.jit.load(path)
        out[path] = "loaded"
    except Exception as e:
        out[path] = type(e).__name__
print(json.dumps(out))
'''


def _jit_save(torch: ModuleType, module: object, path: Path) -> None:
    with warnings.catch_warnings():  # torch.jit.* is deprecated; pytest makes that an error
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.", category=DeprecationWarning)
        torch.jit.save(torch.jit.script(module), str(path))


def _scan(path: Path) -> FileScan:
    (got,) = scan(path).files
    return got


def _load_all(paths: list[Path], cwd: Path) -> dict[str, str]:
    """``torch.jit.load`` of each file in one subprocess: how each load ended."""
    done = subprocess.run([sys.executable, "-c", _LOAD_ALL, *map(str, paths)], cwd=cwd,
                          check=True, capture_output=True, text=True, timeout=300)
    got: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return got


_HOLDER = '''
import torch
from typing import Tuple

class Holder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.ones(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w

    @torch.jit.export
    def __getstate__(self) -> Tuple[torch.Tensor, bool]:
        return (self.w, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[torch.Tensor, bool]) -> None:
        self.w = torch.ones(4)
        self.training = state[1]

torch.jit.save(torch.jit.script(Holder()), OUT)
'''


@pytest.fixture(scope="module")
def holder(torch: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scripted module whose ``__setstate__`` sets a tensor (``_HOLE``), saved by torch."""
    root = tmp_path_factory.mktemp("holder")
    path = root / "holder.pt"
    (root / "make.py").write_text(_HOLDER.replace("OUT", repr(str(path))))
    subprocess.run([sys.executable, "-W", "ignore", str(root / "make.py")], check=True,
                   cwd=root, timeout=120)
    return path


def _with_code(holder: Path, out: Path, code: str, marker: Path | None = None) -> Path:
    """The holder archive with ``_HOLE`` replaced by ``code`` (``M``: the marker's path as a
    string literal), every other member as torch wrote it."""
    if marker is not None:
        code = re.sub(r"\bM\b", json.dumps(str(marker)).replace("\\", "\\\\"), code)
    with zipfile.ZipFile(holder) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith(".py") and "/code/" in info.filename:
                text = data.decode()
                assert _HOLE in text, text
                data = text.replace(_HOLE, code).encode()
            zout.writestr(info, data)
    return out


def test_a_benign_scripted_module_scans_clean(torch: ModuleType, tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2),
                                torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(2, 1))
    path = tmp_path / "benign.pt"
    _jit_save(torch, model, path)
    got = _scan(path)
    assert got.status == "clean", got
    assert got.layout == "torchscript"
    assert {"aten::conv2d", "aten::batch_norm", "aten::relu", "aten::linear"} <= set(
        got.script_ops), got.script_ops


@pytest.mark.parametrize("make", ["lstm", "transformer", "gru-embedding", "quantized",
                                  "holder"])
def test_real_scripted_models_scan_clean(torch: ModuleType, tmp_path: Path, holder: Path,
                                         make: str) -> None:
    """No false alarm on the code torch writes for real modules (recurrent layers, attention,
    a scripted class's own ``__getstate__``/``__setstate__``)."""
    nn = torch.nn
    path = tmp_path / f"{make}.pt"
    if make == "lstm":
        _jit_save(torch, nn.LSTM(3, 4, num_layers=2, bidirectional=True), path)
    elif make == "transformer":
        _jit_save(torch, nn.TransformerEncoderLayer(8, 2, dim_feedforward=16), path)
    elif make == "gru-embedding":
        _jit_save(torch, nn.Sequential(nn.Embedding(10, 4), nn.GRU(4, 4)), path)
    elif make == "quantized":  # its code names torch.classes.quantized.LinearPackedParamsBase
        with warnings.catch_warnings():  # quantization is deprecated (still in 2.13)
            warnings.simplefilter("ignore")
            quantized = torch.ao.quantization.quantize_dynamic(
                nn.Sequential(nn.Linear(4, 4), nn.LSTM(4, 4)), {nn.Linear, nn.LSTM},
                dtype=torch.qint8)
            _jit_save(torch, quantized, path)
    else:
        path = holder
    got = _scan(path)
    assert got.status == "clean", (got.anomalies, got.dangerous)
    assert got.script_ops


def test_the_corpus_torchscript_files_scan_clean(shared_dir: Path) -> None:
    here = Path(__file__).resolve().parents[1] / "data" / "corpus"
    files = [p for root in (here, shared_dir / "corpus") for p in sorted(root.rglob("*"))
             if p.is_file() and zipfile.is_zipfile(p) and any(
                 "/code/" in n and n.endswith(".py") for n in zipfile.ZipFile(p).namelist())]
    assert len(files) >= 2
    for path in files:
        got = _scan(path)
        assert got.status == "clean", (path, got.anomalies, got.dangerous)
        assert len(got.script_ops) > 20


def test_from_file_in_setstate_is_dangerous(torch: ModuleType, tmp_path: Path) -> None:
    marker = tmp_path / "marker.bin"
    out = tmp_path / "evil.pt"
    source = _EVIL.replace("MARKER", repr(str(marker))).replace("OUT", repr(str(out)))
    (tmp_path / "make.py").write_text(source)
    subprocess.run([sys.executable, "-W", "ignore", str(tmp_path / "make.py")], check=True,
                   cwd=tmp_path)
    assert not marker.exists()
    got = _scan(out)
    assert got.status == "dangerous", got
    assert [(g.module, g.name, g.opcode) for g in got.dangerous] == [
        ("torch.ops.aten", "from_file", "TorchScript call")]
    assert got.dangerous[0].member is not None and "/code/" in got.dangerous[0].member
    # the proof: torch.jit.load runs __setstate__, which creates the file
    subprocess.run([sys.executable, "-W", "ignore", "-c",
                    f"import torch; torch.jit.load({str(out)!r})"],
                   check=True, cwd=tmp_path, capture_output=True)
    assert marker.exists()


def test_every_hiding_spelling_runs_and_is_dangerous(holder: Path, tmp_path: Path) -> None:
    """Each spelling, in a valid archive, is dangerous to the scan, and torch.jit.load of it
    creates the marker (all loads in one subprocess)."""
    cases = {name: (tmp_path / f"{i}.pt", tmp_path / f"{i}.marker")
             for i, name in enumerate([*HIDDEN, *REFUSED])}
    for name, (out, marker) in cases.items():
        _with_code(holder, out, {**HIDDEN, **REFUSED}[name], marker)
        got = _scan(out)
        assert got.status == "dangerous", (name, got.anomalies)
        assert {(g.module, g.name) for g in got.dangerous} == {("torch.ops.aten", "from_file")}
        member = got.dangerous[0].member
        assert member is not None and "/code/" in member
        assert not marker.exists()
    loads = _load_all([out for out, _ in cases.values()], tmp_path)
    ran = {name for name, (_, marker) in cases.items() if marker.exists()}
    assert ran == set(HIDDEN), loads
    assert {loads[str(cases[name][0])] for name in HIDDEN} == {"loaded"}
    assert {loads[str(cases[name][0])] for name in REFUSED} == {"RuntimeError"}


def test_code_torch_rejects_is_anomalous(holder: Path, tmp_path: Path) -> None:
    """Code that does not parse is never clean; torch's compiler refuses it too."""
    cases = {"syntax": "self.w = torch.ones([4]) +", "tab-dedent": "self.w = (\n  ))",
             "nul": "self.w = torch.ones([4])\0"}
    outs = [_with_code(holder, tmp_path / f"{k}.pt", v) for k, v in cases.items()]
    for out in outs:
        got = _scan(out)
        assert got.status == "anomalous", got
        assert [a.kind for a in got.anomalies] == ["script"]
        assert "cannot be vetted" in got.anomalies[0].message
        assert got.anomalies[0].member is not None and "/code/" in got.anomalies[0].member
    loads = _load_all(outs, tmp_path)
    assert set(loads.values()) == {"RuntimeError"}, loads


@pytest.mark.parametrize("name,text", [
    ("deep parentheses", "x = " + "(" * 190 + "1" + ")" * 190 + "\n" + "(" * 100_000),
    ("10 MB of parentheses", "(" * 10_000_000),
    ("deep unary minus", "x = " + "-" * 400_000 + "1\n"),
    ("long attribute chain", "x = a" + ".b" * 200_000 + "\n"),
    ("NUL bytes", "def f(self):\n  return torch.from_file('x')\0\n"),
    ("deep indentation", "".join(" " * i + "if x:\n" for i in range(150)) + " " * 150 + "y\n"),
])
def test_hostile_code_is_an_anomaly_in_bounded_time_and_memory(name: str, text: str) -> None:
    tracemalloc.start()
    start = time.perf_counter()
    try:
        got = script_calls(text)
        took = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(got) == 1 and got[0].problem and not got[0].op, got
    assert took < 20 and peak < 600 << 20, (took, peak)


def test_hostile_code_in_an_archive_is_anomalous(holder: Path, tmp_path: Path) -> None:
    out = _with_code(holder, tmp_path / "parens.pt", "self.w = " + "(" * 3_000_000)
    got = _scan(out)
    assert got.status == "anomalous" and [a.kind for a in got.anomalies] == ["script"], got


@pytest.mark.parametrize("code,op,kind", [
    ("self.w = torch.not_an_operator_of_torch([4])", "aten::not_an_operator_of_torch",
     "unvetted"),
    ("self.w = ops.profiler._record_function_enter('x')", "profiler::_record_function_enter",
     "unvetted"),
    ("self.w = ops.myns.frob([4])", "myns::frob", "unknown"),
    ("self.w = torch.classes.myns.Thing()", "class myns.Thing", "unknown"),
    ("self.w = torch.classes.c10d.ProcessGroup()", "class c10d.ProcessGroup", "unvetted"),
    ("self.w = open_the_file([4])", "builtin open_the_file", "unvetted"),
    ("self.w = ops.c10d.barrier([4])", "c10d::barrier", "danger"),
    ("self.w = rpc_sync('worker', torch.ones, ([4],))", "prim::rpc_sync", "danger"),
])
def test_names_no_allowlist_vets_are_never_clean(holder: Path, tmp_path: Path, code: str,
                                                op: str, kind: str) -> None:
    out = _with_code(holder, tmp_path / "x.pt", code)
    got = _scan(out)
    assert op in got.script_ops
    if kind == "danger":
        assert got.status == "dangerous", got
    else:
        assert got.status == "anomalous", got
        assert any(op in a.message for a in got.anomalies if a.kind == "script"), got


def test_code_in_an_upper_case_member_is_scanned(torch: ModuleType, tmp_path: Path) -> None:
    """torch looks records up ignoring case: ``CODE/__TORCH__.PY`` is the code it runs."""
    src = tmp_path / "lin.pt"
    _jit_save(torch, torch.nn.Linear(2, 2), src)
    out = tmp_path / "upper.pt"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith(".py"):
                data = data.replace(b"torch.linear(", b"torch.save(")
                info.filename = info.filename.upper()
            zout.writestr(info, data)
    got = _scan(out)
    assert [g.name for g in got.dangerous] == ["save"]
    member = got.dangerous[0].member
    assert member is not None and member.startswith("LIN/CODE/") and member.endswith(".PY")


def test_the_resolution() -> None:
    """Hand-written code; the expected references are read off the text by eye."""
    text = ('class M(Module):\n'
            '  def forward(self: __torch__.M, x: Tensor) -> Tensor:\n'
            '    _0 = "torch.from_file(\\"x\\")"\n'
            '    y = torch.add(x, 1)\n'
            '    z = ops.myns.frob(y)\n'
            '    w = torch.ops.aten.save(y, "f")\n'
            '    t = torch.classes.myns.Thing()\n'
            '    f = rpc_async("worker", torch.mul, (x, x))\n'
            '    return ops.aten.relu (z)\n'
            '  def remote(self, torch: Tensor) -> Tensor:\n'
            '    return torch.from_file(1)\n'
            '  def g(self) -> Tensor:\n'
            '    a, b = torch, 1\n'
            '    c = a if b else ops.prim\n'
            '    return c.sleep(a.to_here(b).to_here())\n')
    calls = [(c.op, bool(c.danger), c.unknown, c.unvetted) for c in script_calls(text)]
    assert calls == [
        ("aten::add", False, False, False), ("myns::frob", False, True, False),
        ("aten::save", True, False, False), ("class myns.Thing", False, True, False),
        ("prim::rpc_async", True, False, False), ("aten::mul", False, False, False),
        ("aten::relu", False, False, False),
        # the parameter ``torch`` is a tensor there: from_file is no method of it
        ("aten::sleep", False, False, True), ("prim::sleep", False, False, True),
        ("aten::to_here", True, False, False), ("aten::to_here", True, False, False)]
    assert [c.offset for c in script_calls(text)][:2] == [text.index("torch.add"),
                                                        text.index("ops.myns")]


@pytest.mark.parametrize("text", ['x = "é€"\ny = torch.save(x, "f")\n',
                                  'x = "\u2028é"\r\ny = 1\x0c\rz = torch.save(1)\n'])
def test_offsets_are_utf8_bytes(text: str) -> None:
    """Offsets count bytes, and lines as Python counts them (not U+2028 or form feeds)."""
    (call,) = script_calls(text)
    assert call.offset == text.encode().index(b"torch.save")


def test_alias_chains_in_any_order_are_followed() -> None:
    """Aliases written in either order still reach torch; a chain longer than the rounds the
    scan follows is a problem, never clean."""
    def chain(n: int, backwards: bool) -> str:
        steps = [f"a{i + 1} = a{i}\n" for i in range(n)]
        return "a0 = torch\n" + "".join(steps[::-1] if backwards else steps) + \
            f"a{n}.from_file(1)\n"

    for backwards in (False, True):
        got = script_calls(chain(12, backwards))
        assert [c.op for c in got if c.danger] == ["aten::from_file"]
        got = script_calls(chain(40, backwards))
        assert [c.op for c in got if c.danger] == ["aten::from_file"] or (
            len(got) == 1 and got[0].problem), got
    assert any(c.problem for b in (False, True) for c in script_calls(chain(40, b)))


def test_the_size_limit() -> None:
    text = "x = 1\n" * (script.MAX_CODE_BYTES // 6 + 1)
    (got,) = script_calls(text)
    assert got.problem and str(script.MAX_CODE_BYTES) in got.problem
    assert not any(c.problem for c in script_calls(text[:script.MAX_CODE_BYTES]))


def test_a_name_bound_in_another_function_is_not_bound_here() -> None:
    """A call of a name this scope does not bind is a builtin no allowlist vets, even if
    another function assigns the name."""
    text = "def a(self):\n  open_file = 1\ndef b(self):\n  return open_file(2)\n"
    assert [(c.op, c.unvetted) for c in script_calls(text)] == [("builtin open_file", True)]
    assert script_calls(text.replace("def b(self)", "def b(self, open_file: int)")) == []
