"""Issue 26 row 3: a Hydra/OmegaConf config given to ``save_hyperparameters(cfg)`` survives
Lightning's natural calls with ``InertCheckpointIO``: saving, resuming
(``trainer.fit(ckpt_path=…)``) and ``Model.load_from_checkpoint`` (under
``torchless.torch.patched()``). The oracle is the same run with Lightning's own
``TorchCheckpointIO`` (``torch.save`` / ``torch.load``): the checkpoint dict's hyper
parameters, their class (``hparams_type``) and the loaded model's ``hparams``, compared with
OmegaConf's own ``to_container(resolve=False)`` and flag queries."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ..conftest import REPO, require

pytestmark = [pytest.mark.torch, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning")]


@dataclasses.dataclass
class Schedule:
    warmup: int = 2
    decay: float = 0.5


def _net(pl: ModuleType) -> Any:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class HydraNet(pl.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self, cfg: Any) -> None:
            super().__init__()
            self.save_hyperparameters(cfg)
            self.net = torch.nn.Linear(4, self.hparams.model.width)

        def training_step(self, batch: Any, _: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x)[:, :2], y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=self.hparams.optim.lr)

        def train_dataloader(self) -> Any:
            g = torch.Generator().manual_seed(1)
            data = TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 2, generator=g))
            return DataLoader(data, batch_size=4, shuffle=True, generator=g)

    return HydraNet


def _cfg(oc: ModuleType) -> Any:
    cfg = oc.OmegaConf.create({
        "model": {"width": 5, "out": "${model.width}"},
        "optim": {"lr": 0.05, "name": "sgd", "schedule": [1, 2, "${model.width}"]},
        "paths": {"root": "/runs", "ckpt": "${paths.root}/ckpt"}, "seed": 0})
    oc.OmegaConf.set_struct(cfg, True)
    return cfg


def _trainer(pl: ModuleType, root: Path, epochs: int, plugins: list[Any]) -> Any:
    return pl.Trainer(default_root_dir=root, max_epochs=epochs, plugins=plugins,
                      accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False)


def _run(pl: ModuleType, oc: ModuleType, root: Path, plugins: list[Any]) -> tuple[Any, Path]:
    pl.seed_everything(0, verbose=False)
    model = _net(pl)(_cfg(oc))
    trainer = _trainer(pl, root, 1, plugins)
    trainer.fit(model)
    ckpt = root / "m.ckpt"
    trainer.save_checkpoint(ckpt)
    return model, ckpt


def _same_config(oc: ModuleType, got: Any, want: Any) -> None:
    OmegaConf = oc.OmegaConf
    assert type(got) is type(want)
    assert OmegaConf.to_container(got, resolve=False) == OmegaConf.to_container(
        want, resolve=False)
    assert OmegaConf.to_container(got, resolve=True) == OmegaConf.to_container(
        want, resolve=True)
    assert OmegaConf.is_struct(got) == OmegaConf.is_struct(want)
    assert OmegaConf.is_readonly(got) == OmegaConf.is_readonly(want)


def test_omegaconf_hparams_through_lightning(tmp_path: Path) -> None:
    require("torch")
    pl: ModuleType = require("lightning.pytorch")
    oc = require("omegaconf")
    import torch

    import torchless.torch as tt
    from torchless.integrations.lightning import InertCheckpointIO

    _, torch_ckpt = _run(pl, oc, tmp_path / "torch", [])
    model, inert_ckpt = _run(pl, oc, tmp_path / "inert", [InertCheckpointIO()])
    assert inert_ckpt.read_bytes()[8:9] == b"{"  # an inert (safetensors) file
    want = torch.load(torch_ckpt, weights_only=False)
    got = InertCheckpointIO().load_checkpoint(inert_ckpt)
    assert got["hparams_type"] is want["hparams_type"] is oc.DictConfig
    assert got["hparams_name"] == want["hparams_name"]
    _same_config(oc, got["hyper_parameters"], want["hyper_parameters"])
    assert oc.OmegaConf.is_interpolation(got["hyper_parameters"].model, "out")

    # Model.load_from_checkpoint, Lightning's inference call, through the drop-in
    net = _net(pl)
    oracle = net.load_from_checkpoint(torch_ckpt, weights_only=False)
    with tt.patched():
        back = net.load_from_checkpoint(inert_ckpt)
    _same_config(oc, back.hparams, oracle.hparams)
    assert back.hparams.paths.ckpt == "/runs/ckpt"
    sd, osd = back.state_dict(), model.state_dict()
    assert sd.keys() == osd.keys() and all(torch.equal(sd[k], osd[k]) for k in osd)

    # an inference script that never imports the plugin registers OmegaConf itself
    script = ("import sys, lightning.pytorch as pl, torchless.torch as tt\n"
              "from torchless.integrations.configs import register_omegaconf\n"
              "from tests.integrations.test_lightning_configs import _net\n"
              "register_omegaconf()\n"
              "with tt.patched():\n"
              "    back = _net(pl).load_from_checkpoint(sys.argv[1])\n"
              "print(type(back.hparams).__name__, back.hparams.paths.ckpt,\n"
              "      'torchless.integrations.lightning' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", script, str(inert_ckpt)], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-3:] == ["DictConfig", "/runs/ckpt", "False"]

    # resuming from the inert file continues as resuming from the torch one (which torch
    # reads only with weights_only=False: its allowlist refuses DictConfig)
    states = []
    for ckpt, plugins, unsafe in ((torch_ckpt, [], False), (inert_ckpt, [InertCheckpointIO()],
                                                            None)):
        pl.seed_everything(0, verbose=False)
        resumed = _net(pl)(_cfg(oc))
        trainer = _trainer(pl, tmp_path / f"resume-{len(states)}", 2, plugins)
        trainer.fit(resumed, ckpt_path=str(ckpt), weights_only=unsafe)
        assert trainer.current_epoch == 2
        states.append(resumed.state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_a_dataclass_in_hparams_with_a_registry(tmp_path: Path) -> None:
    require("torch")
    pl: ModuleType = require("lightning.pytorch")
    from torchless import Opaque, TypeRegistry
    from torchless.integrations.configs import register_dataclass
    from torchless.integrations.lightning import InertCheckpointIO

    from .test_lightning import _module

    registry = TypeRegistry()
    register_dataclass(Schedule, registry=registry)
    model = _module(pl)(lr=0.01, width=3)
    model.hparams["schedule"] = Schedule(warmup=7)
    trainer = _trainer(pl, tmp_path, 1, [InertCheckpointIO(types=registry)])
    trainer.fit(model)
    ckpt = tmp_path / "m.ckpt"
    trainer.save_checkpoint(ckpt)
    got = InertCheckpointIO(types=registry).load_checkpoint(ckpt)["hyper_parameters"]
    assert got == {"lr": 0.01, "width": 3, "schedule": Schedule(warmup=7)}
    assert type(got["schedule"]) is Schedule
    # a program that did not register it reads an inert record
    plain = InertCheckpointIO().load_checkpoint(ckpt)["hyper_parameters"]["schedule"]
    assert isinstance(plain, Opaque) and plain.class_path.endswith("Schedule")
