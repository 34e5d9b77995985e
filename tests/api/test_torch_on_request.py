"""``framework="pt"`` and ``Tensor.to_torch()`` import torch when asked (through
``torchless.torch._import_torch``, the library's one torch import), in a program that has not
imported it; ``import torchless`` and NumPy reads still never do. The oracle: ``torch.load``
of the same file, in the same fresh interpreter after the call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import REPO

pytestmark = pytest.mark.torch

TINY = REPO / "examples" / "tiny.pt"

_CODE = """
import json, sys
import torchless
out = {"before": "torch" in sys.modules}
ckpt_np = torchless.load(sys.argv[1])
out["numpy_read"] = "torch" in sys.modules
obj = torchless.load(sys.argv[1], framework=sys.argv[3] if len(sys.argv) > 3 else "pt")
out["after"] = "torch" in sys.modules
import torch
ref = torch.load(sys.argv[1], weights_only=False)
def flat(x, p=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from flat(v, f"{p}{k}.")
    elif isinstance(x, torch.Tensor):
        yield p, x
out["same"] = sorted(n for n, t in flat(obj)) == sorted(n for n, t in flat(ref)) and all(
    type(a) is torch.Tensor or isinstance(a, torch.Tensor) for _, a in flat(obj)) and all(
    torch.equal(a, b) for (_, a), (_, b) in zip(sorted(flat(obj), key=lambda p: p[0]),
                                                sorted(flat(ref), key=lambda p: p[0])))
out["tensors"] = sum(1 for _ in flat(obj))
print(json.dumps(out))
"""

_TO_TORCH = """
import json, sys
import torchless
with torchless.open(sys.argv[1]) as ckpt:
    t = ckpt.tensors["state_dict.0.weight"]
    before = "torch" in sys.modules
    got = t.to_torch()
import torch
ref = torch.load(sys.argv[1], weights_only=False)["state_dict"]["0.weight"]
print(json.dumps({"before": before, "same": bool(torch.equal(got, ref))}))
"""


def _run(code: str, *args: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    run = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         env=env, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    result: dict[str, object] = json.loads(run.stdout.splitlines()[-1])
    return result


def test_load_tensors_torch_imports_torch(tmp_path: Path) -> None:
    got = _run(_CODE, str(TINY), "unused")
    assert got == {"before": False, "numpy_read": False, "after": True, "same": True,
                   "tensors": got["tensors"]} and got["tensors"]


def test_inert_file_tensors_torch_imports_torch(tmp_path: Path) -> None:
    """The decoder of an inert file (torchless's own safetensors) asks too."""
    import torchless

    out = tmp_path / "tiny.safetensors"
    torchless.convert(TINY, out)
    code = _CODE.replace("torch.load(sys.argv[1], weights_only=False)",
                         f"torch.load({str(TINY)!r}, weights_only=False)")
    got = _run(code, str(out), "unused")
    assert got["before"] is False and got["numpy_read"] is False
    assert got["after"] is True and got["same"] is True


def test_to_torch_imports_torch() -> None:
    assert _run(_TO_TORCH, str(TINY)) == {"before": False, "same": True}
