"""torch's quantized modules saved whole: the ``state_dict()`` entries that their own
``_save_to_state_dict`` adds from plain attributes.

Their weights are in no parameter or buffer: a quantized ``Linear`` keeps them in a packed
``torch.ScriptObject`` (pickled as its unpacked ``(weight, bias)``) and its ``scale`` and
``zero_point`` as Python numbers, which ``state_dict()`` turns into tensors. Reading such a
module as parameters, buffers and children alone would lose every weight, so these entries
are rebuilt from the pickled ``__dict__`` as torch computes them.
"""

from __future__ import annotations

import struct
from typing import Any

from torchless.core import dtypes as _dtypes
from torchless.model.tensor import Storage, Tensor
from torchless.pickle.values import Global, Opaque

__all__ = ["quantized_conv", "quantized_entries"]

#: Where torch keeps its quantized modules (``torch.nn.quantized`` before torch 1.10 moved
#: them under ``torch.ao``; the old path still pickles under its own name).
_ROOTS = ("torch.ao.nn.quantized.", "torch.nn.quantized.",
          "torch.ao.nn.intrinsic.quantized.", "torch.nn.intrinsic.quantized.")

#: Classes whose ``_save_to_state_dict`` adds ``dtype`` and ``_packed_params``.
_LINEAR_PACKED = {"modules.linear.LinearPackedParams"}

#: Classes whose ``_save_to_state_dict`` adds ``dtype`` and ``_packed_weight``.
_EMBEDDING_PACKED = {"modules.embedding_ops.EmbeddingPackedParams"}

#: Classes (quantized ``Linear`` and its subclasses) that add ``scale`` and ``zero_point``.
_QPARAMS = {
    "modules.linear.Linear", "dynamic.modules.linear.Linear",
    "modules.linear_relu.LinearReLU", "modules.linear_relu.LinearLeakyReLU",
    "modules.linear_relu.LinearTanh", "dynamic.modules.linear_relu.LinearReLU",
    "modules.functional_modules.QFunctional",
}

#: Dynamic RNN classes whose packed weights are attributes: the attribute names.
_PACKED_ATTRS = {
    "dynamic.modules.rnn.PackedParameter": ("param",),
    "dynamic.modules.rnn.RNNCell": ("_packed_weight_ih", "_packed_weight_hh"),
    "dynamic.modules.rnn.LSTMCell": ("_packed_weight_ih", "_packed_weight_hh"),
    "dynamic.modules.rnn.GRUCell": ("_packed_weight_ih", "_packed_weight_hh"),
    "dynamic.modules.rnn.RNNCellBase": ("_packed_weight_ih", "_packed_weight_hh"),
}


def _kind(obj: Opaque) -> str | None:
    cls = obj.callable
    if not isinstance(cls, Global) or not cls.module.startswith(_ROOTS):
        return None  # most modules: one test for all the roots
    for root in _ROOTS:
        if cls.module.startswith(root):
            return f"{cls.module[len(root):]}.{cls.name}"
    return None


def _scalar(value: Any, dtype_name: str, fmt: str, key: str) -> Tensor:
    """``torch.tensor(value)``: a 0-d tensor of its own bytes (not in the file)."""
    try:
        data = struct.pack(fmt, value)
    except OverflowError:  # a float beyond float32: torch rounds it to an infinity
        data = struct.pack(fmt, value * float("inf"))
    dtype = _dtypes.by_torch_name(dtype_name)
    assert dtype is not None
    return Tensor(Storage(key, dtype, len(data), lambda: data), dtype, (), (), 0)


def quantized_entries(obj: Opaque, state: dict[Any, Any]) -> list[tuple[str, Any]]:
    """The entries ``obj``'s own ``_save_to_state_dict`` adds after its parameters and
    buffers, or none when it is not one of torch's quantized modules (or its attributes
    are not what torch pickles)."""
    kind = _kind(obj)
    if kind is None:
        return []
    if kind in _LINEAR_PACKED:
        packed = state.get("_packed_params")
        if isinstance(packed, Opaque) and isinstance(packed.state, tuple) \
                and len(packed.state) == 2 and isinstance(packed.state[0], tuple):
            return [("dtype", state.get("dtype")), ("_packed_params", packed.state[0])]
        return []
    if kind in _EMBEDDING_PACKED:
        # the ScriptObject's state: (version, [weight], [doubles], [longs])
        packed = state.get("_packed_weight")
        inner = packed.state[0] if isinstance(packed, Opaque) and isinstance(
            packed.state, tuple) and len(packed.state) == 2 else None
        if isinstance(inner, tuple) and len(inner) == 4 and isinstance(inner[1], list) \
                and len(inner[1]) == 1:
            return [("dtype", state.get("dtype")), ("_packed_weight", inner[1][0])]
        return []
    if kind in _QPARAMS:
        scale, zero_point = state.get("scale"), state.get("zero_point")
        if type(scale) is float and type(zero_point) is int \
                and -(1 << 63) <= zero_point < (1 << 63):
            where = f"<{obj.callable}>"
            return [("scale", _scalar(scale, "float32", "<f", f"{where}.scale")),
                    ("zero_point", _scalar(zero_point, "int64", "<q", f"{where}.zero_point"))]
        return []
    return [(name, state[name]) for name in _PACKED_ATTRS.get(kind, ()) if name in state]


def quantized_conv(obj: Opaque) -> list[tuple[str, Any]] | None:
    """The ``state_dict()`` entries of a quantized convolution (``Conv1d`` … ``ConvTranspose3d``
    and the fused ``ConvReLU``/``ConvAdd`` kinds), whose ``__getstate__`` pickles a tuple
    instead of its ``__dict__``: ``(in_channels, out_channels, kernel_size, stride, padding,
    dilation, transposed, output_padding, groups, padding_mode, weight, bias, scale,
    zero_point, training)``. None for anything else."""
    kind = _kind(obj)
    state = obj.state
    if kind is None or ".conv" not in f".{kind}" or not isinstance(state, tuple) \
            or len(state) != 15:
        return None
    weight, bias, scale, zero_point = state[10:14]
    if type(scale) is not float or type(zero_point) is not int \
            or not -(1 << 63) <= zero_point < (1 << 63):
        return None
    where = f"<{obj.callable}>"
    return [("weight", weight), ("bias", bias),
            ("scale", _scalar(scale, "float32", "<f", f"{where}.scale")),
            ("zero_point", _scalar(zero_point, "int64", "<q", f"{where}.zero_point"))]
