"""The natural resume call on a converted checkpoint, run under each transformers version
(test_hf_trainer calls :func:`run` in its own process for the test extra's 4.x, and runs
this module in a subprocess for 5.x, printing the result as JSON).

One native run with ``InertCheckpointCallback(remove_originals=False)`` leaves each
``checkpoint-N/`` with its pickles and their inert files; ``conv/checkpoint-2`` is a copy
with the pickles left out. The oracle resumes from the native checkpoint; the runs resumed
with ``resume_from_checkpoint=<conv path>`` and ``=True`` must end equal to it to the bit
(weights, optimizer, scheduler, RNG states). A converted copy lacking
``optimizer.safetensors``, and a directory lacking the optimizer and scheduler altogether,
must raise before the first training step."""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from ._parity import assert_same

PICKLES = (".pt", ".pth", ".bin")


def trainer(out: Path, callbacks: list[Any], *, n_layer: int = 1, n_embd: int = 8,
            vocab: int = 32, positions: int = 8, rows: int = 8, steps: int = 4,
            warmup: int = 1, **args: Any) -> Any:
    """A tiny GPT-2 Trainer, the same for every seed and call: ``steps`` training steps, a
    checkpoint every ``steps // 2``; ``args`` go to ``TrainingArguments``."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=2,
                                     vocab_size=vocab, n_positions=positions)
    model = transformers.GPT2LMHeadModel(config)
    g = torch.Generator().manual_seed(3)
    data = [{"input_ids": ids, "labels": ids}
            for ids in torch.randint(0, vocab, (rows, 8), generator=g)]
    training = transformers.TrainingArguments(
        output_dir=str(out), max_steps=steps, save_steps=steps // 2,
        per_device_train_batch_size=2, learning_rate=1e-2, lr_scheduler_type="linear",
        warmup_steps=warmup, report_to=[], use_cpu=True, seed=0, logging_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0, **args)
    return transformers.Trainer(model=model, args=training, train_dataset=data,
                                callbacks=callbacks)


def final(trainer: Any) -> dict[str, Any]:
    """What a resumed run must end with: weights, optimizer, scheduler, the three RNGs."""
    import numpy as np
    import torch

    return {"model": trainer.model.state_dict(), "opt": trainer.optimizer.state_dict(),
            "sched": trainer.lr_scheduler.state_dict(), "torch_rng": torch.get_rng_state(),
            "np_rng": np.random.get_state()[1].tolist(), "py_rng": random.getstate(),
            "step": trainer.state.global_step}


def _same(a: Any, b: Any) -> bool:
    try:
        assert_same(a, b)
    except AssertionError:
        return False
    return True


def _copy(src: Path, dst: Path, keep: Any) -> Path:
    dst.mkdir(parents=True)
    for p in src.iterdir():
        if p.is_file() and keep(p.name):
            shutil.copyfile(p, dst / p.name)
    return dst


def _refused(root: Path, resume: Path) -> dict[str, Any]:
    """The error a resume from ``resume`` raises, and the training steps begun before."""
    from transformers import TrainerCallback

    from torchless.integrations.transformers import InertCheckpointCallback

    steps: list[int] = []

    class Steps(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            steps.append(state.global_step)

    resumed = trainer(root, [InertCheckpointCallback(), Steps()])
    try:
        resumed.train(resume_from_checkpoint=str(resume))
    except Exception as e:  # the type is the result
        return {"error": type(e).__name__, "message": str(e), "steps": steps}
    return {"error": None, "steps": steps}


def run(root: Path) -> dict[str, Any]:
    from torchless.integrations.transformers import InertCheckpointCallback

    tmp = root / "tmp"
    tmp.mkdir()
    saved, tempfile.tempdir = tempfile.tempdir, str(tmp)
    try:
        trainer(root / "run", [InertCheckpointCallback(remove_originals=False)]).train()
        native = root / "run" / "checkpoint-2"
        conv = _copy(native, root / "conv" / "checkpoint-2", lambda n: not n.endswith(PICKLES))
        oracle = trainer(root / "a", [])
        oracle.train(resume_from_checkpoint=str(native))
        want = final(oracle)
        by_path = trainer(root / "b", [InertCheckpointCallback()])
        by_path.train(resume_from_checkpoint=str(conv))
        by_true = trainer(root / "conv", [InertCheckpointCallback()])
        by_true.train(resume_from_checkpoint=True)
        no_opt = _copy(conv, root / "no-opt" / "checkpoint-2",
                       lambda n: n != "optimizer.safetensors")
        bare = _copy(native, root / "bare" / "checkpoint-2",
                     lambda n: n == "model.safetensors" or (
                         n not in ("optimizer.pt", "scheduler.pt")
                         and not n.endswith(".safetensors")))
        return {"native": sorted(os.listdir(native)), "conv": sorted(os.listdir(conv)),
                "step": want["step"], "path": _same(final(by_path), want),
                "true": _same(final(by_true), want),
                "no_opt": _refused(root / "c", no_opt), "bare": _refused(root / "d", bare),
                "bare_files": sorted(os.listdir(bare)), "tmp": os.listdir(tmp)}
    finally:
        tempfile.tempdir = saved


if __name__ == "__main__":
    print(json.dumps(run(Path(sys.argv[1]))))
