"""accelerate: a save_state directory converted to inert files loads back through
torchless.integrations.accelerate.load_state exactly as the original loads with
accelerator.load_state (the oracle: training on from each, compared parameter by parameter,
with optimizer, scheduler, a registered object and the RNG states)."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ..conftest import require
from ._parity import assert_same

pytestmark = [pytest.mark.torch, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]


@pytest.fixture(scope="module")
def accelerate() -> ModuleType:
    require("torch")
    return require("accelerate")


class Counter:
    """A registered object: its state_dict goes to custom_checkpoint_0.pkl."""

    def __init__(self) -> None:
        self.steps = 0

    def state_dict(self) -> dict[str, int]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.steps = state["steps"]


def _setup(accelerate: ModuleType, seed: int) -> tuple[Any, ...]:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    acc = accelerate.Accelerator(cpu=True)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3),
                                torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.8)
    g = torch.Generator().manual_seed(1)
    dl = DataLoader(TensorDataset(torch.randn(16, 4, generator=g),
                                  torch.randn(16, 2, generator=g)), batch_size=4)
    model, opt, dl, sched = acc.prepare(model, opt, dl, sched)
    counter = Counter()
    acc.register_for_checkpointing(counter)
    return acc, model, opt, dl, sched, counter


def _train(setup: tuple[Any, ...], steps: int) -> None:
    import torch

    acc, model, opt, dl, sched, counter = setup
    for _, (x, y) in zip(range(steps), dl, strict=False):
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        counter.steps += 1


def _final(setup: tuple[Any, ...]) -> dict[str, Any]:
    import numpy as np
    import torch

    _, model, opt, _, sched, counter = setup
    return {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
            "counter": counter.steps, "torch_rng": torch.get_rng_state(),
            "np_rng": np.random.get_state()[1].tolist(), "py_rng": random.getstate()}



@pytest.mark.parametrize("safe", [True, False])
def test_load_state_parity(accelerate: ModuleType, tmp_path: Path, safe: bool) -> None:
    from torchless.integrations.accelerate import convert_state, load_state

    first = _setup(accelerate, 0)
    _train(first, 3)
    first[0].save_state(str(tmp_path / "orig"), safe_serialization=safe)
    shutil.copytree(tmp_path / "orig", tmp_path / "inert")
    done = convert_state(tmp_path / "inert")
    pickles = {"optimizer.bin", "scheduler.bin", "random_states_0.pkl",
               "custom_checkpoint_0.pkl", *([] if safe else ["pytorch_model.bin"])}
    assert set(done) == pickles
    if not safe:  # the weights as transformers names them, loadable as they are
        assert done["pytorch_model.bin"] == "model.safetensors"
    assert not [n for n in os.listdir(tmp_path / "inert") if n.endswith((".bin", ".pkl"))]
    # the oracle: accelerate's own load_state of the original, then training on
    oracle = _setup(accelerate, 5)
    oracle[0].load_state(str(tmp_path / "orig"))
    _train(oracle, 3)
    resumed = _setup(accelerate, 5)
    load_state(resumed[0], tmp_path / "inert")
    _train(resumed, 3)
    want = _final(oracle)
    assert want["counter"] == 6
    assert_same(_final(resumed), want)
