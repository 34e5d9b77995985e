"""Modules saved whole (``torch.save(model)``) with the plain attributes libraries keep on
them: ultralytics' ``names``, ``yaml``, ``nc`` and ``args`` on a ``DetectionModel``
(ultralytics/nn/tasks.py, set by ``BaseTrainer.set_model_attributes``), a tensor
``stride`` attribute on its head, timm's ``pretrained_cfg`` dict
(timm/models/_builder.py), an HF-like ``config`` object, an Enum; nested submodules, tied
parameters, a non-persistent buffer. (ultralytics, timm are not installed here: their
attribute shapes are mimicked.) Imported by torch.load(weights_only=False) in the tests."""

from __future__ import annotations

import argparse
import enum

import torch
from torch import nn


class Task(enum.Enum):
    DETECT = "detect"
    SEGMENT = "segment"


class Config:
    """An HF ``PretrainedConfig``'s shape: a plain object whose ``__dict__`` is the config."""

    def __init__(self) -> None:
        self.architectures = ["TinyForDetection"]
        self.model_type = "tiny"
        self.hidden_size = 4
        self.id2label = {0: "cat", 1: "dog"}


class Detect(nn.Module):
    def __init__(self, nc: int) -> None:
        super().__init__()
        self.nc = nc
        self.cv = nn.ModuleList([nn.Conv2d(3, nc, 1), nn.Conv2d(3, nc, 1)])
        self.register_buffer("anchors", torch.arange(6.0).reshape(2, 3))
        self.register_buffer("scratch", torch.ones(2), persistent=False)
        self.stride = torch.tensor([8.0, 16.0])  # a plain tensor attribute, not a buffer


class TinyDetector(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.yaml = {"nc": 2, "depth_multiple": 0.33,
                     "backbone": [[-1, 1, "Conv", [16, 3, 2]]], "yaml_file": "tiny.yaml"}
        self.model = nn.Sequential(nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3), Detect(2))
        self.embed = nn.Embedding(4, 3)
        self.out = nn.Linear(3, 4, bias=False)
        self.out.weight = self.embed.weight  # tied
        self.names = {0: "cat", 1: "dog"}
        self.nc = 2
        self.args = argparse.Namespace(task="detect", imgsz=640, lr0=0.01)
        self.task = Task.DETECT
        self.pretrained_cfg = {"architecture": "tiny", "input_size": (3, 32, 32),
                               "mean": (0.5, 0.5, 0.5), "num_classes": 2}
        self.config = Config()
        self.inplace = True
        self.note = None


def detector() -> TinyDetector:
    torch.manual_seed(0)
    model = TinyDetector()
    model.eval()
    return model
