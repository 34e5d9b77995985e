"""accelerate: ``save_state`` directories converted to inert files, and loaded back.

    accelerator.save_state("ckpt")
    torchless.integrations.accelerate.convert_state("ckpt")      # pickles -> inert files
    ...
    torchless.integrations.accelerate.load_state(accelerator, "ckpt")

:func:`convert_state` converts every pickle ``save_state`` wrote (``optimizer.bin``,
``scheduler.bin``, ``random_states_0.pkl``, ``custom_checkpoint_0.pkl``,
``pytorch_model.bin`` …) to ``<stem>.safetensors`` beside it, verified, and (by default)
deletes the pickles; ``model.safetensors`` stays as it is. The same is ``torchless convert
DIR`` on the command line, without the deletion.

accelerate's ``load_state`` calls ``torch.load`` on fixed names, so :func:`load_state`
rebuilds them in a temporary directory from the inert files (``torch.save`` of what
torchless reads: torch tensors and plain values, never the original pickle) and passes that
directory to ``accelerator.load_state``. A file holding objects torchless keeps as inert
records (a sampler object pickled whole) is not rebuilt: save plain state instead.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from torchless.integrations._files import convert_dir, restore_dir

__all__ = ["convert_state", "load_state"]


def convert_state(path: str | os.PathLike[str], *, remove_originals: bool = True
                  ) -> dict[str, str]:
    """Convert a ``save_state`` directory in place; {pickle name: inert file name}."""
    return convert_dir(os.fspath(path), remove_originals=remove_originals)


def load_state(accelerator: Any, path: str | os.PathLike[str], **kwargs: Any) -> None:
    """``accelerator.load_state`` of a converted directory (``kwargs`` passed on)."""
    work = tempfile.mkdtemp(prefix="torchless-state-")
    try:
        restored = os.path.join(work, os.path.basename(os.path.normpath(os.fspath(path))))
        restore_dir(os.fspath(path), restored)
        accelerator.load_state(restored, **kwargs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
