"""Megatron-Core's distributed checkpoint (``--ckpt-format torch_dist``): a DCP directory
(:mod:`.dcp`) with two files of Megatron's own beside it::

    DIR/metadata.json   {"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                         "common_backend": "torch", "common_backend_version": 1}
                        (megatron/core/dist_checkpointing/core.py ``save_config``)
    DIR/common.pt       rank 0's ``torch.save`` of the state that is not sharded: iteration,
                        args (an ``argparse.Namespace``), checkpoint_version, the scheduler
                        (strategies/common.py ``save_common``)

``dist_checkpointing.load`` (serialization.py) starts from ``common.pt``'s dict and merges the
loaded sharded state into it with ``dict_utils.merge``: dicts key by key, lists of equal
length item by item, and any other value present on both sides is an error. The sharded
state is the DCP directory's tree under its ShardedTensor keys (what
``load_plain_tensors`` loads without a model to name them). A run's directory opens as the
save its ``latest_checkpointed_iteration.txt`` names.
"""

from __future__ import annotations

import json
import os
from typing import Any

from torchless.errors import FormatError, type_phrase

__all__ = ["COMMON_NAME", "CONFIG_NAME", "TRACKER", "config", "merge", "reads_common",
           "tracked_dir", "tracked_dist_dir"]

COMMON_NAME = "common.pt"
CONFIG_NAME = "metadata.json"
#: The file in a run's checkpoint directory naming its last save (training/checkpointing.py
#: ``get_checkpoint_tracker_filename``): an iteration, or "release".
TRACKER = "latest_checkpointed_iteration.txt"
#: Largest metadata.json read (Megatron writes four short fields).
_MAX_CONFIG_BYTES = 1 << 16


def config(path: str) -> dict[str, Any] | None:
    """The directory's Megatron checkpointing config (``metadata.json`` naming a
    ``sharded_backend``), or None when it has none (a plain DCP directory)."""
    full = os.path.join(path, CONFIG_NAME)
    try:
        if not os.path.isfile(full) or os.path.getsize(full) > _MAX_CONFIG_BYTES:
            return None
        with open(full, "rb") as f:
            value = json.loads(f.read(_MAX_CONFIG_BYTES))
    except (OSError, ValueError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("sharded_backend"), str):
        return None
    return value


def tracked_dir(path: str) -> str | None:
    """The save the tracker file of the run directory ``path`` names (``iter_0000010`` for
    "10", ``release``), when it is a directory; None otherwise."""
    tracker = os.path.join(path, TRACKER)
    try:
        with open(tracker, "rb") as f:
            text = f.read(64).decode("ascii", "replace").strip()
    except OSError:
        return None
    name = "release" if text == "release" else (
        f"iter_{int(text):07d}" if text.isdigit() and len(text) <= 12 else None)
    inner = os.path.join(path, name) if name is not None else None
    return inner if inner is not None and os.path.isdir(inner) else None


def tracked_dist_dir(path: str) -> str | None:
    """The ``torch_dist`` save (a DCP directory with Megatron's config) the tracker file of
    ``path`` names, or None."""
    inner = tracked_dir(path)
    if inner is None or config(inner) is None:
        return None
    return inner if os.path.isfile(os.path.join(inner, ".metadata")) else None


def reads_common(cfg: dict[str, Any] | None) -> bool:
    """Whether Megatron's loader reads ``common.pt`` of a directory with this config (its
    only common backend is ``torch``: ``torch.load`` of the file)."""
    return cfg is not None and cfg.get("common_backend", "torch") == "torch"


def merge(x1: Any, x2: Any, key: tuple[Any, ...] = ()) -> Any:
    """``megatron.core.dist_checkpointing.dict_utils.merge``: ``x2`` merged into ``x1``."""
    if isinstance(x1, dict) and isinstance(x2, dict):
        for k, v2 in x2.items():
            x1[k] = v2 if k not in x1 else merge(x1[k], v2, (*key, k))
        return x1
    if isinstance(x1, list) and isinstance(x2, list):
        if len(x1) != len(x2):
            raise FormatError(f"{COMMON_NAME} and the sharded state both hold a list at "
                              f"{list(key)!r:.100}, of lengths {len(x1)} and {len(x2)} "
                              "(Megatron's loader cannot merge them)", member=COMMON_NAME)
        for i, v2 in enumerate(x2):
            x1[i] = merge(x1[i], v2, (*key, i))
        return x1
    raise FormatError(f"{COMMON_NAME} and the sharded state both hold a value at "
                      f"{list(key)!r:.100} ({type_phrase(x1)} and {type_phrase(x2)}): "
                      "Megatron's loader refuses such a checkpoint", member=COMMON_NAME)
