"""torchless.torch.load against torch.load (the oracle): the same object, tensors, Parameters
and shared storages, with no pickle code run; the files weights_only=True refuses; the
map_location forms; and the patched() block."""

from __future__ import annotations

import argparse
import collections
import dataclasses
import io
import json
import os
import pickle
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import torchless
import torchless.torch as tt

from ..conftest import REPO, require

pytestmark = pytest.mark.torch
FIXTURES = REPO / "tests" / "data" / "fixtures"


def _same(got: Any, want: Any, torch: ModuleType, where: str = "") -> None:
    """Equal objects; tensors equal in type, dtype, geometry, flags and bits."""
    if isinstance(want, torch.Tensor):
        assert type(got) is type(want), where
        assert got.dtype == want.dtype and got.shape == want.shape, where
        assert got.stride() == want.stride(), where
        assert got.storage_offset() == want.storage_offset(), where
        assert got.requires_grad == want.requires_grad, where
        a, b = got.detach(), want.detach()
        if a.numel():
            a = a.flatten().contiguous().view(torch.uint8) if a.dtype.itemsize else a
            b = b.flatten().contiguous().view(torch.uint8) if b.dtype.itemsize else b
        assert torch.equal(a, b), where
    elif isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), where
        for k in want:
            _same(got[k], want[k], torch, f"{where}.{k}")
    elif isinstance(want, (list, tuple)) and type(want) in (list, tuple):
        assert type(got) is type(want) and len(got) == len(want), where
        for i, (x, y) in enumerate(zip(got, want, strict=True)):
            _same(x, y, torch, f"{where}.{i}")
    elif isinstance(want, (int, float, str, bytes, bool, type(None))):
        assert got == want or (got != got and want != want), where


def _tensors(obj: Any, torch: ModuleType) -> list[Any]:
    """The tensors of ``obj`` in walk order (dict values, list and tuple items)."""
    out: list[Any] = []

    def walk(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, dict):
            for c in v.values():
                walk(c)
        elif isinstance(v, (list, tuple)):
            for c in v:
                walk(c)

    walk(obj)
    return out


def _sharing(obj: Any, torch: ModuleType) -> list[list[int]]:
    """Which tensors (by walk position) share a storage: the partition torch.load makes."""
    ptrs = [v.untyped_storage().data_ptr() if v.untyped_storage().nbytes() else -1
            for v in _tensors(obj, torch)]
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(ptrs):
        if p != -1:
            groups.setdefault(p, []).append(i)
    return sorted(groups.values())


def _fixtures() -> list[Path]:
    ref = json.loads((FIXTURES / "REFERENCE.json").read_text())
    return [FIXTURES / name for name, v in sorted(ref.items()) if not v.get("error")]


def test_fixtures_match_torch_load(torch: ModuleType) -> None:
    read = 0
    for path in _fixtures():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                want = torch.load(path, weights_only=False, map_location="cpu")
            except Exception:
                continue  # TorchScript archives and files torch itself cannot read
        got = tt.load(path, map_location="cpu")
        _same(got, want, torch, path.name)
        assert _sharing(got, torch) == _sharing(want, torch), path.name
        read += 1
    assert read >= 150


def test_parameters_views_and_shared_storage(torch: ModuleType, tmp_path: Path) -> None:
    base = torch.arange(24, dtype=torch.float32)
    lin = torch.nn.Linear(3, 2)
    obj = {"p": torch.nn.Parameter(torch.ones(2)), "frozen": torch.nn.Parameter(
        torch.zeros(1), requires_grad=False), "view": base[2:14].view(3, 4).t(), "base": base,
        "model": lin.state_dict()}
    torch.save(obj, tmp_path / "m.pt")
    want = torch.load(tmp_path / "m.pt")
    got = tt.load(tmp_path / "m.pt")
    _same(got, want, torch)
    assert got["view"].untyped_storage().data_ptr() == got["base"].untyped_storage().data_ptr()
    got["base"][2] = -1  # writable, and the view sees it, as in torch
    assert got["view"][0, 0].item() == -1
    fresh = torch.nn.Linear(3, 2)
    fresh.load_state_dict(got["model"])
    assert torch.equal(fresh.weight, lin.weight)


@dataclasses.dataclass
class Config:
    lr: float = 0.1
    layers: int = 2


def test_reads_what_weights_only_refuses(torch: ModuleType, tmp_path: Path) -> None:
    omegaconf = require("omegaconf")
    cfg = omegaconf.OmegaConf.create({"model": {"width": 8}})
    obj = {"state_dict": {"w": torch.ones(2, 2)}, "hparams": argparse.Namespace(lr=0.5),
           "np": np.float64(1.5), "arr": np.arange(3), "omega": cfg, "dc": Config()}
    torch.save(obj, tmp_path / "ckpt.pt")
    with pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / "ckpt.pt", weights_only=True)
    got = tt.load(tmp_path / "ckpt.pt", weights_only=True)
    assert torch.equal(got["state_dict"]["w"], torch.ones(2, 2))
    assert got["hparams"] == argparse.Namespace(lr=0.5)
    assert got["np"] == np.float64(1.5) and np.array_equal(got["arr"], np.arange(3))
    for key, cls in (("omega", "omegaconf.dictconfig.DictConfig"), ("dc", "Config")):
        assert isinstance(got[key], torchless.Opaque), key  # inert, never constructed
        assert got[key].class_path.endswith(cls), key


def test_file_objects_and_map_location_forms(torch: ModuleType, tmp_path: Path) -> None:
    shared = torch.arange(6.0)
    torch.save({"a": shared, "b": shared[1:3], "c": torch.ones(2, dtype=torch.int8)},
               tmp_path / "m.pt")
    want = torch.load(tmp_path / "m.pt")
    with open(tmp_path / "m.pt", "rb") as f:
        _same(tt.load(f), want, torch)
    _same(tt.load(io.BytesIO((tmp_path / "m.pt").read_bytes())), want, torch)
    for loc in ("cpu", torch.device("cpu"), {"cpu": "cpu"}, None):
        _same(tt.load(tmp_path / "m.pt", map_location=loc), want, torch, str(loc))
    calls: list[tuple[int, str]] = []
    marker: list[Any] = []

    def mine(storage: Any, location: str) -> Any:
        calls.append((storage.nbytes(), location))
        if storage.nbytes() == 2:  # the int8 storage: replaced by what the callable returns
            out = torch.UntypedStorage(2)
            out.copy_(torch.tensor([7, 7], dtype=torch.int8).untyped_storage())
            marker.append(out)
            return out
        return None

    ref_calls: list[tuple[int, str]] = []
    torch.load(tmp_path / "m.pt", map_location=lambda s, loc: ref_calls.append(
        (s.nbytes(), loc)))
    got = tt.load(tmp_path / "m.pt", map_location=mine)
    assert sorted(calls) == sorted(ref_calls)  # once per storage, as torch calls it
    assert got["c"].tolist() == [7, 7] and torch.equal(got["a"], want["a"])
    if not torch.cuda.is_available():  # a location this machine lacks: torch's own error
        for loader in (torch.load, tt.load):
            with pytest.raises(RuntimeError, match="CUDA"):
                loader(tmp_path / "m.pt", map_location={"cpu": "cuda:0"})
    with pytest.raises(ValueError, match="never unpickles"):
        tt.load(tmp_path / "m.pt", pickle_module=pickle)


def test_patched_swaps_torch_load_for_a_block(torch: ModuleType, tmp_path: Path) -> None:
    class Payload:
        def __reduce__(self) -> Any:
            return (os.system, ("echo pwned > " + str(tmp_path / "ran"),))

    with open(tmp_path / "evil.pt", "wb") as f:
        pickle.dump({"w": 1, "x": Payload()}, f)
    torch.save({"w": torch.ones(3)}, tmp_path / "ok.pt")
    original = torch.load
    with tt.patched():
        assert torch.load is not original
        assert torch.equal(torch.load(tmp_path / "ok.pt")["w"], torch.ones(3))
        with pytest.raises(torchless.UnsafeGlobalError):
            torch.load(tmp_path / "evil.pt", weights_only=False)
    assert torch.load is original and not (tmp_path / "ran").exists()
    with pytest.raises(RuntimeError), tt.patched():
        raise RuntimeError("inside")
    assert torch.load is original


def test_inert_files(torch: ModuleType, tmp_path: Path) -> None:
    obj = {"w": torch.nn.Parameter(torch.randn(3, 2)), "epoch": 4, "dtype": torch.bfloat16}
    torchless.save(obj, tmp_path / "c.safetensors")
    got = tt.load(tmp_path / "c.safetensors", map_location="cpu")
    assert isinstance(got["w"], torch.nn.Parameter) and torch.equal(got["w"], obj["w"])
    assert got["epoch"] == 4 and got["dtype"] is torch.bfloat16
    # map_location applies as to the same object saved by torch.save (the inert file's
    # storages were saved on the CPU)
    torch.save(obj, tmp_path / "c.pt")
    for where in ("meta", {"cpu": "meta"}, lambda s, loc: s):
        want = torch.load(tmp_path / "c.pt", map_location=where)
        meta = tt.load(tmp_path / "c.safetensors", map_location=where)
        assert meta["w"].device == want["w"].device and meta["w"].shape == want["w"].shape
        assert type(meta["w"]) is type(want["w"])


def _identities(obj: Any, torch: ModuleType) -> list[int]:
    """For each tensor (by walk position), the position of the first tensor that is the same
    Python object: the memo's identity structure, which torch.load keeps."""
    seen: dict[int, int] = {}
    return [seen.setdefault(id(v), i) for i, v in enumerate(_tensors(obj, torch))]


def test_a_tensor_saved_twice_is_one_object(torch: ModuleType, tmp_path: Path) -> None:
    t = torch.arange(6.0)
    lin = torch.nn.Linear(2, 2)
    sd = lin.state_dict()
    storage = torch.arange(3, dtype=torch.uint8).untyped_storage()
    obj = {"a": t, "b": t, "view": t[1:3], "pair": (t, [t]), "sd": sd,
           "again": collections.OrderedDict(sd), "p": [lin.weight, lin.weight],
           "s": [storage, storage]}
    torch.save(obj, tmp_path / "m.pt")
    want = torch.load(tmp_path / "m.pt")
    assert want["a"] is want["b"] and want["s"][0] is want["s"][1]  # the oracle's identities
    got = tt.load(tmp_path / "m.pt")
    _same(got, want, torch)
    assert _identities(got, torch) == _identities(want, torch)
    assert got["s"][0] is got["s"][1]
