"""Ultralytics (YOLO) training checkpoints, as ``BaseTrainer.save_model``
(``ultralytics/engine/trainer.py``) writes them: ``epoch``, ``best_fitness``, ``model`` and
``ema`` (the whole module, a ``DetectionModel`` … with ``yaml``, ``names``, ``nc``,
``args``), ``updates``, ``optimizer``, ``train_args`` (``vars(args)``), ``train_metrics``,
``date``, ``version``. ``strip_optimizer`` sets ``epoch`` to -1 (a final ``best.pt``) and
moves ``ema`` to ``model``."""

from __future__ import annotations

from typing import Any

from torchless.cli.summaries.seen import Found, Seen
from torchless.cli.summaries.text import fields, fmt, module, pairs
from torchless.pickle.values import Opaque

__all__ = ["summary"]

#: ultralytics/nn/tasks.py: the model class of each task.
_TASKS = {"DetectionModel": "detect", "SegmentationModel": "segment", "PoseModel": "pose",
          "ClassificationModel": "classify", "OBBModel": "obb", "RTDETRDetectionModel": "detect",
          "WorldModel": "detect", "YOLOEModel": "detect"}

#: The train args worth a line of their own (ultralytics/cfg/default.yaml).
_ARGS = ("task", "mode", "model", "data", "epochs", "batch", "imgsz", "optimizer", "lr0")


def _model(top: dict[Any, Any]) -> Any:
    for key in ("model", "ema"):
        if top.get(key) is not None:
            return top[key]
    return None


def summary(seen: Seen) -> list[Found]:
    top = seen.top
    if not ("train_args" in top or ("best_fitness" in top and "ema" in top)):
        return []
    model = module(_model(top))
    attrs = (fields(model) if model is not None else None) or {}
    args = fields(top.get("train_args")) or fields(attrs.get("args")) or {}
    yaml = fields(attrs.get("yaml")) or {}
    names = attrs.get("names")
    cls = model.class_path.rsplit(".", 1)[-1] if isinstance(model, Opaque) else None
    task = args.get("task") or (_TASKS.get(cls) if cls else None)
    nc = attrs.get("nc", yaml.get("nc"))
    if nc is None and isinstance(names, (dict, list)):
        nc = len(names)
    head = {"task": task, "nc": nc, "epoch": top.get("epoch"),
            "best_fitness": top.get("best_fitness"), "imgsz": args.get("imgsz")}
    line = f"Ultralytics checkpoint (ultralytics {top.get('version')}): " + pairs(
        {k: v for k, v in head.items() if v is not None})
    out = [("ultralytics", line)]
    model_yaml = yaml.get("yaml_file") or args.get("model")
    if model_yaml is not None or cls is not None:
        what = [f"<{model.class_path}>"] if isinstance(model, Opaque) else []
        if model_yaml is not None:
            what.append(f"yaml {fmt(model_yaml, 60)}")
        out.append(("ultralytics", "model: " + ", ".join(what)))
    if isinstance(names, (dict, list)) and names:
        items = names.items() if isinstance(names, dict) else enumerate(names)
        shown = {str(k): v for k, v in items}
        out.append(("ultralytics", f"names: {pairs(shown, 10)}"))
    if args:
        out.append(("ultralytics", "train_args: " + pairs(
            {k: args[k] for k in _ARGS if k in args})))
    return out
