"""Tensor geometry at the edges of what torch and NumPy hold: sizes and strides past int64,
empty tensors whose other dimensions NumPy cannot multiply, and 64-dimension tensors
(``Limits.max_ndim``). Each reads exactly or is refused with a torchless error, through
every entry point; never a NumPy ``ValueError``."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import torchless
from tests._fuzz_inputs import state_dict_pickle, tensor_ops, zip_checkpoint
from torchless.errors import TensorGeometryError, UnsupportedError
from torchless.model.chunks import chunks

_FLOATS = struct.pack("<6f", *range(6))
_I64 = (1 << 63) - 1


def _checkpoint(tmp_path: Path, shape: tuple[int, ...], stride: tuple[int, ...],
                offset: int = 0) -> Path:
    data = state_dict_pickle([("w", tensor_ops("0", 6, offset, shape, stride))])
    path = tmp_path / "geo.pt"
    path.write_bytes(zip_checkpoint(data, {"0": _FLOATS}))
    return path


@pytest.mark.parametrize(("shape", "stride"), [
    ((0, 1 << 63), (1, 1)),
    ((0, 1 << 64), (1, 1)),
    ((0,), (1 << 64,)),
    ((1,), (1 << 64,)),
    ((1, 1), (1 << 200, 1 << 200)),
    ((0, 2), (1, 1 << 63)),
], ids=["size 2**63 beside 0", "size 2**64 beside 0", "stride 2**64 empty",
        "stride 2**64 one element", "strides 2**200", "stride 2**63 empty"])
def test_sizes_and_strides_past_int64_are_refused(tmp_path: Path, shape: tuple[int, ...],
                                                  stride: tuple[int, ...]) -> None:
    """torch keeps sizes and strides as int64: unpickling these overflows in torch too."""
    path = _checkpoint(tmp_path, shape, stride)
    with pytest.raises(TensorGeometryError, match="overflows 64 bits"):
        torchless.open(path)
    with pytest.raises(TensorGeometryError):
        torchless.load(path)
    with pytest.raises(TensorGeometryError):
        torchless.convert(path, tmp_path / "out.safetensors")
    assert not (tmp_path / "out.safetensors").exists()


@pytest.mark.parametrize("shape", [(0, _I64), (0, 1 << 62, 4), (0,) + (_I64,) * 10],
                         ids=["0 x int64 max", "0 x 2**62 x 4", "0 x ten int64 max"])
def test_empty_tensor_numpy_cannot_hold_is_unsupported(tmp_path: Path,
                                                       shape: tuple[int, ...]) -> None:
    """Valid int64 sizes and no element, but NumPy bounds the product of the other
    dimensions: numpy() says so; its bytes are none; convert refuses or writes, cleanly."""
    path = _checkpoint(tmp_path, shape, (1,) * len(shape))
    with torchless.open(path) as ckpt:
        t = ckpt.tensors["w"]
        assert t.shape == shape
        assert b"".join(bytes(c) for c in chunks(t)) == b""
        with pytest.raises(UnsupportedError, match="NumPy cannot hold"):
            t.numpy()
    with pytest.raises(UnsupportedError):
        torchless.load(path)


def test_sixty_four_dimensions_read_and_convert(tmp_path: Path) -> None:
    """64 dims (the max_ndim default, NumPy's ceiling): two elements of size-2 dim 0 with
    stride 3 and 63 size-1 dims, whose strides never move (any int64 value is legal).
    The bytes are elements 0 and 3 of the storage (hand arithmetic)."""
    shape = (2,) + (1,) * 63
    stride = (3,) + (_I64,) * 63
    path = _checkpoint(tmp_path, shape, stride)
    want = struct.pack("<2f", 0.0, 3.0)
    with torchless.open(path) as ckpt:
        t = ckpt.tensors["w"]
        assert t.numpy().tobytes() == want
        assert b"".join(bytes(c) for c in chunks(t)) == want
    out = tmp_path / "out.safetensors"
    torchless.convert(path, out, verify=True)
    got = torchless.load(out)["w"]
    assert got.shape == shape and np.ascontiguousarray(got).tobytes() == want


def test_sixty_four_dimensions_empty(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path, (0,) * 64, (1,) * 64)
    with torchless.open(path) as ckpt:
        t = ckpt.tensors["w"]
        assert t.numpy().shape == (0,) * 64
        assert list(chunks(t)) == []
    torchless.convert(path, tmp_path / "out.safetensors", verify=True)


def test_sixty_four_dimensions_match_torch(tmp_path: Path) -> None:
    """torch.load reads the same two values from the 64-dimension view."""
    torch = pytest.importorskip("torch")
    path = _checkpoint(tmp_path, (2,) + (1,) * 63, (3,) + (_I64,) * 63)
    want = torch.load(path, weights_only=True)["w"]
    with torchless.open(path) as ckpt:
        got = ckpt.tensors["w"].numpy()
    assert tuple(want.shape) == got.shape
    assert want.flatten().tolist() == got.flatten().tolist()
