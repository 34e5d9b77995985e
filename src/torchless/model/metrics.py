"""torchmetrics' ``Metric.state_dict``: the metric states a whole-metric save names.

A ``torchmetrics.Metric`` keeps its states (``tp``, ``preds`` …) as plain attributes, not
buffers, and overrides ``state_dict``: after ``nn.Module.state_dict`` (its parameters,
buffers and children, each child metric with its own states) it adds, for each key of
``self._defaults`` in order whose ``self._persistent[key]`` is true, ``prefix + key`` with
the attribute's value (a tensor, or a list of tensors). Read here from the metric's pickled
``__dict__``, without running its code.
"""

from __future__ import annotations

from typing import Any

from torchless.pickle.values import Global, Opaque

__all__ = ["metric_states"]


def metric_states(obj: Opaque, state: dict[Any, Any]) -> list[tuple[str, Any]]:
    """The entries torchmetrics' ``Metric.state_dict`` adds after the module's own, or none
    when ``obj`` is not a torchmetrics record (a class of a ``torchmetrics.`` module whose
    ``__dict__`` holds the ``_defaults`` and ``_persistent`` dicts)."""
    cls = obj.callable
    if not (isinstance(cls, Global) and cls.module.startswith("torchmetrics.")):
        return []
    defaults, persistent = state.get("_defaults"), state.get("_persistent")
    if not (isinstance(defaults, dict) and isinstance(persistent, dict)):
        return []
    return [
        (key, state[key])
        for key in defaults
        if type(key) is str and persistent.get(key) is True and key in state
    ]
