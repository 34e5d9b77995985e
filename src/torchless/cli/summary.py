"""What ``inspect`` says first: the known structures of a training checkpoint, found by their
shape (Lightning's keys, optimizer and scheduler state dicts, RNG states, an HF Trainer's
``trainer_state.json`` beside the file), each as one readable line; and the compact form of
values that would otherwise print as hundreds of lines (an RNG state is one line)."""

from __future__ import annotations

import argparse
import os
import types
from collections.abc import Iterator
from typing import Any

from torchless.core import jsondepth
from torchless.core.limits import Limits
from torchless.core.ndarrays import is_ndarray
from torchless.model.tensor import Tensor
from torchless.model.walk import entry_name
from torchless.pickle.values import Opaque

__all__ = ["as_json", "clipped_repr", "compact", "structures", "trainer_state"]

#: trainer_state.json keeps the whole log history; past this it is not read.
MAX_TRAINER_STATE = 16 << 20


def compact(value: Any) -> str | None:
    """A one-line description of a value that is a known bulk record, else None."""
    if isinstance(value, tuple) and len(value) == 5 and isinstance(value[0], str) and value[
            0] == "MT19937" and is_ndarray(value[1]) and value[1].size == 624:
        return "numpy MT19937 state (625 ints)"
    if isinstance(value, dict) and isinstance(value.get("bit_generator"), str) and isinstance(
            value.get("state"), dict):
        return f"numpy {value['bit_generator']} bit generator state"
    if isinstance(value, tuple) and len(value) == 3 and type(value[0]) is int and value[
            0] in (2, 3) and isinstance(
            value[1], tuple) and len(value[1]) == 625 and all(type(x) is int for x in value[1]):
        return "python random state (625 ints)"
    if isinstance(value, (list, tuple)) and len(value) > 16 and all(
            type(x) in (int, float, bool) for x in value):
        kinds = sorted({type(x).__name__ for x in value})
        return f"{type(value).__name__} of {len(value)} {'/'.join(kinds)}s"
    return None


def _fmt(v: Any, width: int = 40) -> str:
    if isinstance(v, Tensor):
        return f"tensor {v.dtype.name} {'x'.join(map(str, v.shape)) or 'scalar'}"
    if isinstance(v, Opaque):
        return f"<{v.class_path}>"
    if type(v) is float:
        return format(v, ".6g")
    text = compact(v) or clipped_repr(v, width)
    return text if len(text) <= width else text[:width - 3] + "..."


def clipped_repr(v: Any, width: int) -> str:
    """repr of ``v``, of at most about ``width`` characters of a long str or bytes value
    (never the repr of a megabyte to print forty characters of it)."""
    if isinstance(v, (str, bytes, bytearray)) and len(v) > width:
        return repr(v[:width]) + "..."
    return repr(v)


def _fields(obj: Any) -> dict[str, Any] | None:
    """The named fields of a dict, Namespace or an Opaque record's state."""
    if isinstance(obj, dict):
        return {str(k): v for k, v in obj.items()}
    if isinstance(obj, (argparse.Namespace, types.SimpleNamespace)):
        return dict(vars(obj))
    if isinstance(obj, Opaque) and isinstance(obj.state, dict):
        return {str(k): v for k, v in obj.state.items()}
    return None


def _pairs(fields: dict[str, Any], limit: int = 8) -> str:
    shown = [f"{k}={_fmt(v, 30)}" for k, v in list(fields.items())[:limit]]
    more = len(fields) - limit
    return ", ".join(shown) + (f", … {more} more" if more > 0 else "")


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
                parts.append(_pairs(first))
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
    return f"scheduler ({name}): {_pairs(keep)}"


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


def _found(tree: Any, depth: int = 3, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(name, value) for dict entries down to ``depth`` levels (lists of dicts included)."""
    items: list[tuple[str, Any]] = []
    if isinstance(tree, dict):
        items = [(entry_name(i, k), v) for i, (k, v) in enumerate(tree.items())]
    elif isinstance(tree, (list, tuple)) and len(tree) <= 64:
        items = [(str(i), v) for i, v in enumerate(tree)]
    for k, v in items:
        name = f"{prefix}.{k}" if prefix else k
        yield name, v
        if depth > 1 and not _is_optimizer(v) and not _is_scheduler(v):
            yield from _found(v, depth - 1, name)


def structures(tree: Any, path: str) -> list[tuple[str, str]]:
    """(label, one line) for each known structure in ``tree`` (and ``path``'s directory)."""
    out: list[tuple[str, str]] = []
    top = tree if isinstance(tree, dict) else {}
    version = top.get("pytorch-lightning_version") or top.get("lightning_version")
    if version is not None or ("optimizer_states" in top and "state_dict" in top):
        out.append(("lightning", f"Lightning checkpoint (lightning {version}): epoch "
                    f"{top.get('epoch')}, global_step {top.get('global_step')}"))
    elif "epoch" in top or "global_step" in top or "step" in top:
        out.append(("progress", "training progress: " + _pairs(
            {k: top[k] for k in ("epoch", "global_step", "step") if k in top})))
    if isinstance(tree, Opaque) and _fields(tree):  # training_args.bin and the like
        out.append(("object", f"<{tree.class_path}>: {_pairs(_fields(tree) or {})}"))
    for key in ("hyper_parameters", "hparams", "args", "config", "training_args"):
        fields = _fields(top.get(key))
        if fields:
            what = top[key]
            kind = (f" <{what.class_path}>" if isinstance(what, Opaque)
                    else f" ({type(what).__name__})" if not isinstance(what, dict) else "")
            out.append(("config", f"{key}{kind}: {_pairs(fields)}"))
    for name, v in _found(tree):
        if _is_optimizer(v):
            out.append(("optimizer", _optimizer(name, v)))
        elif _is_scheduler(v):
            out.append(("scheduler", _scheduler(name, v)))
    callbacks = top.get("callbacks")
    if isinstance(callbacks, dict) and callbacks:
        names = [str(k).split("{", 1)[0] for k in callbacks]
        out.append(("callbacks", f"callbacks: {', '.join(names)}"))
    rng = [name for name, v in _found(tree, 2) if _is_rng(name, v)]
    if rng:
        out.append(("rng", f"RNG states: {', '.join(rng)}"))
    ts = trainer_state(path)
    if ts is not None:
        out.append(("trainer_state", ts))
    return out


def trainer_state(path: str) -> str | None:
    """One line from an HF Trainer's ``trainer_state.json`` beside ``path``, if any."""
    if not isinstance(path, str) or "://" in path:
        return None
    where = os.path.join(os.path.dirname(os.path.abspath(path)), "trainer_state.json")
    try:
        with open(where, "rb") as f:
            raw = f.read(MAX_TRAINER_STATE + 1)
    except OSError:
        return None
    if len(raw) > MAX_TRAINER_STATE:
        return "trainer_state.json beside it (too large to summarise)"
    try:
        doc = jsondepth.loads(raw.decode("utf-8"), max_depth=Limits.max_depth,
                              what="trainer_state.json")
    except (UnicodeDecodeError, ValueError):
        return "trainer_state.json beside it (not valid JSON)"
    if not isinstance(doc, dict):
        return None
    keep = {k: doc[k] for k in ("global_step", "epoch", "max_steps", "best_metric",
                                "best_model_checkpoint") if k in doc}
    logs = doc.get("log_history")
    line = f"HF Trainer state (trainer_state.json): {_pairs(keep)}"
    if isinstance(logs, list):
        line += f"; {len(logs)} log entries"
        last = logs[-1] if logs and isinstance(logs[-1], dict) else None
        if last:
            line += f", last: {_pairs(last, 4)}"
    return line


def as_json(found: list[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"kind": k, "text": t} for k, t in found]

