"""What ``inspect`` says first: the known structures of a checkpoint, each as a line or a
few, found by shape from data only (nothing is imported or called).

A library is one small module with a ``summary(seen) -> list[(kind, line)]`` function that
returns ``[]`` for a file that is not its own, and a line in :data:`LIBRARIES`. The library
lines come first; a training-progress line (``epoch``, ``step``) follows only when no
library said one; then what any training loop keeps (:data:`GENERAL`: configs, optimizers,
schedulers, callbacks, RNG states, a Trainer directory)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchless.cli.summaries import (
    dcp,
    deepspeed,
    hf,
    ldm,
    megatron,
    rvc,
    timm,
    training,
    ultralytics,
)
from torchless.cli.summaries.hf import trainer_state
from torchless.cli.summaries.seen import Found, Seen, Summary
from torchless.cli.summaries.text import clipped_repr, compact

__all__ = ["GENERAL", "LIBRARIES", "Found", "Seen", "Summary", "as_json", "clipped_repr",
           "compact", "structures", "trainer_state"]

#: One summary per library, in the order their lines are shown.
LIBRARIES: tuple[Summary, ...] = (
    ultralytics.summary, timm.summary, hf.summary, ldm.summary, rvc.summary,
    deepspeed.summary, dcp.summary, megatron.summary, training.lightning,
)

#: What any training checkpoint may hold, after the library lines.
GENERAL: tuple[Summary, ...] = (
    training.record, training.configs, training.optimizers, training.callbacks, training.rng,
    hf.directory,
)


def structures(tree: Any, path: str, info: Mapping[str, Any] | None = None,
               container: str = "") -> list[Found]:
    """(kind, one line) for each known structure in ``tree`` (and ``path``'s directory);
    ``info`` and ``container`` are the checkpoint's ``.info`` and ``.format``."""
    seen = Seen(tree, path, container, info if info is not None else {})
    out = [line for summary in LIBRARIES for line in summary(seen)]
    if not out:
        out = training.progress(seen)
    for summary in GENERAL:
        out.extend(summary(seen))
    return out


def as_json(found: list[Found]) -> list[dict[str, str]]:
    return [{"kind": k, "text": t} for k, t in found]
