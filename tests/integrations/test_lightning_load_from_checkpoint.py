"""Issue 26 row 2: ``Model.load_from_checkpoint(ckpt)`` on a file InertCheckpointIO wrote.
Lightning opens the path itself (``cloud_io._load``: fsspec's ``fs.open(path, "rb")``) and
passes the file object to ``torch.load``; under ``torchless.torch.patched()`` that is the
drop-in, which reads the inert file from the file object."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from ..conftest import require
from .test_lightning import _module

pytestmark = [pytest.mark.torch, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning")]


def test_load_from_checkpoint_reads_the_plugins_file(tmp_path: Path) -> None:
    require("torch")
    pl: ModuleType = require("lightning.pytorch")
    import torch

    import torchless.torch as tt
    from torchless.integrations.lightning import InertCheckpointIO

    net = _module(pl)
    model = net(lr=0.01, width=5)
    trainer = pl.Trainer(default_root_dir=tmp_path, max_epochs=1, plugins=[InertCheckpointIO()],
                         accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(model)
    ckpt = tmp_path / "m.ckpt"
    trainer.save_checkpoint(ckpt)
    assert ckpt.read_bytes()[8:9] == b"{"  # a safetensors (inert) file, not a torch ZIP
    with tt.patched():
        back = net.load_from_checkpoint(ckpt)
    assert back.hparams.lr == 0.01 and back.hparams.width == 5
    want = model.state_dict()
    got = back.state_dict()
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
