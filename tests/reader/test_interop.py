"""Handing tensors to other libraries: Tensor.to_torch(), load(framework="pt") of torch
checkpoints, and DLPack. The oracle is torch.load of the same file."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import torchless
from tests.reader.test_differential_torch import NUMPY_DTYPES, tg  # noqa: F401 (tg is a fixture)

from ..conftest import require

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_to_torch_matches_torch_load(torch: ModuleType, tg: ModuleType,  # noqa: F811
                                     tmp_path: Path, dtype: str) -> None:
    saved = tg.views(dtype, seed=3)
    with tg.quiet():
        torch.save(saved, tmp_path / "v.pt")
        expected = torch.load(tmp_path / "v.pt", weights_only=False)
    with torchless.open(tmp_path / "v.pt") as ckpt:
        for name, t in expected.items():
            got = ckpt.tensors[name].to_torch()
            assert got.dtype == t.dtype and got.shape == t.shape, name
            assert tg.contiguous_bytes(got) == tg.contiguous_bytes(t), name
    with tg.quiet():
        loaded = torchless.load(tmp_path / "v.pt", framework="pt")
    assert set(loaded) == set(expected)
    for name, t in expected.items():
        assert tg.contiguous_bytes(loaded[name]) == tg.contiguous_bytes(t), name


def test_to_torch_parameters_and_writable(torch: ModuleType, tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    torch.save({"model": model.state_dict(), "p": torch.nn.Parameter(torch.ones(2)),
                "frozen": torch.nn.Parameter(torch.zeros(1), requires_grad=False)},
               tmp_path / "m.pt")
    got = torchless.load(tmp_path / "m.pt", framework="pt")
    assert isinstance(got["p"], torch.nn.Parameter) and got["p"].requires_grad
    assert isinstance(got["frozen"], torch.nn.Parameter) and not got["frozen"].requires_grad
    got["model"]["weight"].add_(1)  # writable, and not the file's bytes
    fresh = torch.nn.Linear(3, 2)
    fresh.load_state_dict(torchless.load(tmp_path / "m.pt", framework="pt")["model"])
    assert torch.equal(fresh.weight, model.weight) and torch.equal(fresh.bias, model.bias)


def test_dlpack(torch: ModuleType, tmp_path: Path) -> None:
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    torch.save({"w": w, "t": w.t(), "i": torch.arange(5, dtype=torch.int16)}, tmp_path / "m.pt")
    with torchless.open(tmp_path / "m.pt") as ckpt:
        for name, want in (("w", w), ("t", w.t()), ("i", torch.arange(5, dtype=torch.int16))):
            via_torch = torch.from_dlpack(ckpt.tensors[name])
            assert via_torch.dtype == want.dtype and torch.equal(via_torch, want), name
            via_numpy = np.from_dlpack(ckpt.tensors[name])
            assert np.array_equal(via_numpy, want.numpy()), name
            assert ckpt.tensors[name].__dlpack_device__() == (1, 0)  # kDLCPU


def test_dlpack_consumers_may_write(torch: ModuleType, tmp_path: Path) -> None:
    """Was: the export was the file's read-only map, torch ignores DLPack's read-only flag,
    and an in-place add on the result killed the process (SIGSEGV). JAX refused it. Now both
    get a private copy: writes work and never reach the file."""
    src = tmp_path / "m.pt"
    torch.save({"w": torch.arange(6, dtype=torch.float32)}, src)
    before = src.read_bytes()
    code = textwrap.dedent(f"""
        import numpy as np, torch, torchless
        with torchless.open({str(src)!r}) as ckpt:
            t = ckpt.tensors["w"]
            a = torch.from_dlpack(t)
            a.add_(1)
            b = torch.from_dlpack(t)
            print(a.tolist(), b.tolist(), t.numpy().tolist())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, (out.returncode, out.stderr)
    assert out.stdout.split("] [") == ["[1.0, 2.0, 3.0, 4.0, 5.0, 6.0",
                                       "0.0, 1.0, 2.0, 3.0, 4.0, 5.0",
                                       "0.0, 1.0, 2.0, 3.0, 4.0, 5.0]\n"]
    assert src.read_bytes() == before
    jax = require("jax")
    with torchless.open(src) as ckpt:
        got = jax.dlpack.from_dlpack(ckpt.tensors["w"])
        assert np.asarray(got).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_to_torch_without_torch_installed(tmp_path: Path, torch: ModuleType) -> None:
    """torch is imported on request (tests/api/test_torch_on_request.py); where it cannot
    be (here: ``sys.modules["torch"] = None``, as if not installed) the request is refused
    with our error, saying what to install or use."""
    torch.save({"w": torch.ones(2)}, tmp_path / "m.pt")
    code = textwrap.dedent(f"""
        import sys, torchless
        sys.modules["torch"] = None  # `import torch` raises ImportError
        with torchless.open({str(tmp_path / "m.pt")!r}) as ckpt:
            try:
                ckpt.tensors["w"].to_torch()
            except torchless.UnsupportedError as e:
                print("refused:", e)
        for call in (lambda: torchless.load({str(tmp_path / "m.pt")!r}, framework="pt"),):
            try:
                call()
            except torchless.UnsupportedError as e:
                print("refused:", e)
        print(sys.modules["torch"])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert len(out) == 3 and all("needs torch, which cannot be imported" in line
                                 for line in out[:2]), out
    assert "to_torch()" in out[0] and "framework='pt'" in out[1]
    assert out[2] == "None"


# dtypes both JAX and MLX hold (MLX has no float64 on every backend nor float8)
_FRAMEWORK_DTYPES = ["float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
                     "uint8", "bool"]


@pytest.mark.parametrize("reader", ["jax", "mlx"])
def test_jax_and_mlx_read_converted_files(torch: ModuleType, tg: ModuleType,  # noqa: F811
                                          tmp_path: Path, reader: str) -> None:
    """What docs/interop.md promises: the converted file loads in JAX and MLX with their own
    safetensors readers, and every tensor equals what torch.load reads from the source."""
    saved = {f"{dtype}.{kind}": t for dtype in _FRAMEWORK_DTYPES
             for kind, t in tg.views(dtype, seed=5).items()}
    with tg.quiet():
        torch.save(saved, tmp_path / "m.pt")
        expected = torch.load(tmp_path / "m.pt", weights_only=True)
    out = tmp_path / "m.safetensors"
    torchless.convert(tmp_path / "m.pt", out, tree=False)
    if reader == "jax":
        flax = require("safetensors.flax")
        jax = require("jax")
        x64 = jax.config.jax_enable_x64
        jax.config.update("jax_enable_x64", True)  # else JAX narrows int64 to int32
        try:
            got = {k: np.asarray(v) for k, v in flax.load_file(str(out)).items()}
        finally:
            jax.config.update("jax_enable_x64", x64)
    else:
        mx = require("mlx.core")
        # MLX hands bfloat16 to NumPy only through float32, which holds every bfloat16 exactly
        got = {k: np.asarray(v.astype(mx.float32) if v.dtype == mx.bfloat16 else v)
               for k, v in mx.load(str(out)).items()}
    assert set(got) == set(expected)
    for name, want in expected.items():
        if want.dtype == torch.bfloat16 and reader == "mlx":
            want = want.float()
        arr = got[name]
        assert tuple(arr.shape) == tuple(want.shape), name
        assert arr.tobytes() == tg.contiguous_bytes(want), name
