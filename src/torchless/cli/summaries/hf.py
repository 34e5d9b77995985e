"""Hugging Face transformers: a ``PreTrainedModel`` saved whole (``torch.save(model)``: a
module whose ``config`` attribute is a ``PretrainedConfig`` with ``model_type`` and
``architectures``), and a Trainer's checkpoint directory (``Trainer._save_checkpoint``:
``trainer_state.json`` with ``global_step``, ``epoch``, ``best_metric`` and the log
history; ``config.json`` with the architecture) beside the file."""

from __future__ import annotations

import os
from typing import Any

from torchless.cli.summaries.seen import Found, Seen
from torchless.cli.summaries.text import fields, module, pairs
from torchless.core import jsondepth
from torchless.core.limits import Limits
from torchless.pickle.values import Opaque

__all__ = ["MAX_TRAINER_STATE", "directory", "summary", "trainer_state"]

#: trainer_state.json keeps the whole log history; past this it is not read.
MAX_TRAINER_STATE = 16 << 20

_CONFIG = ("architectures", "model_type", "hidden_size", "num_hidden_layers", "vocab_size",
           "torch_dtype", "transformers_version")


def _config(obj: Any) -> dict[str, Any] | None:
    found = fields(obj) if isinstance(obj, Opaque) else None
    if found is None or not ("model_type" in found or "architectures" in found):
        return None
    return {k: found[k] for k in _CONFIG if k in found}


def summary(seen: Seen) -> list[Found]:
    """A whole-model pickle: the module's class and its config's architecture."""
    tree = module(seen.tree)
    attrs = fields(tree) if tree is not None else None
    config = _config((attrs or {}).get("config"))
    if config is None or tree is None:
        return []
    what = attrs["config"] if attrs else None
    kind = f" <{what.class_path}>" if isinstance(what, Opaque) else ""
    return [("hf", f"HF model <{tree.class_path}>: config{kind} {pairs(config)}")]


def _read_json(path: str, name: str) -> tuple[Any, str | None]:
    """(document, None), or (None, why it is not summarised); (None, None) when absent."""
    if not isinstance(path, str) or not path or "://" in path:
        return None, None
    where = os.path.join(os.path.dirname(os.path.abspath(path)), name)
    try:
        with open(where, "rb") as f:
            raw = f.read(MAX_TRAINER_STATE + 1)
    except OSError:
        return None, None
    if len(raw) > MAX_TRAINER_STATE:
        return None, f"{name} beside it (too large to summarise)"
    try:
        return jsondepth.loads(raw.decode("utf-8"), max_depth=Limits.max_depth, what=name), None
    except (UnicodeDecodeError, ValueError):
        return None, f"{name} beside it (not valid JSON)"


def trainer_state(path: str) -> str | None:
    """One line from an HF Trainer's ``trainer_state.json`` beside ``path``, if any."""
    doc, why = _read_json(path, "trainer_state.json")
    if why is not None or not isinstance(doc, dict):
        return why
    keep = {k: doc[k] for k in ("global_step", "epoch", "max_steps", "best_metric",
                                "best_model_checkpoint") if k in doc}
    logs = doc.get("log_history")
    line = f"HF Trainer state (trainer_state.json): {pairs(keep)}"
    if isinstance(logs, list):
        line += f"; {len(logs)} log entries"
        last = logs[-1] if logs and isinstance(logs[-1], dict) else None
        if last:
            line += f", last: {pairs(last, 4)}"
    return line


def directory(seen: Seen) -> list[Found]:
    """A Trainer checkpoint directory: its state and, beside it, the model's config."""
    line = trainer_state(seen.path)
    if line is None:
        return []
    out = [("trainer_state", line)]
    doc, why = _read_json(seen.path, "config.json")
    if isinstance(doc, dict) and ("model_type" in doc or "architectures" in doc):
        out.append(("trainer_state", "HF config (config.json): " + pairs(
            {k: doc[k] for k in _CONFIG if k in doc})))
    elif why is not None:
        out.append(("trainer_state", why))
    return out
