"""The Hugging Face Trainer with InertCheckpointCallback: every pickle of each checkpoint-N/
becomes an inert file, and resuming through restore_checkpoint gives exactly what resuming
from the Trainer's own checkpoint gives (the oracle: that run's parameters, optimizer and
scheduler states, and torch / NumPy / Python RNG states after training)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ..conftest import require
from ._parity import assert_same
from ._trainer_resume import final, trainer
from .conftest import OFFLINE, TRANSFORMERS_5

pytestmark = [pytest.mark.torch, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]


@pytest.fixture(scope="module")
def transformers() -> ModuleType:
    require("torch")
    return require("transformers")


def _trainer(out: Path, callbacks: list[Any], safe: bool) -> Any:
    return trainer(out, callbacks, n_layer=2, n_embd=16, vocab=50, positions=16, rows=12,
                   steps=6, warmup=2, save_safetensors=safe)


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "pytorch_model.bin"])
def test_resume_parity(transformers: ModuleType, tmp_path: Path, safe: bool) -> None:
    from torchless.integrations.transformers import InertCheckpointCallback, restore_checkpoint

    _trainer(tmp_path / "plain", [], safe).train()
    callback = InertCheckpointCallback()
    _trainer(tmp_path / "inert", [callback], safe).train()
    ckpt = tmp_path / "inert" / "checkpoint-3"
    assert sorted(os.listdir(ckpt)) == sorted([
        "config.json", "generation_config.json", "model.safetensors", "trainer_state.json",
        "optimizer.safetensors", "scheduler.safetensors", "rng_state.safetensors",
        "training_args.safetensors"])
    assert callback.converted[str(ckpt)] == {
        "optimizer.pt": "optimizer.safetensors", "scheduler.pt": "scheduler.safetensors",
        "rng_state.pth": "rng_state.safetensors",
        "training_args.bin": "training_args.safetensors",
        **({} if safe else {"pytorch_model.bin": "model.safetensors"})}
    oracle_trainer = _trainer(tmp_path / "a", [], safe)
    oracle_trainer.train(resume_from_checkpoint=str(tmp_path / "plain" / "checkpoint-3"))
    oracle = final(oracle_trainer)
    restored = restore_checkpoint(ckpt, tmp_path / "restored")
    assert sorted(n for n in os.listdir(restored) if n.endswith((".pt", ".pth", ".bin"))) == [
        "optimizer.pt", *([] if safe else ["pytorch_model.bin"]), "rng_state.pth",
        "scheduler.pt"]
    resumed_trainer = _trainer(tmp_path / "b", [], safe)
    resumed_trainer.train(resume_from_checkpoint=restored)
    assert oracle["step"] == 6
    assert_same(final(resumed_trainer), oracle)


def _check_natural_resume(result: dict[str, Any]) -> None:
    """What the scenario of _trainer_resume must give: both natural calls exact, each broken
    directory refused before the first step, no temporary directory left."""
    assert "optimizer.pt" in result["native"] and "optimizer.safetensors" in result["native"]
    assert "optimizer.safetensors" in result["conv"]
    assert not [n for n in result["conv"] if n.endswith((".pt", ".pth", ".bin"))]
    assert result["step"] == 4
    assert result["path"] and result["true"]
    assert result["no_opt"]["error"] == "MissingFileError"
    assert "optimizer.safetensors" in result["no_opt"]["message"]
    assert result["no_opt"]["steps"] == []
    assert "optimizer.pt" not in result["bare_files"]
    assert "rng_state.pth" in result["bare_files"]
    assert result["bare"]["error"] == "MissingFileError"
    assert result["bare"]["steps"] == []
    assert result["tmp"] == []


def test_natural_resume(transformers: ModuleType, tmp_path: Path) -> None:
    """trainer.train(resume_from_checkpoint=...) on a converted checkpoint-N, a path or True,
    resumes exactly: the Trainer's own call, no restore_checkpoint."""
    from ._trainer_resume import run

    assert transformers.__version__.startswith("4.")
    _check_natural_resume(run(tmp_path))


def test_natural_resume_transformers_5(transformers_5: Path, tmp_path: Path) -> None:
    import torchless

    root = Path(__file__).resolve().parents[2]
    src = Path(torchless.__file__).resolve().parents[1]
    env = {**os.environ, **OFFLINE,
           "PYTHONPATH": os.pathsep.join([str(transformers_5), str(src), str(root)])}
    out = subprocess.run([sys.executable, "-m", "tests.integrations._trainer_resume",
                          str(tmp_path)], capture_output=True, text=True, env=env, cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.splitlines()[-1])
    version = subprocess.run([sys.executable, "-c",
                              "import transformers; print(transformers.__version__)"],
                             capture_output=True, text=True, env=env, check=True)
    assert version.stdout.strip() == TRANSFORMERS_5
    _check_natural_resume(result)
