"""A torchmetrics metric saved whole names its states as ``Metric.state_dict`` does.

torchmetrics keeps a metric's states as plain attributes and adds them in its ``state_dict``
override, after ``nn.Module.state_dict`` (parameters, buffers, children): each key of
``_defaults`` whose ``_persistent[key]`` is true. The classes here have torchmetrics' layout
and that override, copied from its source (``torchmetrics/metric.py``), so torch's
``state_dict()`` of the live objects is the oracle; they are pickled under a
``torchmetrics.`` module name (the legacy format: a plain pickle stream, renamed in place).
"""

from __future__ import annotations

import sys
import types
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import torchless

_FAKE = "tl_fake_tm"


def _classes(torch: ModuleType) -> tuple[type, type]:
    class Metric(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self._defaults: dict[str, Any] = {}
            self._persistent: dict[str, bool] = {}

        def add_state(self, name: str, value: Any, persistent: bool) -> None:
            setattr(self, name, value)
            self._defaults[name] = value
            self._persistent[name] = persistent

        def state_dict(
            self, destination: Any = None, prefix: str = "", keep_vars: bool = False
        ) -> Any:
            destination = super().state_dict(
                destination=destination, prefix=prefix, keep_vars=keep_vars
            )
            for key in self._defaults:  # torchmetrics' Metric.state_dict
                if not self._persistent[key]:
                    continue
                destination[prefix + key] = getattr(self, key)
            return destination

    class Collection(torch.nn.ModuleDict):  # type: ignore[misc]
        pass

    for cls in (Metric, Collection):
        cls.__module__ = _FAKE
        cls.__qualname__ = cls.__name__
    return Metric, Collection


def _flat(state: dict[str, Any]) -> list[str]:
    names = []
    for key, value in state.items():
        if isinstance(value, list):
            names += [f"{key}.{i}" for i in range(len(value))]
        else:
            names.append(key)
    return names


@pytest.mark.torch
def test_metric_states_follow_the_module_entries(torch: ModuleType, tmp_path: Path) -> None:
    Metric, Collection = _classes(torch)
    module = types.ModuleType(_FAKE)
    module.Metric, module.Collection = Metric, Collection  # type: ignore[attr-defined]
    sys.modules[_FAKE] = module
    try:
        inner = Metric()
        inner.add_state("tp", torch.zeros(3), True)
        inner.add_state("fp", torch.ones(3), False)  # not persistent: not in state_dict
        inner.add_state("preds", [torch.ones(2), torch.zeros(4)], True)
        inner.register_buffer("scale", torch.ones(1))
        inner.lin = torch.nn.Linear(2, 2)
        outer = Metric()
        outer.add_state("total", torch.tensor(5.0), True)
        outer.child = inner
        root = Collection({"acc": outer, "other": Metric()})
        expected = _flat(root.state_dict())
        path = tmp_path / "metric.pt"
        with warnings.catch_warnings():  # the legacy format asks for the classes' source
            warnings.simplefilter("ignore")
            torch.save(root, path, _use_new_zipfile_serialization=False)
    finally:
        del sys.modules[_FAKE]
    data = path.read_bytes()
    assert data.count(_FAKE.encode()) >= 2
    path.write_bytes(data.replace(f"{_FAKE}\n".encode(), b"torchmetrics.fake\n"))
    assert expected == [
        "acc.child.scale",
        "acc.child.lin.weight",
        "acc.child.lin.bias",
        "acc.child.tp",
        "acc.child.preds.0",
        "acc.child.preds.1",
        "acc.total",
    ]
    assert list(torchless.open(path).tensors) == expected


@pytest.mark.torch
def test_other_libraries_layout_adds_nothing(torch: ModuleType, tmp_path: Path) -> None:
    """The same layout in a class outside torchmetrics is an ordinary module."""
    Metric, _ = _classes(torch)
    module = types.ModuleType(_FAKE)
    module.Metric = Metric  # type: ignore[attr-defined]
    sys.modules[_FAKE] = module
    try:
        m = Metric()
        m.add_state("tp", torch.zeros(3), True)
        path = tmp_path / "other.pt"
        torch.save(m, path)
        expected = list(torch.nn.Module.state_dict(m))
    finally:
        del sys.modules[_FAKE]
    assert list(torchless.open(path).tensors) == expected == []
