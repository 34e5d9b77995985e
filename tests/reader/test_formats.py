"""torchless reads its own outputs: open/load/inspect accept safetensors files (plain and
inert, the inert tree included) and sharded checkpoints' *.index.json files. The oracles are
the safetensors package and torch.load of the shards."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import torchless
from torchless.cli.main import main


def test_plain_safetensors_opens(tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    arrays = {"z": np.arange(6, dtype=np.int32).reshape(2, 3), "a": np.ones(4, np.float16)}
    save_file(arrays, str(tmp_path / "m.safetensors"), metadata={"k": "v"})
    want = load_file(str(tmp_path / "m.safetensors"))
    with torchless.open(tmp_path / "m.safetensors") as ckpt:
        assert ckpt.format == "safetensors" and set(ckpt.tensors) == set(want)
        for name, arr in want.items():
            got = ckpt.numpy(name)
            assert got.dtype == arr.dtype and got.tobytes() == arr.tobytes()
        assert ckpt.info["metadata"] == {"k": "v"}


def test_inert_file_opens_with_its_tree(tmp_path: Path) -> None:
    obj = {"model": {"w": np.arange(4.0)}, "epoch": 7, "names": ["a", "b"]}
    torchless.save(obj, tmp_path / "c.safetensors")
    with torchless.open(tmp_path / "c.safetensors") as ckpt:
        assert ckpt.tree["epoch"] == 7 and ckpt.tree["names"] == ["a", "b"]
        assert np.array_equal(ckpt.tree["model"]["w"], obj["model"]["w"])
        assert ckpt.info["inert"] is True


@pytest.mark.torch
def test_index_files_open_their_shards(torch: ModuleType, tmp_path: Path) -> None:
    w = {"a": torch.randn(3, 2), "b": torch.arange(5), "c": torch.ones(2, dtype=torch.bool)}
    torch.save({"a": w["a"], "b": w["b"]}, tmp_path / "pytorch_model-00001-of-00002.bin")
    torch.save({"c": w["c"]}, tmp_path / "pytorch_model-00002-of-00002.bin")
    wmap = {"a": "pytorch_model-00001-of-00002.bin", "b": "pytorch_model-00001-of-00002.bin",
            "c": "pytorch_model-00002-of-00002.bin"}
    index = tmp_path / "pytorch_model.bin.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": wmap}))
    with torchless.open(index) as ckpt:
        assert ckpt.format == "index" and list(ckpt.tensors) == ["a", "b", "c"]
        for name, t in w.items():
            assert np.array_equal(ckpt.numpy(name), t.numpy()), name
    got = torchless.load(index, framework="pt")
    assert all(torch.equal(got[k], v) for k, v in w.items())
    from safetensors.torch import save_file

    save_file(w, str(tmp_path / "out.safetensors"))
    out_index = tmp_path / "model.safetensors.index.json"
    out_index.write_text(json.dumps({"weight_map": {k: "out.safetensors" for k in w}}))
    with torchless.open(out_index) as ckpt:
        assert sorted(ckpt.tensors) == ["a", "b", "c"]
        assert np.array_equal(ckpt.numpy("a"), w["a"].numpy())


def test_bad_index_files(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    save_file({"a": np.zeros(2)}, str(tmp_path / "s.safetensors"))
    bad = tmp_path / "bad.index.json"
    bad.write_text(json.dumps({"weight_map": {"a": "s.safetensors", "b": "s.safetensors"}}))
    with pytest.raises(torchless.FormatError, match="does not hold it"):
        torchless.open(bad)
    bad.write_text(json.dumps({"weight_map": {"a": "../s.safetensors"}}))
    with pytest.raises(torchless.UnsafePathError):
        torchless.open(bad)


def test_inspect_reads_safetensors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.numpy import save_file

    save_file({"layer.w": np.zeros((2, 3), np.float32)}, str(tmp_path / "m.safetensors"))
    assert main(["inspect", str(tmp_path / "m.safetensors")]) == 0
    out = capsys.readouterr().out
    assert "layer.w" in out and "2x3" in out and "safetensors" in out
