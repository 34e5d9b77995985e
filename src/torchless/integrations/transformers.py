"""The Hugging Face Trainer: checkpoints saved as inert files, and resuming from them.

    trainer = Trainer(..., callbacks=[InertCheckpointCallback()])
    trainer.train()     # each output_dir/checkpoint-N/ holds inert files, no pickle
    trainer.train(resume_from_checkpoint="out/checkpoint-500")   # or True: resumes exactly

:class:`InertCheckpointCallback` converts, after each save, every pickle of the new
``checkpoint-N/`` (``optimizer.pt``, ``scheduler.pt``, ``rng_state*.pth``, ``scaler.pt``,
``training_args.bin``, ``pytorch_model.bin`` …) to ``<stem>.safetensors`` beside it, each
verified, and then (by default) deletes the pickles: the directory can be shared and scanned
without trusting a pickle. ``model.safetensors``, ``trainer_state.json`` and the configs are
left as they are.

The Trainer's resume code calls ``torch.load`` on fixed file names and, when one is missing,
goes on with a fresh optimizer, scheduler or RNG without a word. No callback event comes
before those reads, so importing this module wraps ``Trainer.train`` (once, for every
Trainer): when ``resume_from_checkpoint`` (a path, or ``True``: the last ``checkpoint-N``
of ``output_dir``, as the Trainer finds it) names a converted directory whose pickles are
gone, the directory is rebuilt by :func:`restore_checkpoint` in a temporary directory, the
Trainer resumes from that, and the temporary directory is removed when ``train`` returns.
If the rebuilt directory lacks a file the resume reads (``optimizer.pt``, ``scheduler.pt``,
the RNG file of this process), :class:`~torchless.errors.MissingFileError` is raised before
training. Any other directory is passed on untouched. As a net under that, the callback
raises at the start of training when it resumes past step 0 with neither the optimizer's
nor the scheduler's state restored.

:func:`restore_checkpoint` builds a directory the Trainer reads: each inert file is written
back under its original name with ``torch.save`` of what torchless reads (torch tensors,
plain values; no pickle from the checkpoint is ever loaded) and the other files are
hard-linked. ``training_args.bin`` (a ``TrainingArguments`` object, which torchless keeps
as an inert record and never instantiates) is not rebuilt: the Trainer does not read it on
resume.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from typing import Any

from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import get_last_checkpoint

from torchless.errors import MissingFileError
from torchless.integrations._files import convert_dir, missing_sources, restore_dir

__all__ = ["InertCheckpointCallback", "restore_checkpoint"]


class InertCheckpointCallback(TrainerCallback):  # type: ignore[misc]
    """After each checkpoint save, convert the new ``checkpoint-N/`` to inert files; at the
    start of training, refuse a resume that restored no optimizer or scheduler state."""

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

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step > 0 and _fresh(kwargs.get("optimizer"),
                                            kwargs.get("lr_scheduler")):
            raise MissingFileError(
                f"training resumes at step {state.global_step} with a fresh optimizer and "
                "scheduler: the checkpoint's optimizer.pt and scheduler.pt were not read",
                hint="resume from a checkpoint-N directory that holds them, or their inert "
                     "optimizer.safetensors and scheduler.safetensors")
        return control


def _fresh(optimizer: Any, scheduler: Any) -> bool:
    """Whether the optimizer holds no state and the scheduler has not stepped, as built
    (False when either cannot tell: no state_dict, or one of another shape)."""
    try:
        return (not optimizer.state_dict()["state"]
                and scheduler.state_dict()["last_epoch"] == 0)
    except (AttributeError, KeyError, TypeError):
        return False


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


def _needed(trainer: Any) -> list[str]:
    """The files the Trainer's resume reads from a checkpoint directory (and goes on
    without, silently, when they are missing)."""
    args = trainer.args
    rng = f"rng_state_{args.process_index}.pth" if args.world_size > 1 else "rng_state.pth"
    # DeepSpeed and FSDP keep the optimizer in directories of their own
    own = trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled
    return [*([] if own else ["optimizer.pt"]), "scheduler.pt", rng]


_trainer_train = Trainer.train


@functools.wraps(_trainer_train)
def _train(self: Any, resume_from_checkpoint: str | bool | None = None, *args: Any,
           **kwargs: Any) -> Any:
    path = resume_from_checkpoint
    if path is True:
        path = get_last_checkpoint(self.args.output_dir)
    if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path) or (
            not missing_sources(os.fspath(path))):
        return _trainer_train(self, resume_from_checkpoint, *args, **kwargs)
    src = os.fspath(path)
    work = tempfile.mkdtemp(prefix="torchless-resume-")
    try:
        restored = restore_checkpoint(src, os.path.join(work, os.path.basename(
            os.path.normpath(src))))
        lacking = [n for n in _needed(self) if not os.path.isfile(os.path.join(restored, n))]
        if lacking:
            stems = ", ".join(f"{os.path.splitext(n)[0]}.safetensors" for n in lacking)
            raise MissingFileError(
                f"cannot resume exactly: no {stems} (nor {', '.join(lacking)}) in this "
                "converted checkpoint, and the Trainer would go on without it",
                path=src, hint="resume from a checkpoint-N directory that holds every "
                               "file InertCheckpointCallback wrote")
        return _trainer_train(self, restored, *args, **kwargs)
    finally:
        shutil.rmtree(work, ignore_errors=True)


Trainer.train = _train
