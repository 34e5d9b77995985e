"""A model directory (what ``convert`` writes, what Hugging Face saves) as one model: the
weights a loader reads from it (an index with its shards, or one file), and the other
checkpoint files beside them, which ``inspect`` names rather than leaves out."""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["ModelDir", "is_checkpoint_dir", "model_dir"]

#: The weights a loader takes from a directory, in transformers' (and diffusers') order:
#: safetensors before pickles, a single file before an index of the same kind.
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json",
            "pytorch_model.bin", "pytorch_model.bin.index.json",
            "diffusion_pytorch_model.safetensors",
            "diffusion_pytorch_model.safetensors.index.json",
            "diffusion_pytorch_model.bin", "diffusion_pytorch_model.bin.index.json")
#: Files a directory listing names as "also here": other weights and checkpoints.
_CHECKPOINTS = (".safetensors", ".index.json", ".pt", ".pth", ".bin", ".ckpt", ".tar",
                ".pkl", ".pickle")


@dataclass(frozen=True)
class ModelDir:
    directory: str
    #: The index or weights file inspected as the model.
    weights: str
    #: The other checkpoint files of the directory (names), not shards of ``weights``.
    others: tuple[str, ...]


def is_checkpoint_dir(path: str) -> bool:
    """A directory that is one checkpoint (DCP), read like a file (without the conversion
    package: inspect loads the reader only)."""
    from torchless.containers import registry

    return os.path.isdir(path) and registry.sniff_directory(path) is not None


def model_dir(path: str) -> ModelDir | None:
    """The model in directory ``path``: the first of the known weight names there, else
    its only ``*.index.json``; None when it holds none (nor is one checkpoint, DCP)."""
    if not os.path.isdir(path) or is_checkpoint_dir(path):
        return None
    try:
        names = sorted(n for n in os.listdir(path) if not n.startswith("."))
    except OSError:
        return None
    files = [n for n in names if os.path.isfile(os.path.join(path, n))]
    weights = next((n for n in _WEIGHTS if n in files), None)
    if weights is None:
        indexes = [n for n in files if n.endswith((".safetensors.index.json",
                                                   ".bin.index.json"))]
        if len(indexes) != 1:
            return None
        weights = indexes[0]
    shards = _shards(os.path.join(path, weights))
    others = tuple(n for n in files if n.endswith(_CHECKPOINTS) and n != weights
                   and n not in shards)
    return ModelDir(path, os.path.join(path, weights), others)


def _shards(index: str) -> set[str]:
    """The shard names an index lists (none for a file that is no index or is unreadable:
    opening it reports that)."""
    if not index.endswith(".index.json"):
        return set()
    from torchless.core.limits import Limits
    from torchless.errors import CheckpointError
    from torchless.io.source import Source
    from torchless.reader.formats import read_index

    try:
        with Source(index) as source:
            return set(read_index(source, Limits())[0].values())
    except CheckpointError:
        return set()
