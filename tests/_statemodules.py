"""Modules whose classes pickle a state of their own, for the differential tests (imported
inside a test, after the ``torch`` fixture: it imports torch at top level)."""

from __future__ import annotations

from typing import Any

import torch


class Packed(torch.nn.Module):
    """A module whose ``__getstate__`` is a tuple (as torch's quantized convolutions)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.arange(3.0))

    def __getstate__(self) -> Any:
        return (self.__dict__,)

    def __setstate__(self, state: Any) -> None:
        self.__dict__.update(state[0])
