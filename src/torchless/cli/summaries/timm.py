"""timm training checkpoints, as ``CheckpointSaver._save``
(``timm/utils/checkpoint_saver.py``) writes them: ``epoch``, ``arch`` (``args.model``),
``state_dict``, ``optimizer``, ``version``, ``args``, the AMP scaler's state, and
``state_dict_ema`` when a model EMA is kept and ``metric`` when one was evaluated; and a timm
model saved whole, known by its ``pretrained_cfg`` attribute."""

from __future__ import annotations

from torchless.cli.summaries.seen import Found, Seen
from torchless.cli.summaries.text import fields, module, pairs

__all__ = ["summary"]


def summary(seen: Seen) -> list[Found]:
    top = seen.top
    if "arch" in top and "state_dict" in top and ("epoch" in top or "version" in top):
        emas = [k for k in top if isinstance(k, str) and k.startswith("state_dict_ema")]
        keep = {k: top[k] for k in ("arch", "epoch", "metric") if k in top}
        line = "timm checkpoint: " + pairs(keep)
        line += f"; EMA present ({', '.join(emas)})" if emas else "; no EMA"
        return [("timm", line)]
    record = module(seen.tree)
    attrs = fields(record) if record is not None else None
    cfg = fields((attrs or {}).get("pretrained_cfg"))
    if cfg is None or record is None:
        return []
    keep = {k: cfg[k] for k in ("architecture", "tag", "num_classes", "input_size")
            if k in cfg}
    return [("timm", f"timm model <{record.class_path}>: pretrained_cfg {pairs(keep)}")]
