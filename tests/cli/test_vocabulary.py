"""Issue 26, row 16: one word per concept in the CLI and the API (docs/cli.md, "One
vocabulary"). The old spellings still work, with a warning on stderr (CLI) or a
DeprecationWarning (API), and give the same result as the new ones."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import torchless
from torchless.cli.main import main

from ..conftest import REPO

TINY = REPO / "examples" / "tiny.pt"


def _convert(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["convert", *argv, "-q"]) == 0
    return capsys.readouterr().err


def test_no_tree_and_weights_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    new, old, full = (tmp_path / f"{n}.safetensors" for n in ("new", "old", "full"))
    assert _convert(capsys, str(TINY), "-o", str(new), "--no-tree") == ""
    err = _convert(capsys, str(TINY), "-o", str(old), "--weights-only")
    assert "--weights-only is deprecated: say --no-tree" in err
    assert new.read_bytes() == old.read_bytes()
    assert _convert(capsys, str(TINY), "-o", str(full)) == ""
    # what the option does: the tree is there by default, not with --no-tree
    assert "torchless.tree" in _metadata(full) and "torchless.tree" not in _metadata(new)
    api = tmp_path / "api.safetensors"
    torchless.convert(TINY, api, tree=False)
    assert api.read_bytes() == new.read_bytes()


def _metadata(path: Path) -> dict[str, str]:
    import json
    import struct

    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return dict(json.loads(data[8:8 + n]).get("__metadata__", {}))


def test_no_link_files_and_copy_files(torch: ModuleType, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m"
    model.mkdir()
    torch.save({"w": torch.arange(4.0)}, model / "pytorch_model.bin")
    (model / "config.json").write_text('{"model_type": "x"}')
    outs = {}
    for flag in ("--no-link-files", "--copy-files", "--link-files"):
        out = tmp_path / flag.strip("-")
        err = _convert(capsys, str(model), "-o", str(out), flag)
        assert ("--copy-files is deprecated: say --no-link-files" in err) == (
            flag == "--copy-files")
        outs[flag] = out
    config = os.stat(model / "config.json")
    for flag, out in outs.items():
        there = os.stat(out / "config.json")
        linked = (there.st_dev, there.st_ino) == (config.st_dev, config.st_ino)
        assert linked == (flag == "--link-files"), flag
        assert (out / "config.json").read_text() == '{"model_type": "x"}'
        assert (out / "model.safetensors").read_bytes() == (
            outs["--link-files"] / "model.safetensors").read_bytes()


def test_load_framework_and_tensors(torch: ModuleType, tmp_path: Path) -> None:
    src = tmp_path / "c.pt"
    torch.save({"w": torch.arange(6.0).reshape(2, 3), "n": {"b": torch.ones(2, dtype=torch.int8)},
                "epoch": 3}, src)
    with pytest.warns(DeprecationWarning, match="framework='np' or framework='pt'") as said:
        old_np = torchless.load(src, tensors="numpy")
    assert said[0].filename == __file__  # the caller's line
    with pytest.warns(DeprecationWarning):
        old_pt = torchless.load(src, tensors="torch")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new_np, long_np = torchless.load(src), torchless.load(src, framework="numpy")
        new_pt, long_pt = (torchless.load(src, framework="pt"),
                           torchless.load(src, framework="torch"))
    expected = torch.load(src, weights_only=True)
    for got in (old_np, new_np, long_np):
        _same(got, expected, torch, np.ndarray)
    for got in (old_pt, new_pt, long_pt):
        _same(got, expected, torch, torch.Tensor)
    with pytest.raises(ValueError, match="framework 'jax' is invalid for load"):
        torchless.load(src, framework="jax")


def _same(got: object, expected: object, torch: ModuleType, kind: type) -> None:
    if isinstance(expected, dict):
        assert isinstance(got, dict) and list(got) == list(expected)
        for k in expected:
            _same(got[k], expected[k], torch, kind)
    elif isinstance(expected, torch.Tensor):
        assert isinstance(got, kind)
        assert np.array_equal(np.asarray(got), expected.numpy())
    else:
        assert got == expected
