"""Lightning with InertCheckpointIO: saved checkpoints are inert safetensors files, and
resuming from one (or, through torchless, from a torch .ckpt) gives exactly what resuming
from the torch checkpoint with Lightning's own TorchCheckpointIO gives: the oracle is that
run, compared parameter by parameter, with the optimizer and scheduler states and the RNG
state after training."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ..conftest import require
from ._parity import assert_same

pytestmark = [pytest.mark.torch, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              # lightning 2.6 on torch 2.13: its own use of a deprecated pytree class
              pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning")]


@pytest.fixture(scope="module")
def pl() -> ModuleType:
    require("torch")
    return require("lightning.pytorch")


def _module(pl: ModuleType) -> Any:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Net(pl.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self, lr: float = 0.05, width: int = 6) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Dropout(0.3),
                                           torch.nn.Linear(width, 2))

        def training_step(self, batch: Any, _: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.7)]

        def train_dataloader(self) -> Any:
            g = torch.Generator().manual_seed(1)
            data = TensorDataset(torch.randn(24, 4, generator=g), torch.randn(24, 2, generator=g))
            return DataLoader(data, batch_size=8, shuffle=True, generator=g)

    return Net


def _fit(pl: ModuleType, root: Path, epochs: int, plugins: list[Any],
         ckpt_path: str | None = None) -> tuple[Any, Any]:
    import torch

    pl.seed_everything(0, verbose=False)
    model = _module(pl)()
    trainer = pl.Trainer(default_root_dir=root, max_epochs=epochs, plugins=plugins,
                         accelerator="cpu", devices=1, logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[pl.callbacks.ModelCheckpoint(
                             dirpath=root, save_top_k=-1, every_n_epochs=1)])
    trainer.fit(model, ckpt_path=ckpt_path)
    return trainer, torch.get_rng_state()


def _state(trainer: Any, rng: Any) -> dict[str, Any]:
    opt = trainer.optimizers[0]
    return {"model": trainer.lightning_module.state_dict(), "opt": opt.state_dict(),
            "sched": trainer.lr_scheduler_configs[0].scheduler.state_dict(), "rng": rng,
            "step": trainer.global_step, "epoch": trainer.current_epoch}



def test_resume_parity(pl: ModuleType, tmp_path: Path) -> None:
    from torchless.integrations.lightning import InertCheckpointIO

    _fit(pl, tmp_path / "torch", 1, [])
    _fit(pl, tmp_path / "inert", 1, [InertCheckpointIO()])
    (torch_ckpt,) = (tmp_path / "torch").glob("*.ckpt")
    (inert_ckpt,) = (tmp_path / "inert").glob("*.ckpt")
    data = inert_ckpt.read_bytes()
    assert data[8:9] == b"{" and b"PK\x03\x04" not in data[:4]   # a safetensors file
    import safetensors

    with safetensors.safe_open(str(inert_ckpt), "pt") as f:     # any reader sees the weights
        assert "state_dict.net.0.weight" in f.keys() or any("net.0.weight" in k
                                                            for k in f.keys())
    oracle = _state(*_fit(pl, tmp_path / "r0", 3, [], str(torch_ckpt)))
    from_inert = _state(*_fit(pl, tmp_path / "r1", 3, [InertCheckpointIO()], str(inert_ckpt)))
    from_torch = _state(*_fit(pl, tmp_path / "r2", 3, [InertCheckpointIO()], str(torch_ckpt)))
    assert oracle["step"] == 9 and oracle["epoch"] == 3
    assert_same(from_inert, oracle)
    assert_same(from_torch, oracle)
    # the hyper parameters came back as Lightning saved them
    from torchless.integrations.lightning import InertCheckpointIO as IO
    back = IO().load_checkpoint(inert_ckpt)
    assert dict(back["hyper_parameters"]) == {"lr": 0.05, "width": 6}
