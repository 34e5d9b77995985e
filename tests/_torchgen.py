"""Torch-side builders for tests/reader/test_differential_torch.py.

This module imports torch at top level, so it is imported only through the
``torch`` fixture (never at collection time): without torch the differential
tests skip instead of erroring. Model classes live here, at module level, so
that ``torch.save(model)`` can pickle them and ``torch.load`` can find them.
"""

from __future__ import annotations

import contextlib
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

#: Every dtype torch.save writes that torchless reads (name without "torch.").
DTYPE_NAMES: tuple[str, ...] = (
    "float64", "float32", "float16", "bfloat16",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "int64", "int32", "int16", "int8",
    "uint8", "uint16", "uint32", "uint64",
    "bool", "complex64", "complex128", "complex32",
)

#: Dtypes NumPy cannot hold natively: compared by value after widening.
_WIDEN_TO_FLOAT32 = {"bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                     "float8_e5m2fnuz"}


def dtype(name: str) -> torch.dtype:
    value = getattr(torch, name)
    assert isinstance(value, torch.dtype)
    return value


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """torch warns that complex32 is experimental; pytest turns warnings into errors."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="ComplexHalf support is experimental")
        yield


class Rand:
    """Random tensors of any dtype from random bytes (every bit pattern: NaN payloads too)."""

    def __init__(self, dt: torch.dtype, seed: int) -> None:
        self.dt = dt
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, *shape: int) -> torch.Tensor:
        n = 1
        for s in shape:
            n *= s
        with quiet():
            if self.dt == torch.bool:
                flat = torch.randint(0, 2, (n,), dtype=torch.uint8, generator=self.gen).bool()
            else:
                flat = torch.randint(0, 256, (n * self.dt.itemsize,), dtype=torch.uint8,
                                     generator=self.gen).view(self.dt)
            return flat.reshape(shape)


def views(name: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """One tensor of each view kind the brief lists (plus bases, so storages are shared)."""
    rnd = Rand(dtype(name), seed)
    with quiet():
        sliced_base = rnd(5, 6)
        step_base = rnd(4, 9)
        scalar_base = rnd(7)
        empty_base = rnd(6)
        out = {
            "contiguous": rnd(3, 4, 5),
            "transposed": rnd(4, 6).t(),
            "permuted": rnd(2, 3, 4).permute(2, 0, 1),
            "sliced_base": sliced_base,
            "sliced": sliced_base[1:, 2:],
            "step": rnd(11)[::2],
            "step_base": step_base,
            "step_2d": step_base[1:, 1::3],
            "expand": rnd(3, 1).expand(3, 4),
            "expand_scalar": rnd().expand(2, 3),
            "channels_last": rnd(2, 3, 4, 5).contiguous(memory_format=torch.channels_last),
            "scalar": rnd(),
            "scalar_base": scalar_base,
            "scalar_view": scalar_base[4],
            "empty": rnd(0, 3),
            "empty_base": empty_base,
            "empty_offset": empty_base[3:3],
            "size_one_dims": rnd(1, 5, 1),
        }
    return out


def save_bin_shards(root: Path, shards: list[dict[str, torch.Tensor]]) -> None:
    """``pytorch_model-0000K-of-0000N.bin`` shards and their index, as
    ``save_pretrained(safe_serialization=False)`` writes a sharded model into ``root``."""
    import json

    weight_map, total = {}, 0
    for k, sd in enumerate(shards):
        name = f"pytorch_model-{k + 1:05d}-of-{len(shards):05d}.bin"
        torch.save(sd, root / name)
        weight_map.update(dict.fromkeys(sd, name))
        total += sum(t.numel() * t.element_size() for t in sd.values())
    (root / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}))


def contiguous_bytes(t: torch.Tensor) -> bytes:
    """The tensor's values in C order, as raw bytes (torch's own copy kernel)."""
    if t.numel() == 0:
        return b""
    with quiet():
        # clone, not contiguous(): contiguous() keeps odd strides of size-1 dims
        flat = t.detach().clone(memory_format=torch.contiguous_format).reshape(-1)
        return bytes(flat.view(torch.uint8).numpy().tobytes())


def reference_values(t: torch.Tensor) -> Any:
    """The values as NumPy computes them, widened where NumPy lacks the type."""
    name = dtype_name(t.dtype)
    with quiet():
        t = t.detach()
        if name in _WIDEN_TO_FLOAT32:
            return t.float().numpy()
        if name == "complex32":
            return t.to(torch.complex64).numpy()
        return t.numpy()


def storage_id(t: torch.Tensor) -> int:
    return int(t.untyped_storage().data_ptr())


def storage_nbytes(t: torch.Tensor) -> int:
    return int(t.untyped_storage().nbytes())


# ---- archive variants ---------------------------------------------------------------------


@contextlib.contextmanager
def save_config(**values: Any) -> Iterator[None]:
    """Temporarily set torch.utils.serialization.config.save options."""
    from torch.utils.serialization import config

    old = {k: getattr(config.save, k) for k in values}
    try:
        for k, v in values.items():
            setattr(config.save, k, v)
        yield
    finally:
        for k, v in old.items():
            setattr(config.save, k, v)


def repack(src: Path, dst: Path, deflate: Callable[[str], bool]) -> None:
    """Copy a ZIP member by member (same order and names), deflating where asked."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            method = zipfile.ZIP_DEFLATED if deflate(info.filename) else zipfile.ZIP_STORED
            zout.writestr(info.filename, zin.read(info.filename), compress_type=method)


# ---- modules saved whole (torch.save(model)) ---------------------------------------------


class Block(nn.Module):
    """Parameters, a bias-less Linear (None parameter), persistent and non-persistent
    buffers, a None buffer and a BatchNorm with its running statistics."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.randn(width))
        self.proj = nn.Linear(width, width, bias=False)
        self.norm = nn.BatchNorm1d(width)
        self.register_buffer("persistent", torch.arange(width, dtype=torch.int64))
        self.register_buffer("scratch", torch.zeros(width), persistent=False)
        self.register_buffer("absent", None)
        self.register_parameter("no_param", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x) * self.scale)


class Net(nn.Module):
    """Nested custom modules, tied weights, a shared submodule, a None submodule,
    Parameter/Module containers and a half-precision buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.blocks = nn.ModuleList([Block(4), Block(4)])
        self.shared = self.blocks[0]
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied: the same Parameter twice
        self.extras = nn.ParameterList([nn.Parameter(torch.randn(2)),
                                        nn.Parameter(torch.randn(3), requires_grad=False)])
        self.table = nn.ParameterDict({"b": nn.Parameter(torch.randn(1)),
                                       "a": nn.Parameter(torch.randn(2, 2))})
        self.heads = nn.ModuleDict({"z": nn.Linear(4, 2), "y": nn.Identity()})
        self.nothing = None
        self.register_module("missing", None)
        self.register_buffer("half_buf", torch.randn(3).half())
        self.register_buffer("transposed_buf", torch.randn(3, 2).t())


def sequential() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Sequential(nn.Flatten(), nn.Linear(4, 3, bias=False), nn.LayerNorm(3)),
    )


def net() -> nn.Module:
    torch.manual_seed(0)
    return Net()


def bf16_net() -> nn.Module:
    torch.manual_seed(1)
    return Net().to(torch.bfloat16)


def channels_last_conv() -> nn.Module:
    torch.manual_seed(2)
    return nn.Sequential(nn.Conv2d(4, 6, 3), nn.Conv2d(6, 2, 1)).to(
        memory_format=torch.channels_last)


def zoo() -> nn.Module:
    """Library modules with unusual pickled state: RNNs (flat weight lists), attention
    (None projection weights), a Transformer layer, GroupNorm, weight_norm hooks."""
    torch.manual_seed(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        normed = nn.utils.weight_norm(nn.Linear(3, 3))
    return nn.Sequential(
        nn.LSTM(4, 3, num_layers=2, bidirectional=True),
        nn.GRU(3, 2, bias=False),
        nn.MultiheadAttention(4, 2, kdim=3, vdim=5),
        nn.TransformerEncoderLayer(8, 2, dim_feedforward=16),
        nn.GroupNorm(2, 4),
        nn.Embedding(5, 3, padding_idx=0),
        normed,
    )


MODELS: dict[str, Callable[[], nn.Module]] = {
    "sequential": sequential,
    "zoo": zoo,
    "net": net,
    "bf16_net": bf16_net,
    "channels_last_conv": channels_last_conv,
}


# ---- TorchScript --------------------------------------------------------------------------


class WithNonPersistent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 2))
        self.register_buffer("kept", torch.arange(4.0))
        self.register_buffer("dropped", torch.ones(2), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.t() + self.dropped.sum()


class Custom(nn.Module):
    """A parameter, a submodule, a buffer declared after the submodule and a plain
    (unregistered) tensor attribute that state_dict() must not list."""

    def __init__(self) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.randn(2, 3).t())
        self.inner = WithNonPersistent()
        self.register_buffer("counter", torch.tensor(7, dtype=torch.int32))
        self.plain = torch.randn(2)
        self.lin_nobias = nn.Linear(2, 2, bias=False)
        self.lin_bias = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = (self.inner(x) + self.plain.sum()) @ self.alpha
        return self.lin_nobias(z) + self.lin_bias(z)


class Outer(nn.Module):
    """The same scripted class twice with different shapes, two Customs, module and
    parameter containers (a long parameter list) and a half-precision buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.first = Custom()
        self.second = Custom()
        self.seq = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
        self.many = nn.ParameterList([nn.Parameter(torch.full((2,), float(i)))
                                      for i in range(40)])
        self.blocks = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2, bias=False)])
        self.by_name = nn.ModuleDict({"b": nn.Linear(2, 1), "a": nn.BatchNorm1d(2)})
        self.register_buffer("half_buf", torch.randn(2, 3).half().t())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.first(x) + self.second(x) + self.seq(self.first.lin_bias.weight).sum()
        for block in self.blocks:
            y = block(y)
        for p in self.many:
            y = y + p
        return y + self.by_name["b"](y) + self.half_buf.float().sum()


def _script_nested_sequential() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(),
                         nn.Sequential(nn.Linear(3, 3), nn.Sequential(nn.Linear(3, 2))))


def _script_batchnorm() -> nn.Module:
    m = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.BatchNorm1d(5))
    m[1].running_mean.uniform_()
    m[1].num_batches_tracked.fill_(12)
    return m


SCRIPTED: dict[str, Callable[[], nn.Module]] = {
    "nested_sequential": _script_nested_sequential,
    "batchnorm": _script_batchnorm,
    "non_persistent_buffer": WithNonPersistent,
    "custom": Custom,
    "outer": Outer,
}


@contextlib.contextmanager
def _no_jit_deprecation() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.", category=DeprecationWarning)
        yield


def script(name: str) -> torch.jit.ScriptModule:
    torch.manual_seed(3)
    with _no_jit_deprecation():
        return torch.jit.script(SCRIPTED[name]().eval())


def traced() -> torch.jit.ScriptModule:
    torch.manual_seed(4)
    with _no_jit_deprecation():
        return torch.jit.trace(WithNonPersistent().eval(), torch.randn(5, 2))


def jit_save(module: torch.jit.ScriptModule, path: Path) -> None:
    with _no_jit_deprecation():
        torch.jit.save(module, path)


def jit_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """What torch.jit.load(path).state_dict() holds."""
    with _no_jit_deprecation():
        return dict(torch.jit.load(path).state_dict())


def jit_resave(src: Path, dst: Path) -> None:
    with _no_jit_deprecation():
        torch.jit.save(torch.jit.load(src), dst)


class Tagged(torch.Tensor):
    """A tensor subclass (saved through torch._tensor._rebuild_from_type_v2)."""


class Tied(nn.Module):
    """Tied weights, one submodule under two names and a buffer viewing a parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 3)
        self.head = nn.Linear(3, 5, bias=False)
        self.head.weight = self.embed.weight
        self.shared = self.head
        self.register_buffer("view_buf", self.embed.weight.data[1:, ::2])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.head(self.embed(x)).sum(-1, keepdim=True).expand(-1, 3)
        return self.shared(y) + self.view_buf.sum()


SCRIPTED["tied"] = Tied
