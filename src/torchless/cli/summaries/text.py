"""How summaries write values: one short line for a value (a tensor by dtype and shape, a
record by class, a long string clipped), ``k=v`` pairs, the fields of a dict, Namespace or
record, and the compact form of bulk values that would otherwise print as hundreds of lines
(an RNG state is one line)."""

from __future__ import annotations

import argparse
import types
from typing import Any

from torchless.core.ndarrays import is_ndarray
from torchless.model.graph import ModuleDict
from torchless.model.tensor import Tensor
from torchless.pickle.values import Opaque

__all__ = ["clipped_repr", "compact", "fields", "fmt", "module", "pairs"]


def module(v: Any) -> Opaque | None:
    """The record of a module saved whole: ``v`` itself, or the one a state dict was read
    from (:class:`~torchless.model.graph.ModuleDict`); None for anything else."""
    if isinstance(v, ModuleDict):
        return v.record
    return v if isinstance(v, Opaque) else None


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


def fmt(v: Any, width: int = 40) -> str:
    """``v`` in at most about ``width`` characters."""
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


def fields(obj: Any) -> dict[str, Any] | None:
    """The named fields of a dict, Namespace or an Opaque record's state (a module's
    attributes, also of one read as its state dict), else None."""
    if isinstance(obj, ModuleDict) and obj.record is not None:
        obj = obj.record
    if isinstance(obj, dict):
        return {str(k): v for k, v in obj.items()}
    if isinstance(obj, (argparse.Namespace, types.SimpleNamespace)):
        return dict(vars(obj))
    if isinstance(obj, Opaque) and isinstance(obj.state, dict):
        return {str(k): v for k, v in obj.state.items()}
    return None


def pairs(values: dict[str, Any], limit: int = 8) -> str:
    """``k=v, …`` of the first ``limit`` entries, then how many more."""
    shown = [f"{k}={fmt(v, 30)}" for k, v in list(values.items())[:limit]]
    more = len(values) - limit
    return ", ".join(shown) + (f", … {more} more" if more > 0 else "")
