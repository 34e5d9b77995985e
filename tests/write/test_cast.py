"""The casts of :mod:`torchless.write.cast` against torch's ``tensor.to(dtype)``, bit for bit,
on hypothesis-drawn bit patterns: NaN payloads (quiet and signalling, both signs), ±0, ±inf,
subnormals, the largest finite values and the values at each rounding boundary (ties, one
ulp either side, the overflow threshold, the subnormal thresholds)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import require
from torchless.core.dtypes import by_torch_name
from torchless.model.tensor import Storage, Tensor
from torchless.write import cast as _cast

_BITS = {"float64": 64, "float32": 32, "float16": 16, "bfloat16": 16}
_UINT = {64: np.uint64, 32: np.uint32, 16: np.uint16}
_INT = {64: np.int64, 32: np.int32, 16: np.int16}
#: (exponent bits, mantissa bits) of each format
_LAYOUT = {"float64": (11, 52), "float32": (8, 23), "float16": (5, 10), "bfloat16": (8, 7)}
PAIRS = [(s, d) for s in _BITS for d in ("bfloat16", "float16", "float32") if s != d]
#: Pairs whose NaN result torch computes differently in its vector body and in the scalar
#: tail of each thread's range (cast.py's docstring): NaN there is checked against the set of
#: results torch gives across positions, every other value bit for bit.
POSITIONAL_NAN = {("float64", "bfloat16"), ("float16", "float32")}


def _specials(name: str) -> list[int]:
    """±0, ±inf, NaNs with payloads, subnormal and normal extremes of format ``name``."""
    e, m = _LAYOUT[name]
    n = 1 + e + m
    sign = 1 << (n - 1)
    inf = ((1 << e) - 1) << m
    quiet = 1 << (m - 1)
    pos = [0, inf, inf | quiet, inf | 1, inf | (quiet - 1), inf | (1 << m) - 1, inf | quiet | 1,
           1, (1 << m) - 1, 1 << m, inf - 1, (inf - 1) & ~((1 << m) - 1)]
    return [*pos, *(v | sign for v in pos)]


def _boundaries(source: str, target: str) -> list[int]:
    """Source values at the target's rounding boundaries: for each of a few kept
    mantissas (even and odd last bit), the exact tie and one unit either side, at a normal
    exponent, near the target's overflow and in its subnormal range."""
    se, sm = _LAYOUT[source]
    te, tm = _LAYOUT[target]
    if sm <= tm:
        return []
    drop = sm - tm
    bias_s, bias_t = (1 << (se - 1)) - 1, (1 << (te - 1)) - 1
    out = []
    exponents = [bias_s, bias_s - 3, bias_s + bias_t, bias_s + bias_t - 1,  # 1, 1/8, overflow
                 bias_s - bias_t, bias_s - bias_t - 1, bias_s - bias_t - tm,
                 bias_s - bias_t - tm - 1, bias_s - bias_t - tm - 2]  # around its subnormals
    for exp in exponents:
        if not 0 < exp < (1 << se) - 1:
            continue
        for kept in (0, 1, 2, 3, (1 << tm) - 1, (1 << tm) - 2):
            tie = (kept << drop) | (1 << (drop - 1))
            for mant in (tie - 1, tie, tie + 1, kept << drop, (kept << drop) | 1):
                value = (exp << sm) | (mant & ((1 << sm) - 1))
                out += [value, value | (1 << (se + sm))]
    return out


def _values(source: str, target: str) -> st.SearchStrategy[list[int]]:
    n = _BITS[source]
    one = st.one_of(st.sampled_from(_specials(source)),
                    st.sampled_from(_boundaries(source, target) or _specials(source)),
                    st.integers(0, (1 << n) - 1))
    return st.lists(one, max_size=80)  # lengths across vector bodies and scalar tails


def _torch_cast(torch: Any, source: str, target: str, bits: np.ndarray[Any, Any]
                ) -> np.ndarray[Any, Any]:
    n = _BITS[source]
    t = torch.from_numpy(bits.view(_INT[n]).copy()).view(getattr(torch, source))
    out = t.to(getattr(torch, target)).contiguous()
    m = _BITS[target]
    result: np.ndarray[Any, Any] = out.view(getattr(torch, f"int{m}")).numpy().view(_UINT[m])
    return result


def _ours(source: str, target: str, bits: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    got = _cast.cast_block(by_torch_name(source), by_torch_name(target), bits.tobytes())
    return np.frombuffer(got, dtype=_UINT[_BITS[target]])


def _is_nan(name: str, bits: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    e, m = _LAYOUT[name]
    b = bits.astype(np.uint64)
    exp = (b >> np.uint64(m)) & np.uint64((1 << e) - 1)
    mant = b & np.uint64((1 << m) - 1)
    result: np.ndarray[Any, Any] = (exp == (1 << e) - 1) & (mant != 0)
    return result


@pytest.mark.parametrize(("source", "target"), PAIRS)
def test_cast_equals_torch_bit_for_bit(source: str, target: str) -> None:
    torch = require("torch")

    @settings(max_examples=150, deadline=None)
    @given(_values(source, target))
    def check(words: list[int]) -> None:
        bits = np.array(words, dtype=_UINT[_BITS[source]])
        ours, theirs = _ours(source, target, bits), _torch_cast(torch, source, target, bits)
        if (source, target) not in POSITIONAL_NAN:
            assert ours.tolist() == theirs.tolist()
            return
        nan = _is_nan(source, bits)
        assert ours[~nan].tolist() == theirs[~nan].tolist()
        assert _is_nan(target, ours[nan]).all()
        for word in set(bits[nan].tolist()):  # one of the results torch gives that NaN
            run = np.full(71, word, dtype=bits.dtype)
            seen = set(_torch_cast(torch, source, target, run).tolist())
            assert int(_ours(source, target, bits[bits == word][:1])[0]) in seen

    check()


@pytest.mark.parametrize(("source", "target"), PAIRS)
def test_every_boundary_and_special_value(source: str, target: str) -> None:
    """The hand-built values all at once (hypothesis samples them; this takes each)."""
    torch = require("torch")
    words = _specials(source) + _boundaries(source, target)
    bits = np.array(words, dtype=_UINT[_BITS[source]])
    ours, theirs = _ours(source, target, bits), _torch_cast(torch, source, target, bits)
    keep = ~_is_nan(source, bits) if (source, target) in POSITIONAL_NAN else slice(None)
    assert ours[keep].tolist() == theirs[keep].tolist()


def test_rounding_by_hand() -> None:
    """Independent of torch: ties go to the even neighbour, float64 rounds through float32,
    float16 overflows to inf from 65520, and its smallest subnormal is kept."""
    f32, bf16, f16, f64 = (by_torch_name(n) for n in ("float32", "bfloat16", "float16",
                                                      "float64"))

    def bits(source: Any, target: Any, values: list[float], npdt: str) -> list[int]:
        data = np.array(values, dtype=npdt).tobytes()
        return np.frombuffer(_cast.cast_block(source, target, data), "<u2").tolist()

    # 1 + 2**-8 is the tie between bfloat16 1.0 (0x3F80, even) and 1.0078125 (0x3F81)
    assert bits(f32, bf16, [1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-23], "<f4") == [
        0x3F80, 0x3F82, 0x3F81]
    assert bits(f64, bf16, [1 + 2**-8 + 2**-40], "<f8") == [0x3F80]  # twice rounded
    assert bits(f32, f16, [65504.0, 65519.0, 65520.0, 2.0**-24, 2.0**-25, -0.0], "<f4") == [
        0x7BFF, 0x7BFF, 0x7C00, 0x0001, 0x0000, 0x8000]
    nan = np.array([0x7FA00000, 0xFF80FFFF], "<u4").tobytes()
    assert np.frombuffer(_cast.cast_block(f32, f16, nan), "<u2").tolist() == [0x7F00, 0xFE07]
    assert np.frombuffer(_cast.cast_block(f32, bf16, nan), "<u2").tolist() == [0xFFFF] * 2


def _memory_tensor(arr: np.ndarray[Any, Any], name: str, shape: tuple[int, ...],
                   stride: tuple[int, ...], offset: int = 0) -> Tensor:
    data = arr.tobytes()
    dtype = by_torch_name(name)
    return Tensor(Storage("0", dtype, len(data), lambda: memoryview(data)), dtype, shape,
                  stride, offset)


@pytest.mark.parametrize("block", [8, 24, 1 << 20])
def test_cast_tensor_streams_strided_tensors_in_blocks(monkeypatch: pytest.MonkeyPatch,
                                                       block: int) -> None:
    """A transposed view with an offset, cast in blocks of a few elements: the same bytes as
    torch casting the same view."""
    torch = require("torch")
    from torchless.model.chunks import chunks

    monkeypatch.setattr(_cast, "BLOCK_BYTES", block)
    rng = np.random.default_rng(1)
    arr = rng.standard_normal(3 + 6 * 5).astype("<f4")
    t = _memory_tensor(arr, "float32", (5, 6), (1, 5), 3)
    cast = _cast.cast_tensor(t, by_torch_name("bfloat16"))
    assert cast.storage.streams and cast.is_contiguous()
    got = b"".join(bytes(c) for c in chunks(cast))
    ref = torch.from_numpy(arr.copy()).as_strided((5, 6), (1, 5), 3).to(torch.bfloat16)
    assert got == ref.contiguous().view(torch.int16).numpy().tobytes()
    pieces = list(cast.storage.iter_bytes(0, cast.nbytes, 1 << 20))
    assert max(len(p) for p in pieces) <= max(block, 4)
    assert cast.storage.buffer() == got  # a reader asking for all of it


@pytest.mark.parametrize("target", ["bfloat16", "float16"])
@pytest.mark.parametrize("workers", [1, 2])
def test_blocks_and_pieces_in_threads_equal_torch(monkeypatch: pytest.MonkeyPatch,
                                                  workers: int, target: str) -> None:
    """float32 -> bfloat16 / float16 over several blocks cast by the worker threads, each
    block in several pieces (the last ones short), NaNs only in a late piece and ties,
    subnormals and overflows everywhere: torch's bytes, in order."""
    torch = require("torch")
    from torchless.model.chunks import chunks

    monkeypatch.setattr(_cast, "BLOCK_BYTES", 4 * 1000)
    monkeypatch.setattr(_cast, "_SUB_ELEMENTS", 96)
    monkeypatch.setattr(_cast, "_F16_ELEMENTS", 96)
    monkeypatch.setattr(_cast, "_WORKERS", workers)
    monkeypatch.setattr(_cast, "_local", __import__("threading").local())
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 1 << 32, 10_007, dtype=np.uint64).astype("<u4")
    bits[::3] = (bits[::3] & 0xFFFF0000) | 0x8000  # ties
    bits[1::7] &= 0x807FFFFF  # subnormals
    bits[2::11] |= 0x7F7F0000  # near the largest: overflow to inf
    finite = bits.view("<f4")
    finite[~np.isfinite(finite)] = 1.5
    bits[6_500] = 0x7FC00001  # NaNs in one late piece only
    bits[6_503] = 0xFF800001
    t = _memory_tensor(bits.view("<f4"), "float32", (bits.size,), (1,), 0)
    got = b"".join(bytes(c) for c in chunks(_cast.cast_tensor(t, by_torch_name(target))))
    ref = torch.from_numpy(bits.view("<f4").copy()).to(getattr(torch, target))
    assert got == ref.view(torch.int16).numpy().tobytes()


@pytest.mark.parametrize("target", ["bfloat16", "float16"])
def test_float32_bulk_equals_torch(target: str) -> None:
    """float32 -> bfloat16 / float16 on a million random bit patterns and on every exponent
    with mantissas at the rounding boundaries of both targets (ties, one unit either side,
    NaN payloads, both signs): torch's bits, every one, whatever the position."""
    torch = require("torch")
    rng = np.random.default_rng(28)
    mant = rng.integers(0, 1 << 23, 512, dtype=np.uint64).astype("<u4")
    mant[:12] = [0, 1, 0x7FFFFF, 0x400000, 0x1000, 0xFFF, 0x1001, 0x3000, 0x8000, 0x7FFF,
                 0x8001, 0x18000]
    grid = ((np.arange(256, dtype="<u4") << 23)[:, None] | mant[None, :]).ravel()
    bits = np.concatenate([rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype("<u4"),
                           grid, grid | 0x80000000])
    ours, theirs = _ours("float32", target, bits), _torch_cast(torch, "float32", target, bits)
    assert (ours == theirs).all(), bits[ours != theirs][:8]


def test_targets_and_refusals() -> None:
    from torchless.errors import ConversionError

    assert _cast.target_dtype("bf16").name == "bfloat16"
    assert _cast.target_dtype("torch.float16").name == "float16"
    with pytest.raises(ConversionError, match="one of bf16, fp16, fp32"):
        _cast.target_dtype("int8")
    with pytest.raises(ConversionError, match="needs dtype"):
        _cast.Cast.of(None, ["*"])
    f8 = _memory_tensor(np.zeros(4, np.uint8), "float8_e8m0fnu", (4,), (1,))
    i64 = _memory_tensor(np.arange(2), "int64", (2,), (1,))
    c = _cast.Cast.of("fp16")
    assert c is not None
    with pytest.raises(ConversionError, match=r"float8 tensor\(s\).*fp8\.w"):
        c.plan({"fp8.w": f8, "i": i64})
    assert c.plan({"i": i64}) == {}  # integers are never cast
    only = _cast.Cast.of("fp16", ["keep.*"])
    assert only is not None and only.plan({"fp8.w": f8}) == {}
