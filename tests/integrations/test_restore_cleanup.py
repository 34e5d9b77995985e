"""``restore_checkpoint`` leaves nothing behind: its temporary directory (a full
``torch.save`` copy of the optimizer state) is removed when the program exits, and at once
when it fails; a ``dst`` it created is removed on failure. The oracle: the file system."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest

import torchless

from ..conftest import require

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

_RESTORE = """
import json, os, sys, torch
from torchless.integrations.transformers import restore_checkpoint
out = restore_checkpoint(sys.argv[1])
state = torch.load(os.path.join(out, "optimizer.pt"), weights_only=True)
print(json.dumps({"out": out, "names": sorted(os.listdir(out)),
                  "lr": state["param_groups"][0]["lr"]}))
"""


def _converted(torch: ModuleType, root: Path) -> Path:
    """A checkpoint-N/ whose optimizer.pt was converted to optimizer.safetensors and
    removed (what InertCheckpointCallback leaves)."""
    root.mkdir()
    param = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.Adam([param], lr=0.25)
    param.sum().backward()
    opt.step()
    torch.save(opt.state_dict(), root / "optimizer.pt")
    torchless.convert(root / "optimizer.pt", root / "optimizer.safetensors")
    (root / "optimizer.pt").unlink()
    (root / "trainer_state.json").write_text("{}")
    return root


def test_temporary_copy_removed_at_exit(torch: ModuleType, tmp_path: Path) -> None:
    require("transformers")
    ckpt = _converted(torch, tmp_path / "checkpoint-2")
    run = subprocess.run([sys.executable, "-c", _RESTORE, str(ckpt)], capture_output=True,
                         text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.splitlines()[-1])
    assert got["names"] == ["optimizer.pt", "trainer_state.json"] and got["lr"] == 0.25
    assert os.path.dirname(got["out"]).startswith(str(tmp_path))
    assert not os.path.exists(os.path.dirname(got["out"]))
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2"]


def test_failure_leaves_nothing(torch: ModuleType, tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    require("transformers")
    from torchless.integrations.transformers import restore_checkpoint

    ckpt = _converted(torch, tmp_path / "checkpoint-2")
    (ckpt / "zz.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with pytest.raises(torchless.CheckpointError):
        restore_checkpoint(ckpt)
    assert os.listdir(scratch) == []
    with pytest.raises(torchless.CheckpointError):
        restore_checkpoint(ckpt, tmp_path / "new" / "restored")
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "mine.txt").write_text("x")
    with pytest.raises(torchless.CheckpointError):
        restore_checkpoint(ckpt, kept)
    assert os.listdir(kept) == ["mine.txt"]
