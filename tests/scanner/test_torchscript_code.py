"""The scan of TorchScript ``code/`` (issue 14, item 3): real ``torch.jit.save`` outputs.

A benign scripted module scans clean and lists the operators its code calls; a module whose
``__setstate__`` calls ``torch.from_file(..., shared=True)`` is dangerous, and
``torch.jit.load`` of it in a subprocess creating the marker file proves that it is.
The text analysis itself (string literals, custom operators and classes, RPC) is checked on
hand-written code, whose expected calls are read off the text by eye.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

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


def _jit_save(torch: ModuleType, module: object, path: Path) -> None:
    with warnings.catch_warnings():  # torch.jit.* is deprecated; pytest makes that an error
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.", category=DeprecationWarning)
        torch.jit.save(torch.jit.script(module), str(path))


def _scan(path: Path) -> FileScan:
    (got,) = scan(path).files
    return got


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


def test_from_file_in_setstate_is_dangerous(torch: ModuleType, tmp_path: Path) -> None:
    marker = tmp_path / "marker.bin"
    out = tmp_path / "evil.pt"
    script = _EVIL.replace("MARKER", repr(str(marker))).replace("OUT", repr(str(out)))
    (tmp_path / "make.py").write_text(script)
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


def test_the_text_analysis() -> None:
    text = ('class M(Module):\n'
            '  def forward(self: __torch__.M, x: Tensor) -> Tensor:\n'
            '    _0 = "torch.from_file(\\"x\\")"\n'
            '    y = torch.add(x, 1)\n'
            '    z = ops.myns.frob(y)\n'
            '    w = torch.ops.aten.save(y, "f")\n'
            '    t = torch.classes.myns.Thing()\n'
            '    f = rpc_async("worker", torch.add, (x, x))\n'
            '    return ops.aten.relu (z)\n'
            '  def remote(self) -> None:\n'
            '    return None\n')
    calls = [(c.op, bool(c.danger), c.unknown) for c in script_calls(text)]
    assert calls == [("aten::add", False, False), ("myns::frob", False, True),
                     ("aten::save", True, False), ("class myns.Thing", False, True),
                     ("prim::rpc_async", True, False), ("aten::relu", False, False)]
