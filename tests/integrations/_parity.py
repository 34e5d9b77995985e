"""The resume-parity check the integration tests share: two states (weights, optimizer,
scheduler, RNG …) equal to the bit, tensors by dtype and value, containers by structure."""

from __future__ import annotations

from typing import Any


def assert_same(a: Any, b: Any) -> None:
    import torch

    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b
