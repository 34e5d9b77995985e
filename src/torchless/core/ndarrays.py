"""Whether a value is an ndarray, without importing NumPy.

NumPy (and ml_dtypes) cost more start-up than the rest of torchless together, and work that
never looks at a tensor's values (inspecting a file, copying its bytes into safetensors)
does not need them, so they are imported where values are made. An ndarray can only exist
once NumPy has been imported, so the check asks ``sys.modules`` and imports nothing.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import TypeGuard

    import numpy as np

__all__ = ["is_ndarray", "loaded_numpy"]


def loaded_numpy() -> Any:
    """The ``numpy`` module if something imported it, else None (no NumPy value exists)."""
    return sys.modules.get("numpy")


def is_ndarray(obj: object) -> TypeGuard[np.ndarray[Any, Any]]:
    """``isinstance(obj, numpy.ndarray)``, False while NumPy is not imported."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(obj, np.ndarray)
