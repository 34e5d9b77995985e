"""What any training loop saves, whichever library wrote it: Lightning's keys, a progress
line (epoch, step), the configs under the usual keys, the fields of a record saved alone
(``training_args.bin``), optimizer and scheduler state dicts wherever they are, callbacks and
RNG states."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torchless.cli.summaries.seen import Found, Seen
from torchless.cli.summaries.text import compact, fields, pairs
from torchless.model.tensor import Tensor
from torchless.model.walk import entry_name
from torchless.pickle.values import Opaque

__all__ = ["callbacks", "configs", "lightning", "optimizers", "progress", "progress_of",
           "record", "rng"]

#: The keys training loops keep their configuration under.
CONFIG_KEYS = ("hyper_parameters", "hparams", "args", "config", "training_args")


def lightning(seen: Seen) -> list[Found]:
    """Lightning's ``dump_checkpoint``: a ``pytorch-lightning_version`` (or
    ``lightning_version``) key, or ``optimizer_states`` beside ``state_dict``."""
    top = seen.top
    version = top.get("pytorch-lightning_version") or top.get("lightning_version")
    if version is None and not ("optimizer_states" in top and "state_dict" in top):
        return []
    return [("lightning", f"Lightning checkpoint (lightning {version}): epoch "
             f"{top.get('epoch')}, global_step {top.get('global_step')}")]


def progress_of(top: dict[Any, Any]) -> dict[str, Any]:
    """``epoch``, ``global_step``, ``step`` at the top of a checkpoint."""
    return {k: top[k] for k in ("epoch", "global_step", "step") if k in top}


def progress(seen: Seen) -> list[Found]:
    """The progress line, when no library said more."""
    keep = progress_of(seen.top)
    return [("progress", "training progress: " + pairs(keep))] if keep else []


def record(seen: Seen) -> list[Found]:
    """The fields of a record saved alone (``training_args.bin`` and the like)."""
    tree = seen.tree
    found = fields(tree) if isinstance(tree, Opaque) else None
    if not found or not isinstance(tree, Opaque):
        return []
    return [("object", f"<{tree.class_path}>: {pairs(found)}")]


def configs(seen: Seen) -> list[Found]:
    out: list[Found] = []
    for key in CONFIG_KEYS:
        found = fields(seen.top.get(key))
        if found:
            what = seen.top[key]
            kind = (f" <{what.class_path}>" if isinstance(what, Opaque)
                    else f" ({type(what).__name__})" if not isinstance(what, dict) else "")
            out.append(("config", f"{key}{kind}: {pairs(found)}"))
    return out


def _optimizer(name: str, sd: dict[Any, Any]) -> str:
    groups = sd.get("param_groups")
    state = sd.get("state")
    parts = []
    if isinstance(groups, list):
        n = sum(len(p) for g in groups if isinstance(g, dict)
                for p in [g.get("params", ())] if isinstance(p, (list, tuple)))
        parts.append(f"{n} params in {len(groups)} group{'s' * (len(groups) != 1)}")
        if groups and isinstance(groups[0], dict):
            first = {k: v for k, v in groups[0].items() if k in (
                "lr", "betas", "momentum", "eps", "weight_decay", "initial_lr")}
            if first:
                parts.append(pairs(first))
    if isinstance(state, dict) and state:
        keys: set[str] = set()
        for s in state.values():
            if isinstance(s, dict):
                keys.update(str(k) for k in s)
        parts.append(f"state for {len(state)} params ({', '.join(sorted(keys))})")
    return f"optimizer ({name}): " + "; ".join(parts)


def _scheduler(name: str, sd: dict[Any, Any]) -> str:
    keep = {k: v for k, v in sd.items() if k in (
        "last_epoch", "_last_lr", "base_lrs", "step_size", "gamma", "T_max", "_step_count")}
    return f"scheduler ({name}): {pairs(keep)}"


def _is_rng(name: str, v: Any) -> bool:
    if isinstance(v, Tensor):  # torch.get_rng_state(): a uint8 tensor
        return v.dtype.name == "uint8" and name.rsplit(".", 1)[-1] in (
            "cpu", "torch", "rng_state", "cpu_rng_state")
    text = compact(v)
    return text is not None and "state" in text


def _is_optimizer(v: Any) -> bool:
    return isinstance(v, dict) and "param_groups" in v and "state" in v


def _is_scheduler(v: Any) -> bool:
    return isinstance(v, dict) and "last_epoch" in v and ("base_lrs" in v or "_last_lr" in v)


def found(tree: Any, depth: int = 3, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(name, value) for dict entries down to ``depth`` levels (lists of dicts included),
    each named as ``.tensors`` names the place (:func:`~torchless.model.walk.entry_name`)."""
    items: list[tuple[str, Any]] = []
    if isinstance(tree, dict):
        items = [(entry_name(i, k), v) for i, (k, v) in enumerate(tree.items())]
    elif isinstance(tree, (list, tuple)) and len(tree) <= 64:
        items = [(str(i), v) for i, v in enumerate(tree)]
    for k, v in items:
        name = f"{prefix}.{k}" if prefix else k
        yield name, v
        if depth > 1 and not _is_optimizer(v) and not _is_scheduler(v):
            yield from found(v, depth - 1, name)


def optimizers(seen: Seen) -> list[Found]:
    """Each optimizer and scheduler state dict down to three levels, by its place."""
    out: list[Found] = []
    for name, v in found(seen.tree):
        if _is_optimizer(v):
            out.append(("optimizer", _optimizer(name, v)))
        elif _is_scheduler(v):
            out.append(("scheduler", _scheduler(name, v)))
    return out


def callbacks(seen: Seen) -> list[Found]:
    states = seen.top.get("callbacks")
    if not isinstance(states, dict) or not states:
        return []
    names = [str(k).split("{", 1)[0] for k in states]
    return [("callbacks", f"callbacks: {', '.join(names)}")]


def rng(seen: Seen) -> list[Found]:
    names = [name for name, v in found(seen.tree, 2) if _is_rng(name, v)]
    return [("rng", f"RNG states: {', '.join(names)}")] if names else []
