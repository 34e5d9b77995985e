"""Lightning: a ``CheckpointIO`` plugin that saves inert checkpoints and reads them, or plain
torch ``.ckpt`` files, without running pickle code.

    trainer = Trainer(plugins=[InertCheckpointIO()])
    trainer.fit(model)                            # epoch=…-step=….ckpt files are inert
    trainer.fit(model, ckpt_path="last.ckpt")     # resumes from one (or from a torch .ckpt)

A saved checkpoint is a safetensors file (whatever its name says) holding every tensor, with
the rest of Lightning's dict (loops, optimizer and scheduler states, callbacks, hyper
parameters …) as an inert tree (``docs/inert-format.md``); loading gives torch tensors on
the CPU, moved to ``map_location`` when that is a device (Lightning then moves them where the
model is). Hyper parameters of classes torchless does not rebuild come back as inert
``Opaque`` records: keep them to plain values, ``Namespace`` or dataclasses you register
(:func:`torchless.register_type`).

Works with the ``lightning`` package (``lightning.pytorch.Trainer``) or, without it, the
standalone ``pytorch_lightning`` / ``lightning_fabric``.
"""

from __future__ import annotations

import os
from typing import Any

from torchless.inert import store as _store
from torchless.integrations._files import torch_module
from torchless.reader import checkpoint as _checkpoint

try:
    from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
    from lightning.fabric.utilities.cloud_io import get_filesystem
except ImportError:  # the standalone packages
    from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO
    from lightning_fabric.utilities.cloud_io import get_filesystem

__all__ = ["InertCheckpointIO"]


class InertCheckpointIO(CheckpointIO):  # type: ignore[misc]
    """Save Lightning checkpoints as inert safetensors files; load those or torch ``.ckpt``
    files through torchless (no pickle code runs)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike[str],
                        storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError("InertCheckpointIO.save_checkpoint takes no storage_options")
        directory = os.path.dirname(os.fspath(path))
        if directory:
            os.makedirs(directory, exist_ok=True)
        _store.save(checkpoint, path)

    def load_checkpoint(self, path: str | os.PathLike[str], map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        if not os.path.exists(path):
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        checkpoint: dict[str, Any] = _checkpoint.load(path, tensors="torch")
        torch = torch_module()
        if isinstance(map_location, (str, torch.device)) and str(map_location) != "cpu":
            return _to(checkpoint, torch.device(map_location), torch)  # type: ignore[no-any-return]
        return checkpoint

    def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
        fs = get_filesystem(path)
        if fs.exists(path):
            fs.rm(path, recursive=True)


def _to(obj: Any, device: Any, torch: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        for k, v in obj.items():
            obj[k] = _to(v, device, torch)
        return obj
    if isinstance(obj, list):
        return [_to(v, device, torch) for v in obj]
    return obj
