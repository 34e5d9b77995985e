"""Lightning: a ``CheckpointIO`` plugin that saves inert checkpoints and reads them, or plain
torch ``.ckpt`` files, without running pickle code.

    trainer = Trainer(plugins=[InertCheckpointIO()])
    trainer.fit(model)                            # epoch=…-step=….ckpt files are inert
    trainer.fit(model, ckpt_path="last.ckpt")     # resumes from one (or from a torch .ckpt)

A saved checkpoint is a safetensors file (whatever its name says) holding every tensor, with
the rest of Lightning's dict (loops, optimizer and scheduler states, callbacks, hyper
parameters …) as an inert tree (``docs/inert-format.md``); loading gives torch tensors on
the CPU, moved to ``map_location`` when that is a device (Lightning then moves them where the
model is). Hyper parameters round-trip as themselves when they are plain values,
``Namespace``, OmegaConf configs (``save_hyperparameters(cfg)`` of a Hydra ``DictConfig``:
importing this module registers OmegaConf's types, when it is installed, with
:func:`torchless.integrations.configs.register_omegaconf`) or classes the program registered
(:func:`torchless.integrations.configs.register_dataclass`, :func:`torchless.register_type`;
or a registry of its own: ``InertCheckpointIO(types=registry)``). Those of other classes come
back as inert ``Opaque`` records.

Works with the ``lightning`` package (``lightning.pytorch.Trainer``) or, without it, the
standalone ``pytorch_lightning`` / ``lightning_fabric``.
"""

from __future__ import annotations

import os
from typing import Any

from torchless.inert import store as _store
from torchless.inert.schema import TypeRegistry
from torchless.integrations._files import torch_module
from torchless.integrations.configs import register_omegaconf
from torchless.reader import checkpoint as _checkpoint

try:
    from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
    from lightning.fabric.utilities.cloud_io import get_filesystem
except ImportError:  # the standalone packages
    from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO
    from lightning_fabric.utilities.cloud_io import get_filesystem

__all__ = ["InertCheckpointIO"]

register_omegaconf()


class InertCheckpointIO(CheckpointIO):  # type: ignore[misc]
    """Save Lightning checkpoints as inert safetensors files; load those or torch ``.ckpt``
    files through torchless (no pickle code runs).

    ``types``: the registry of the program's own classes to write and read (default: the one
    :func:`torchless.register_type` fills); OmegaConf's types are registered in it too."""

    def __init__(self, *, types: TypeRegistry | None = None) -> None:
        super().__init__()
        self.types = types
        if types is not None:
            register_omegaconf(types)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike[str],
                        storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError("InertCheckpointIO.save_checkpoint takes no storage_options")
        directory = os.path.dirname(os.fspath(path))
        if directory:
            os.makedirs(directory, exist_ok=True)
        _store.save(checkpoint, path, types=self.types)

    def load_checkpoint(self, path: str | os.PathLike[str], map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        if not os.path.exists(path):
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        checkpoint: dict[str, Any] = _checkpoint.load(path, framework="pt", types=self.types)
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
