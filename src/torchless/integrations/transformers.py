"""The Hugging Face Trainer: checkpoints saved as inert files, and resuming from them.

    trainer = Trainer(..., callbacks=[InertCheckpointCallback()])
    trainer.train()     # each output_dir/checkpoint-N/ holds inert files, no pickle
    trainer.train(resume_from_checkpoint=restore_checkpoint("out/checkpoint-500"))

:class:`InertCheckpointCallback` converts, after each save, every pickle of the new
``checkpoint-N/`` (``optimizer.pt``, ``scheduler.pt``, ``rng_state*.pth``, ``scaler.pt``,
``training_args.bin``, ``pytorch_model.bin`` …) to ``<stem>.safetensors`` beside it, each
verified, and then (by default) deletes the pickles: the directory can be shared and scanned
without trusting a pickle. ``model.safetensors``, ``trainer_state.json`` and the configs are
left as they are.

The Trainer's resume code calls ``torch.load`` on fixed file names, so
:func:`restore_checkpoint` builds a directory it reads: each inert file is written back
under its original name with ``torch.save`` of what torchless reads (torch tensors, plain
values; no pickle from the checkpoint is ever loaded) and the other files are hard-linked.
``training_args.bin`` (a ``TrainingArguments`` object, which torchless keeps as an inert
record and never instantiates) is not rebuilt: the Trainer does not read it on resume.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from typing import Any

from transformers import TrainerCallback

from torchless.integrations._files import convert_dir, restore_dir

__all__ = ["InertCheckpointCallback", "restore_checkpoint"]


class InertCheckpointCallback(TrainerCallback):  # type: ignore[misc]
    """After each checkpoint save, convert the new ``checkpoint-N/`` to inert files."""

    def __init__(self, *, remove_originals: bool = True) -> None:
        self.remove_originals = remove_originals
        #: checkpoint directory -> {pickle name: inert file name}, for each save so far
        self.converted: dict[str, dict[str, str]] = {}

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.is_world_process_zero:
            path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            if os.path.isdir(path):
                self.converted[path] = convert_dir(path,
                                                   remove_originals=self.remove_originals)
        return control


def restore_checkpoint(path: str | os.PathLike[str], dst: str | os.PathLike[str] | None = None
                       ) -> str:
    """A directory ``Trainer.train(resume_from_checkpoint=...)`` reads, rebuilt from the
    converted ``checkpoint-N/`` at ``path`` (into ``dst``, default a new temporary
    directory named after it, removed when the program exits: it holds a full copy of the
    optimizer state). Returns its path; nothing of it is left if it fails."""
    src = os.fspath(path)
    if dst is not None:
        restore_dir(src, os.fspath(dst))
        return os.fspath(dst)
    work = tempfile.mkdtemp(prefix="torchless-")
    try:
        out = os.path.join(work, os.path.basename(os.path.normpath(src)))
        restore_dir(src, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    return out
