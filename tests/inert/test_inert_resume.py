"""Resume parity through inert files: a run resumed from a checkpoint continues bit-exactly.

A tiny model (Linear-ReLU-Dropout-Linear), AdamW and a StepLR scheduler train on CPU with data
drawn each step from torch's, NumPy's and Python's global RNGs (and dropout), so the model,
the optimizer, the scheduler and all three RNG states must come back exactly for the resumed
run to match.

The oracles: the run continued from the in-memory state (the reference) and ``torch.load``
of the same checkpoint (which must itself resume to the reference). Resuming from the file
``torchless.convert`` made of the ``.pt``, and from a file ``torchless.save`` wrote directly,
must give every parameter and every optimizer state tensor bit for bit.
"""

from __future__ import annotations

import argparse
import copy
import math
import random
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import torchless
from tests.inert.test_inert_frameworks import assert_same, rngs_kept

pytestmark = pytest.mark.torch

#: steps before the checkpoint (odd: Python's and NumPy's gauss caches are then full)
K = 3
#: steps after it
N = 4
CONFIG = argparse.Namespace(lr=0.02, hidden=8, dropout=0.3, seed=7, name="tiny",
                            betas=(0.9, 0.99), layers=[4, 8, 2], amp=False, note=None)


@pytest.fixture
def rng_guard(torch: ModuleType) -> Iterator[None]:
    """Leave the three global RNGs as this test found them."""
    with rngs_kept(torch):
        yield


def _build(torch: ModuleType, init_seed: int) -> tuple[Any, Any, Any]:
    """A fresh model, AdamW and StepLR; the init seed only decides the initial weights."""
    g_state = torch.get_rng_state()
    torch.manual_seed(init_seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, CONFIG.hidden), torch.nn.ReLU(), torch.nn.Dropout(CONFIG.dropout),
        torch.nn.Linear(CONFIG.hidden, 2))
    torch.set_rng_state(g_state)  # building must not move the global stream
    opt = torch.optim.AdamW(model.parameters(), lr=CONFIG.lr, betas=CONFIG.betas,
                            weight_decay=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    model.train()
    return model, opt, sched


def _step(torch: ModuleType, model: Any, opt: Any, sched: Any) -> float:
    """One training step drawing from all three global RNGs (and dropout's torch draws)."""
    x = torch.randn(5, 4)
    noise = np.random.standard_normal((5, 2)) * 0.1 + np.random.normal()  # 11 gaussians
    scale = random.gauss(1.0, 0.25) + random.random()
    target = x[:, :2] * scale + torch.from_numpy(noise.astype(np.float32))
    loss = ((model(x) - target) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    return float(loss.item())


def _params(model: Any) -> list[tuple[str, Any]]:
    return [(k, v.detach().clone()) for k, v in model.state_dict().items()]


def _opt_tensors(torch: ModuleType, opt: Any) -> list[tuple[str, Any]]:
    out = []
    for pid, st in sorted(opt.state_dict()["state"].items()):
        for k, v in sorted(st.items()):
            assert isinstance(v, torch.Tensor), (pid, k, type(v))
            out.append((f"{pid}.{k}", v.detach().clone()))
    return out


def _assert_bit_equal(torch: ModuleType, got: list[tuple[str, Any]],
                      want: list[tuple[str, Any]]) -> None:
    assert [k for k, _ in got] == [k for k, _ in want]
    for (k, a), (_, b) in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, k
        assert torch.equal(a, b), f"{k} differs"
        # torch.equal treats -0.0 == 0.0; the bytes must match too
        assert _bytes(torch, a) == _bytes(torch, b), f"{k} differs in its bytes"


def _bytes(torch: ModuleType, t: Any) -> bytes:
    return bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def _differs(torch: ModuleType, got: list[tuple[str, Any]],
             want: list[tuple[str, Any]]) -> bool:
    return any(not torch.equal(a, b) for (_, a), (_, b) in zip(got, want, strict=True))


class Run:
    """The original run: K steps, a checkpoint, then N steps more (the reference)."""

    def __init__(self, torch: ModuleType, tmp: Path) -> None:
        self.torch = torch
        torch.manual_seed(CONFIG.seed)
        np.random.seed(CONFIG.seed)
        random.seed(CONFIG.seed)
        model, opt, sched = _build(torch, init_seed=1)
        metrics: list[float] = []
        for _ in range(K):
            metrics.append(_step(torch, model, opt, sched))
        # the gauss caches are full here, so a lost cached value would show
        assert random.getstate()[2] is not None
        np_state: Any = np.random.get_state()
        assert np_state[3] == 1
        self.metrics = list(metrics)
        self.checkpoint: dict[str, Any] = {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(),
            "epoch": 1,
            "step": K,
            "torch_rng": torch.get_rng_state(),
            "numpy_rng": np.random.get_state(),
            "python_rng": random.getstate(),
            "config": CONFIG,
            "metrics": metrics,
        }
        self.pt = tmp / "ckpt.pt"
        torch.save(self.checkpoint, self.pt)
        # the state dicts hold the live tensors, which the next steps change in place
        self.saved: dict[str, Any] = copy.deepcopy(self.checkpoint)
        # torchless.save straight from the loop: live tensors (the state dicts hold the
        # parameters' own storage)
        self.direct = tmp / "direct.safetensors"
        self.direct_error: Exception | None = None
        try:
            torchless.save(self.checkpoint, self.direct)
        except Exception as e:  # reported by the tests that read the file
            self.direct_error = e
        for _ in range(N):
            _step(torch, model, opt, sched)
        self.ref_params = _params(model)
        self.ref_opt = _opt_tensors(torch, opt)
        self.ref_lr = [g["lr"] for g in opt.param_groups]
        self.ref_draws = (torch.rand(3), np.random.random(3), random.random())


def _resume(torch: ModuleType, ck: dict[str, Any],
            restore: frozenset[str] = frozenset({"torch", "numpy", "python"}),
            ) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]], list[float], Any]:
    """A fresh model/optimizer/scheduler loaded from ``ck``, N steps on."""
    # everything not restored starts from an unrelated state
    torch.manual_seed(12345)
    np.random.seed(12345)
    random.seed(12345)
    model, opt, sched = _build(torch, init_seed=99)
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["optimizer"])
    sched.load_state_dict(ck["scheduler"])
    if "torch" in restore:
        torch.set_rng_state(ck["torch_rng"])
    if "numpy" in restore:
        np.random.set_state(ck["numpy_rng"])
    if "python" in restore:
        random.setstate(ck["python_rng"])
    for _ in range(N):
        _step(torch, model, opt, sched)
    draws = (torch.rand(3), np.random.random(3), random.random())
    return _params(model), _opt_tensors(torch, opt), [g["lr"] for g in opt.param_groups], draws


def _check_resumed(torch: ModuleType, run: Run, ck: dict[str, Any]) -> None:
    params, opt_tensors, lr, draws = _resume(torch, ck)
    _assert_bit_equal(torch, params, run.ref_params)
    _assert_bit_equal(torch, opt_tensors, run.ref_opt)
    assert lr == run.ref_lr
    # the RNG streams continue where the reference's did
    assert torch.equal(draws[0], run.ref_draws[0])
    assert np.array_equal(draws[1], run.ref_draws[1])
    assert draws[2] == run.ref_draws[2]


def _fbits(x: float) -> bytes:
    return struct.pack("<d", x)


def _check_plain_parts(torch: ModuleType, run: Run, ck: dict[str, Any]) -> None:
    """Counters, config, metrics and RNG states come back equal and of the right types."""
    assert list(ck) == list(run.saved)
    for k in ("epoch", "step"):
        assert type(ck[k]) is int and ck[k] == run.saved[k], k
    cfg = ck["config"]
    assert type(cfg) is argparse.Namespace
    assert vars(cfg) == vars(CONFIG)
    assert list(vars(cfg)) == list(vars(CONFIG))
    assert type(cfg.betas) is tuple and type(cfg.layers) is list and cfg.amp is False
    assert cfg.note is None and type(cfg.seed) is int and type(cfg.lr) is float
    m = ck["metrics"]
    assert type(m) is list and len(m) == K
    assert all(type(v) is float for v in m)
    assert [_fbits(v) for v in m] == [_fbits(v) for v in run.metrics]
    assert all(math.isfinite(v) for v in m)
    # RNG states: the torch one a uint8 tensor, NumPy's a tuple with a uint32 array,
    # Python's a tuple of ints with the cached gaussian
    t = ck["torch_rng"]
    assert isinstance(t, torch.Tensor) and t.dtype == torch.uint8
    assert torch.equal(t, run.saved["torch_rng"])
    n, want_n = ck["numpy_rng"], run.saved["numpy_rng"]
    assert type(n) is tuple and len(n) == len(want_n) == 5
    assert n[0] == "MT19937" and type(n[0]) is str
    assert isinstance(n[1], np.ndarray) and n[1].dtype == np.uint32
    assert np.array_equal(n[1], want_n[1])
    assert (type(n[2]), type(n[3]), type(n[4])) == (int, int, float)
    assert n[2:4] == want_n[2:4] and _fbits(n[4]) == _fbits(want_n[4])
    p = ck["python_rng"]
    assert type(p) is tuple and type(p[1]) is tuple and type(p[2]) is float
    assert p == run.saved["python_rng"]
    assert all(type(v) is int for v in p[1])
    # the scheduler's and optimizer's plain values
    assert ck["scheduler"] == run.saved["scheduler"]
    assert type(ck["scheduler"]["last_epoch"]) is int
    groups = ck["optimizer"]["param_groups"]
    assert groups == run.saved["optimizer"]["param_groups"]
    assert type(groups[0]["betas"]) is tuple and type(groups[0]["params"]) is list
    assert sorted(ck["optimizer"]["state"]) == sorted(run.saved["optimizer"]["state"])
    assert all(type(k) is int for k in ck["optimizer"]["state"])


def _check_tensors(torch: ModuleType, run: Run, ck: dict[str, Any]) -> None:
    """Every tensor is a real, writable torch tensor equal to the saved one."""
    want_model = run.saved["model"]
    assert list(ck["model"]) == list(want_model)
    for k, v in ck["model"].items():
        assert isinstance(v, torch.Tensor), k
        assert v.dtype == want_model[k].dtype and torch.equal(v, want_model[k]), k
    for pid, st in run.saved["optimizer"]["state"].items():
        got = ck["optimizer"]["state"][pid]
        assert list(got) == list(st)
        for k, v in st.items():
            assert isinstance(got[k], torch.Tensor), (pid, k)
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, (pid, k)
            assert torch.equal(got[k], v), (pid, k)
    # writable copies: writing one changes neither the others nor the file's next load
    t = ck["optimizer"]["state"][0]["exp_avg"]
    before = t.clone()
    t.add_(1.0)
    assert torch.equal(t, before + 1.0)


@pytest.fixture
def run(torch: ModuleType, tmp_path: Path, rng_guard: None) -> Run:
    return Run(torch, tmp_path)


def test_reference_resume_from_torch_load(torch: ModuleType, run: Run) -> None:
    """Sanity: torch.load of the .pt resumes to the reference bit-exactly."""
    ck = torch.load(run.pt, weights_only=False)
    _check_resumed(torch, run, ck)


def test_resume_needs_every_rng_state(torch: ModuleType, run: Run) -> None:
    """Leaving out any one RNG state (or the optimizer state) changes the result: the
    parity tests below can fail."""
    ck = torch.load(run.pt, weights_only=False)
    for left_out in ("torch", "numpy", "python"):
        params, _, _, _ = _resume(torch, ck, frozenset({"torch", "numpy", "python"})
                                  - {left_out})
        assert _differs(torch, params, run.ref_params), \
            f"not restoring the {left_out} RNG made no difference"
    # a fresh optimizer (no state) differs too
    fresh = dict(ck)
    _, opt, _ = _build(torch, init_seed=5)
    fresh["optimizer"] = opt.state_dict()
    fresh["optimizer"]["param_groups"] = ck["optimizer"]["param_groups"]
    params, _, _, _ = _resume(torch, fresh)
    assert _differs(torch, params, run.ref_params)


def _inert_file(run: Run, tmp_path: Path, how: str) -> Path:
    """The checkpoint as an inert file: the .pt converted, or torchless.save's own."""
    if how == "convert":
        path = tmp_path / "converted.safetensors"
        torchless.convert(run.pt, path)
        return path
    if run.direct_error is not None:
        raise run.direct_error
    return run.direct


@pytest.mark.parametrize("how", ["convert", "save"])
def test_resume_parity(torch: ModuleType, run: Run, tmp_path: Path, how: str) -> None:
    """(b) convert the .pt / (c) torchless.save from the loop; load with torch tensors;
    resume; every parameter and optimizer tensor is bit-identical to the reference."""
    path = _inert_file(run, tmp_path, how)
    ck = torchless.load(path, framework="pt")
    assert type(ck) is dict
    _check_plain_parts(torch, run, ck)
    _check_resumed(torch, run, ck)
    # a second load is unaffected by writes into the first one's tensors
    _check_tensors(torch, run, torchless.load(path, framework="pt"))
    _check_tensors(torch, run, torchless.load(path, framework="pt"))


@pytest.mark.parametrize("how", ["convert", "save"])
def test_numpy_load_matches_torch_load(torch: ModuleType, run: Run, tmp_path: Path,
                                       how: str) -> None:
    """framework="np" (the default): arrays with torch.load's values, same plain parts."""
    path = _inert_file(run, tmp_path, how)
    ck = torchless.load(path)
    if how == "convert":  # the whole structure, as torchless reads the .pt itself
        assert_same(ck, torchless.load(run.pt))
    want = torch.load(run.pt, weights_only=False)
    for k, v in want["model"].items():
        got = ck["model"][k]
        assert isinstance(got, np.ndarray) and got.dtype == np.float32, k
        assert got.tobytes() == v.numpy().tobytes(), k
    for pid, st in want["optimizer"]["state"].items():
        for k, v in st.items():
            got = ck["optimizer"]["state"][pid][k]
            assert isinstance(got, np.ndarray), (pid, k)
            assert got.shape == tuple(v.shape) and got.tobytes() == v.numpy().tobytes()
    rng = ck["torch_rng"]
    assert isinstance(rng, np.ndarray) and rng.dtype == np.uint8
    assert rng.tobytes() == want["torch_rng"].numpy().tobytes()
    assert vars(ck["config"]) == vars(want["config"])
    assert ck["python_rng"] == want["python_rng"]
    assert np.array_equal(ck["numpy_rng"][1], want["numpy_rng"][1])
    assert ck["metrics"] == want["metrics"]


def test_state_dict_metadata_survives(torch: ModuleType, run: Run, tmp_path: Path) -> None:
    """model.state_dict() is an OrderedDict with ``_metadata`` (load_state_dict reads the
    per-module versions from it); it survives both ways, as torch.load has it."""
    want = torch.load(run.pt, weights_only=False)["model"]
    conv = tmp_path / "converted.safetensors"
    torchless.convert(run.pt, conv)
    loaders: list[Callable[[], Any]] = [
        lambda: torchless.load(conv, framework="pt")["model"],
        lambda: torchless.load(run.direct, framework="pt")["model"],
        lambda: torchless.load(conv)["model"],
    ]
    for load in loaders:
        got = load()
        assert isinstance(got, dict) and type(got).__name__ in ("OrderedDict", "ModuleDict")
        assert hasattr(got, "_metadata")
        assert dict(got._metadata) == dict(want._metadata)


def test_parameters_and_torch_values(torch: ModuleType, tmp_path: Path) -> None:
    """Saved whole: nn.Parameter (with its requires_grad), torch dtypes, sizes and devices
    come back as torch's own types with framework="pt"."""
    g = torch.Generator().manual_seed(3)
    p = torch.nn.Parameter(torch.randn(2, 3, generator=g))
    frozen = torch.nn.Parameter(torch.randn(4, generator=g).to(torch.bfloat16),
                                requires_grad=False)
    plain = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    obj = {"p": p, "frozen": frozen, "plain": plain, "again": p,
           "dtype": torch.bfloat16, "size": torch.Size([2, 3]), "device": torch.device("cpu")}
    path = tmp_path / "params.safetensors"
    torchless.save(obj, path)
    got = torchless.load(path, framework="pt")
    assert list(got) == list(obj)
    assert type(got["p"]) is torch.nn.Parameter and got["p"].requires_grad
    assert type(got["frozen"]) is torch.nn.Parameter and not got["frozen"].requires_grad
    assert type(got["plain"]) is torch.Tensor and not got["plain"].requires_grad
    assert got["again"] is got["p"]  # one object saved twice is one object loaded
    for k in ("p", "frozen", "plain"):
        assert got[k].dtype == obj[k].dtype and torch.equal(got[k].detach(), obj[k].detach())
    assert got["dtype"] is torch.bfloat16
    assert type(got["size"]) is torch.Size and got["size"] == (2, 3)
    assert type(got["device"]) is torch.device and got["device"] == torch.device("cpu")
    # a loaded parameter trains: it is a writable leaf
    got["p"].sum().backward()
    assert got["p"].grad is not None and torch.equal(got["p"].grad, torch.ones(2, 3))
    with torch.no_grad():
        got["p"].add_(1.0)
    assert torch.equal(got["p"].detach(), p.detach() + 1.0)
    # without torch types: a plain array, a tuple for the size, text for the device
    npv = torchless.load(path)
    assert isinstance(npv["p"], np.ndarray) and npv["p"].tobytes() == p.detach().numpy().tobytes()
    assert type(npv["size"]) is tuple and npv["size"] == (2, 3)
    assert npv["device"] == "cpu"
