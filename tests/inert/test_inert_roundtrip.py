"""Round trips of the inert format v1 (docs/inert-format.md): ``load(save(x))`` is ``x``.

A recursive Hypothesis strategy builds nested values of every type ``torchless.save``
accepts, then links some sub-objects from a second place (shared references) and back into
their own descendants (cycles, only through containers the format can build before their
children). ``deep_equal`` compares types exactly, floats by bit pattern, arrays by dtype,
shape, bytes and memory order, and checks that the identity structure survives: every
mutable object of the input maps to exactly one object of the output, and distinct ones to
distinct ones.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import math
import struct
import tempfile
import types
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

import torchless
from torchless import Global, Opaque

torch: Any = pytest.importorskip("torch")
#: The module, untyped: save/load/TypeRegistry are the API under test (docs/inert-format.md).
TL: Any = torchless

try:  # the record of "no state", the default of Opaque.state
    from torchless.pickle.values import NOTSET
except ImportError:  # pragma: no cover
    NOTSET = object()

SETTINGS = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --------------------------------------------------------------------------- comparison

#: Types whose identity the format keeps: the same object twice stays the same object.
MUTABLE: tuple[type, ...] = (
    list, dict, set, bytearray, collections.deque, argparse.Namespace,
    types.SimpleNamespace, np.ndarray, Opaque,
)
#: Containers through which the format can express a cycle (section 2.3).
CYCLE_SAFE: tuple[type, ...] = (
    list, dict, collections.deque, argparse.Namespace, types.SimpleNamespace, Opaque,
)


def float_bits(v: float) -> bytes:
    return struct.pack("<d", v)


def torch_bytes(t: Any) -> bytes:
    flat = t.detach().contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).numpy().tobytes())


def torch_dtype_name(d: Any) -> str:
    return str(d).removeprefix("torch.")


def numpy_of_torch(name: str) -> np.dtype[Any]:
    from torchless.core.dtypes import by_torch_name

    d = by_torch_name(name)
    assert d is not None and d.numpy is not None
    dt_ = d.numpy
    return dt_


class Mismatch(AssertionError):
    pass


class DeepEqual:
    """``x`` (what was saved) against ``y`` (what was loaded), raising ``Mismatch`` with a path.

    ``torch_mode`` says how the file was loaded: with ``framework="pt"`` torch values come
    back as themselves; with ``framework="np"`` tensors become arrays, dtypes ``DType``,
    devices ``str`` and sizes ``tuple``.
    """

    def __init__(self, torch_mode: bool) -> None:
        self.torch_mode = torch_mode
        self.forward: dict[int, int] = {}
        self.backward: dict[int, int] = {}
        self.keep: list[Any] = []

    def fail(self, path: str, why: str) -> None:
        raise Mismatch(f"at {path or 'root'}: {why}")

    def check(self, x: Any, y: Any, path: str = "") -> None:
        if isinstance(x, MUTABLE) or isinstance(x, torch.Tensor):
            ix, iy = id(x), id(y)
            if ix in self.forward:
                if self.forward[ix] != iy:
                    self.fail(path, "a shared object was loaded as two objects")
                return
            if iy in self.backward:
                self.fail(path, "two distinct objects were loaded as one")
            self.forward[ix] = iy
            self.backward[iy] = ix
            self.keep.append((x, y))
        self._check(x, y, path)

    def _type(self, x: Any, y: Any, path: str, want: type | None = None) -> None:
        expected = type(x) if want is None else want
        if type(y) is not expected:
            self.fail(path, f"type {type(y).__name__}, expected {expected.__name__}")

    def _pairs(self, xs: list[Any], ys: list[Any], path: str) -> None:
        if len(xs) != len(ys):
            self.fail(path, f"length {len(ys)}, expected {len(xs)}")
        for i, (a, b) in enumerate(zip(xs, ys, strict=True)):
            self.check(a, b, f"{path}[{i}]")

    def _items(self, x: Any, y: Any, path: str) -> None:
        xi, yi = list(x.items()), list(y.items())
        if len(xi) != len(yi):
            self.fail(path, f"{len(yi)} items, expected {len(xi)}")
        for i, ((kx, vx), (ky, vy)) in enumerate(zip(xi, yi, strict=True)):
            self.check(kx, ky, f"{path}.key{i}")
            self.check(vx, vy, f"{path}[{kx!r}]")

    def _unordered(self, x: Any, y: Any, path: str) -> None:
        if len(x) != len(y):
            self.fail(path, f"{len(y)} members, expected {len(x)}")
        left = list(y)
        for a in x:
            for j, b in enumerate(left):
                try:
                    DeepEqual(self.torch_mode).check(a, b)
                except Mismatch:
                    continue
                del left[j]
                break
            else:
                self.fail(path, f"member {a!r} is missing")

    def _check(self, x: Any, y: Any, path: str) -> None:
        if isinstance(x, torch.Tensor):
            self._tensor(x, y, path)
            return
        if isinstance(x, torch.dtype):
            if self.torch_mode:
                if y is not x:
                    self.fail(path, f"{y!r} is not {x!r}")
            else:
                self._type(x, y, path, torchless.DType)
                if y.name != torch_dtype_name(x):
                    self.fail(path, f"dtype {y.name}, expected {x}")
            return
        if isinstance(x, torch.device):
            self._type(x, y, path, torch.device if self.torch_mode else str)
            if str(y) != str(x):
                self.fail(path, f"device {y}, expected {x}")
            return
        if isinstance(x, torch.Size):
            self._type(x, y, path, torch.Size if self.torch_mode else tuple)
            if tuple(y) != tuple(x):
                self.fail(path, f"size {y}, expected {x}")
            return
        self._type(x, y, path)
        if x is None or isinstance(x, (bool, int, str, bytes, bytearray)):
            if x != y:
                self.fail(path, f"{y!r} != {x!r}")
        elif isinstance(x, float):
            if float_bits(x) != float_bits(y):
                self.fail(path, f"float bits {float_bits(y).hex()} != {float_bits(x).hex()}")
        elif isinstance(x, complex):
            if float_bits(x.real) + float_bits(x.imag) != float_bits(y.real) + float_bits(
                    y.imag):
                self.fail(path, f"complex {y!r} != {x!r}")
        elif isinstance(x, (list, tuple)):
            self._pairs(list(x), list(y), path)
        elif isinstance(x, collections.deque):
            if x.maxlen != y.maxlen:
                self.fail(path, f"maxlen {y.maxlen} != {x.maxlen}")
            self._pairs(list(x), list(y), path)
        elif isinstance(x, collections.defaultdict):
            if y.default_factory is not x.default_factory:
                self.fail(path, f"factory {y.default_factory} != {x.default_factory}")
            self._items(x, y, path)
        elif isinstance(x, dict):  # dict, OrderedDict, Counter
            self._items(x, y, path)
            self._attrs(vars(x) if hasattr(x, "__dict__") else {},
                        vars(y) if hasattr(y, "__dict__") else {}, path)
        elif isinstance(x, (set, frozenset)):
            self._unordered(x, y, path)
        elif isinstance(x, (argparse.Namespace, types.SimpleNamespace)):
            self._attrs(vars(x), vars(y), path)
        elif isinstance(x, (slice, range)):
            if (x.start, x.stop, x.step) != (y.start, y.stop, y.step):
                self.fail(path, f"{y!r} != {x!r}")
        elif isinstance(x, (dt.datetime, dt.time)):
            if (x.isoformat(), x.fold, x.utcoffset()) != (y.isoformat(), y.fold, y.utcoffset()):
                self.fail(path, f"{y!r} != {x!r}")
        elif isinstance(x, (dt.date, dt.timedelta, Global)):
            if x != y:
                self.fail(path, f"{y!r} != {x!r}")
        elif isinstance(x, PurePosixPath | PureWindowsPath):
            if str(x) != str(y):
                self.fail(path, f"{y!r} != {x!r}")
        elif isinstance(x, np.ndarray):
            self._array(x, y, path)
        elif isinstance(x, np.generic):
            if x.dtype != y.dtype or x.dtype.str != y.dtype.str or x.tobytes() != y.tobytes():
                self.fail(path, f"scalar {y!r} ({y.dtype}) != {x!r} ({x.dtype})")
        elif isinstance(x, np.dtype):
            if x != y or x.str != y.str:
                self.fail(path, f"{y!r} != {x!r}")
        elif isinstance(x, Opaque):
            self._opaque(x, y, path)
        else:
            raise AssertionError(f"deep_equal does not know {type(x)}")

    def _attrs(self, ax: dict[str, Any], ay: dict[str, Any], path: str) -> None:
        if list(ax) != list(ay):
            self.fail(path, f"attributes {list(ay)} != {list(ax)}")
        for k in ax:
            self.check(ax[k], ay[k], f"{path}.{k}")

    def _array(self, x: np.ndarray[Any, Any], y: Any, path: str) -> None:
        if x.dtype != y.dtype or x.dtype.str != y.dtype.str or x.shape != y.shape:
            self.fail(path, f"array {y.dtype.str}{y.shape} != {x.dtype.str}{x.shape}")
        if x.dtype == object:
            self._pairs(list(x.reshape(-1)), list(y.reshape(-1)), path)
            return
        if x.tobytes() != y.tobytes():
            self.fail(path, "array bytes differ")
        if (x.flags.c_contiguous, x.flags.f_contiguous) != (
                y.flags.c_contiguous, y.flags.f_contiguous):
            self.fail(path, f"memory order differs: {y.flags}")

    def _tensor(self, x: Any, y: Any, path: str) -> None:
        name = torch_dtype_name(x.dtype)
        if self.torch_mode:
            self._type(x, y, path)
            if y.dtype != x.dtype or tuple(y.shape) != tuple(x.shape):
                self.fail(path, f"tensor {y.dtype}{tuple(y.shape)} != {x.dtype}{tuple(x.shape)}")
            if y.requires_grad != x.requires_grad:
                self.fail(path, f"requires_grad {y.requires_grad} != {x.requires_grad}")
            if torch_bytes(x) != torch_bytes(y):
                self.fail(path, "tensor bytes differ")
            return
        self._type(x, y, path, np.ndarray)
        want = numpy_of_torch(name)
        if y.dtype != want or y.shape != tuple(x.shape):
            self.fail(path, f"array {y.dtype}{y.shape} != {want}{tuple(x.shape)}")
        if y.tobytes() != torch_bytes(x):
            self.fail(path, "tensor bytes differ")

    def _opaque(self, x: Opaque, y: Opaque, path: str) -> None:
        self.check(x.callable, y.callable, f"{path}.callable")
        self.check(x.args, y.args, f"{path}.args")
        self.check(x.kwargs, y.kwargs, f"{path}.kwargs")
        if x.newobj != y.newobj:
            self.fail(path, "newobj differs")
        if (x.state is NOTSET) != (y.state is NOTSET):
            self.fail(path, f"state {y.state!r} != {x.state!r}")
        if x.state is not NOTSET:
            self.check(x.state, y.state, f"{path}.state")
        self.check(x.items, y.items, f"{path}.items")
        self.check(x.dict_items, y.dict_items, f"{path}.dict_items")


def deep_equal(x: Any, y: Any, *, torch_mode: bool) -> None:
    DeepEqual(torch_mode).check(x, y)


# --------------------------------------------------------------------------- structure walk

def children(obj: Any) -> list[Any]:
    """What ``obj`` holds, as the format would write it."""
    if isinstance(obj, (list, tuple, collections.deque, set, frozenset)):
        return list(obj)
    if isinstance(obj, dict):
        out = [v for kv in obj.items() for v in kv]
        return out + list(vars(obj).values()) if hasattr(obj, "__dict__") else out
    if isinstance(obj, (argparse.Namespace, types.SimpleNamespace)):
        return list(vars(obj).values())
    if isinstance(obj, np.ndarray) and obj.dtype == object:
        return list(obj.reshape(-1))
    if isinstance(obj, Opaque):
        out = [obj.callable, *obj.args, *(obj.kwargs or {}).values(), *obj.items]
        out += [v for kv in obj.dict_items for v in kv]
        return [*out, obj.state] if obj.state is not NOTSET else out
    return []


def walk(root: Any) -> Iterator[Any]:
    """Every object reachable from ``root`` once (by identity), depth first."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        yield obj
        stack.extend(reversed(children(obj)))


def reaches(src: Any, dst: Any) -> bool:
    return any(o is dst for o in walk(src))


def on_paths(src: Any, dst: Any) -> list[Any]:
    """Objects on some path from ``src`` to ``dst``."""
    return [o for o in walk(src) if reaches(o, dst)]


def arrays_and_tensors(root: Any) -> list[Any]:
    return [o for o in walk(root)
            if isinstance(o, torch.Tensor) or (isinstance(o, np.ndarray) and o.dtype != object)]


# --------------------------------------------------------------------------- strategies

def nan_with_bits(bits: int) -> float:
    return float(struct.unpack("<d", struct.pack("<Q", bits))[0])


nan_payloads = st.builds(
    lambda sign, mant: nan_with_bits((sign << 63) | (0x7FF << 52) | mant),
    st.integers(0, 1), st.integers(1, (1 << 52) - 1))
finite_floats = st.floats(allow_nan=False)
all_floats = st.one_of(st.floats(), nan_payloads, st.sampled_from([-0.0, 0.0, math.inf]))
ints = st.one_of(st.integers(), st.integers(-(2**300), 2**300),
                 st.sampled_from([2**53 - 1, 2**53, -(2**53 - 1), -(2**53), 2**63, -(2**64)]))
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)
attr_names = names.filter(lambda s: not s.startswith("__"))
offsets = st.timedeltas(min_value=dt.timedelta(hours=-23, minutes=-59),
                        max_value=dt.timedelta(hours=23, minutes=59))
fixed_tz = st.one_of(st.none(), st.builds(dt.timezone, offsets))
datetimes = st.builds(lambda d, fold: d.replace(fold=fold),
                      st.datetimes(timezones=fixed_tz), st.integers(0, 1))
times = st.builds(lambda t, fold: t.replace(fold=fold), st.times(timezones=fixed_tz),
                  st.integers(0, 1))
paths = st.one_of(
    st.builds(PurePosixPath, st.text(max_size=8)),
    # pathlib reads the text of some such paths back as another path (PureWindowsPath("//:/")
    # prints as \\\\:\\\\, which parses as \\:): save refuses those, tested below
    st.builds(PureWindowsPath, st.text(alphabet="abc:\\/. ", max_size=8)).filter(
        lambda p: PureWindowsPath(str(p)) == p and str(PureWindowsPath(str(p))) == str(p)),
    st.builds(Path, st.text(alphabet="ab/. ", max_size=8)),
)
globals_ = st.builds(Global, names, st.from_regex(r"[A-Za-z_]\w{0,4}(\.[A-Za-z_]\w{0,4}){0,2}",
                                                  fullmatch=True))
opt_ints = st.one_of(st.none(), st.integers(-5, 5))
slices = st.builds(slice, opt_ints, opt_ints, opt_ints)
ranges = st.builds(range, st.integers(-10, 10), st.integers(-10, 10),
                   st.integers(-3, 3).filter(bool))

hashable_leaves = st.one_of(
    st.none(), st.booleans(), ints, finite_floats, st.text(max_size=6), st.binary(max_size=6),
    st.complex_numbers(allow_nan=False), st.dates(), st.timedeltas(), globals_, ranges, paths,
)
hashables = st.recursive(
    hashable_leaves,
    lambda c: st.one_of(st.lists(c, max_size=3).map(tuple), st.frozensets(c, max_size=3)),
    max_leaves=6,
)

NP_DESCRS = ["|u1", "|i1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8",
             "<c8", "<c16", ">i2", ">u4", ">f4", ">f8", ">c8", ">i8", "|S3", "|V3",
             "<M8[ns]", ">m8[s]", "<M8[D]", "<m8[us]"]
ML_DTYPES = [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2,
             ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2fnuz]
TORCH_DTYPES = ["float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
                "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "int64", "int32",
                "int16", "int8", "uint8", "uint16", "uint32", "uint64", "bool", "complex64",
                "complex128", "complex32"]
GRAD_DTYPES = {"float64", "float32", "float16", "bfloat16", "complex64", "complex128"}
shapes = st.lists(st.integers(0, 3), max_size=3).map(tuple)


@st.composite
def np_arrays(draw: st.DrawFn, with_ml: bool) -> np.ndarray[Any, Any]:
    choices: list[Any] = ["|b1", "<U1", ">U1", *NP_DESCRS, *(ML_DTYPES if with_ml else [])]
    descr = draw(st.sampled_from(choices))
    shape: tuple[int, ...] = draw(shapes)
    n = math.prod(shape)
    if descr == "|b1":
        a = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype="|b1")
    elif descr in ("<U1", ">U1"):
        cps = draw(st.lists(st.integers(0, 0x10FFFF), min_size=n, max_size=n))
        a = np.array(cps, dtype="<u4").view("<U1").astype(descr)
    else:
        dtype = np.dtype(descr)
        raw = draw(st.binary(min_size=n * dtype.itemsize, max_size=n * dtype.itemsize))
        a = np.frombuffer(raw, dtype=dtype).copy()
    a = a.reshape(shape)
    if a.ndim >= 2 and draw(st.booleans()):
        a = np.asfortranarray(a)
    return a


@st.composite
def np_scalars(draw: st.DrawFn) -> np.generic:
    descr = draw(st.sampled_from(["<f2", "<f4", "<f8", "<i8", "<i4", "|u1", "|i1", "<u8",
                                  "<c8", "<c16", "<M8[s]", "<m8[us]", "|b1"]))
    if descr == "|b1":
        return np.bool_(draw(st.booleans()))
    dtype = np.dtype(descr)
    raw = draw(st.binary(min_size=dtype.itemsize, max_size=dtype.itemsize))
    value: np.generic = np.frombuffer(raw, dtype=dtype)[0]
    return value


np_dtypes = st.sampled_from([np.dtype(d) for d in [*NP_DESCRS, "|b1", "<U3", ">U2", "|S1"]]
                            + [np.dtype(m) for m in ML_DTYPES])


def itemsize(name: str) -> int:
    from torchless.core.dtypes import by_torch_name

    d = by_torch_name(name)
    assert d is not None
    return d.itemsize


def make_tensor(name: str, shape: tuple[int, ...], raw: bytes) -> Any:
    dtype = getattr(torch, name)
    with warnings.catch_warnings():  # torch: "ComplexHalf support is experimental"
        warnings.simplefilter("ignore", UserWarning)
        return torch.tensor(list(raw), dtype=torch.uint8).view(dtype).reshape(shape)


@st.composite
def torch_tensors(draw: st.DrawFn) -> Any:
    name = draw(st.sampled_from(TORCH_DTYPES))
    shape: tuple[int, ...] = draw(shapes)
    n = math.prod(shape)
    if name == "bool":
        t = torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n)),
                         dtype=torch.bool).reshape(shape)
    else:
        size = itemsize(name)
        t = make_tensor(name, shape, draw(st.binary(min_size=n * size, max_size=n * size)))
    kind = draw(st.sampled_from(["plain", "param", "grad", "transposed"]))
    if kind == "param":
        grad = name in GRAD_DTYPES and draw(st.booleans())
        return torch.nn.Parameter(t, requires_grad=grad)
    if kind == "grad" and name in GRAD_DTYPES:
        return t.requires_grad_(True)
    if kind == "transposed" and t.ndim == 2:
        return t.t()
    return t


torch_values = st.one_of(
    torch_tensors(),
    st.sampled_from([getattr(torch, n) for n in TORCH_DTYPES]),
    st.sampled_from(["cpu", "cuda:0", "cuda", "meta", "cuda:3"]).map(torch.device),
    shapes.map(torch.Size),
)


def leaves(with_torch: bool, with_ml: bool) -> st.SearchStrategy[Any]:
    base = st.one_of(
        st.none(), st.booleans(), ints, all_floats,
        st.complex_numbers(allow_nan=True, allow_infinity=True), st.text(max_size=8),
        st.binary(max_size=8), st.binary(max_size=8).map(bytearray), slices, ranges,
        datetimes, st.dates(), times, st.timedeltas(), paths, globals_,
        np_arrays(with_ml), np_scalars(), np_dtypes, hashables,
    )
    arrays = np_arrays(with_ml)
    if with_torch:
        return st.one_of(base, arrays, torch_tensors(), torch_tensors(), torch_values)
    return st.one_of(base, arrays, arrays)


@st.composite
def ordered_dicts(draw: st.DrawFn, c: st.SearchStrategy[Any]) -> collections.OrderedDict[Any, Any]:
    od: collections.OrderedDict[Any, Any] = collections.OrderedDict(
        draw(st.lists(st.tuples(hashables, c), max_size=4)))
    if draw(st.booleans()):
        vars(od)["_metadata"] = draw(st.dictionaries(
            st.text(max_size=3), st.fixed_dictionaries({"version": st.integers(0, 3)}),
            max_size=3))
    for name, value in draw(st.lists(st.tuples(attr_names, c), max_size=2)):
        setattr(od, name, value)
    return od


FACTORIES: list[Any] = [None, list, dict, set, int, float, str, tuple]


@st.composite
def opaques(draw: st.DrawFn, c: st.SearchStrategy[Any]) -> Opaque:
    kwargs = draw(st.one_of(st.none(), st.dictionaries(st.text(max_size=4), c, max_size=2)))
    o = Opaque(draw(globals_), tuple(draw(st.lists(c, max_size=3))), kwargs,
               newobj=draw(st.booleans()))
    if draw(st.booleans()):
        o.state = draw(c)
    o.items = draw(st.lists(c, max_size=2))
    o.dict_items = draw(st.lists(st.tuples(hashables, c), max_size=2))
    return o


@st.composite
def obj_arrays(draw: st.DrawFn, c: st.SearchStrategy[Any]) -> np.ndarray[Any, Any]:
    shape: tuple[int, ...] = draw(shapes)
    a = np.empty(shape, dtype=object)
    flat = a.reshape(-1)
    for i in range(flat.size):
        flat[i] = draw(c)
    return a


def containers(c: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(c, max_size=4),
        st.lists(c, max_size=4).map(tuple),
        st.dictionaries(hashables, c, max_size=4),
        st.dictionaries(st.sampled_from(["$ref", "$id", "$int", "$", "a", "b"]), c, max_size=3),
        st.dictionaries(st.text(max_size=4), c, max_size=4),
        ordered_dicts(c),
        st.builds(collections.defaultdict, st.sampled_from(FACTORIES),
                  st.dictionaries(hashables, c, max_size=3)),
        st.dictionaries(hashables, st.integers(), max_size=3).map(collections.Counter),
        st.builds(collections.deque, st.lists(c, max_size=4),
                  st.one_of(st.none(), st.integers(0, 5))),
        st.sets(hashables, max_size=4),
        st.frozensets(hashables, max_size=4),
        st.dictionaries(st.text(max_size=4), c, max_size=3).map(
            lambda d: argparse.Namespace(**d)),
        st.dictionaries(st.text(max_size=4), c, max_size=3).map(
            lambda d: types.SimpleNamespace(**d)),
        obj_arrays(c),
        opaques(c),
    )


def trees(with_torch: bool, with_ml: bool) -> st.SearchStrategy[Any]:
    return st.recursive(leaves(with_torch, with_ml), containers, max_leaves=20)


def link(dst: Any, value: Any, key: str) -> None:
    """Make ``dst`` hold ``value`` as well."""
    if isinstance(dst, list):
        dst.append(value)
    elif isinstance(dst, Opaque):
        dst.items.append(value)
    elif isinstance(dst, dict):
        dst[key] = value
    else:
        setattr(dst, key, value)


@st.composite
def linked(draw: st.DrawFn, with_torch: bool, with_ml: bool) -> Any:
    """A tree, then extra references to its sub-objects: sharing and cycles."""
    root = [draw(trees(with_torch, with_ml))]
    for i in range(draw(st.integers(0, 4))):
        objs = [o for o in walk(root) if children(o) or isinstance(o, MUTABLE)
                or isinstance(o, torch.Tensor)]
        slots = [o for o in objs if type(o) in (list, dict, collections.OrderedDict,
                                                argparse.Namespace, types.SimpleNamespace,
                                                Opaque)]
        dst = draw(st.sampled_from(slots))
        ancestors = [o for o in objs if reaches(o, dst)]
        value = draw(st.sampled_from(ancestors if draw(st.booleans()) else objs))
        # A new cycle value -> ... -> dst -> value must pass only through containers the
        # format builds before their children.
        if reaches(value, dst) and not all(isinstance(o, CYCLE_SAFE)
                                           for o in on_paths(value, dst)):
            continue
        link(dst, value, f"link{i}")
    return root


def _differing_pairs() -> list[tuple[Any, Any]]:
    shared: list[int] = [1]
    od1: collections.OrderedDict[str, int] = collections.OrderedDict([("a", 1), ("b", 2)])
    od2: collections.OrderedDict[str, int] = collections.OrderedDict([("b", 2), ("a", 1)])
    c = np.arange(6.0).reshape(2, 3)
    o1 = Opaque(Global("m", "C"), (), None)
    o2 = Opaque(Global("m", "C"), (), None)
    o2.state = None
    return [
        (0.0, -0.0), (1, True), (1, 1.0), (nan_with_bits(0x7FF8000000000000),
                                          nan_with_bits(0x7FF8000000000001)),
        ([shared, shared], [[1], [1]]), ([[1], [1]], [shared, shared]),
        (od1, od2), ({"a": 1}, collections.OrderedDict(a=1)), ({1}, {1.0}),
        (c, np.asfortranarray(c)), (c, c.astype(">f8")), ((1, 2), [1, 2]), (o1, o2),
        (collections.deque([1], maxlen=2), collections.deque([1])),
        (collections.defaultdict(list), collections.defaultdict(set)),
        (torch.ones(2), torch.nn.Parameter(torch.ones(2))),
        (torch.ones(2, requires_grad=True), torch.ones(2)),
        (dt.datetime(2020, 1, 1, fold=1), dt.datetime(2020, 1, 1)),
        (PurePosixPath("a"), PureWindowsPath("a")),
    ]


@pytest.mark.parametrize("pair", _differing_pairs(), ids=repr)
def test_deep_equal_tells_values_apart(pair: tuple[Any, Any]) -> None:
    with pytest.raises(Mismatch):
        deep_equal(pair[0], pair[1], torch_mode=True)


# --------------------------------------------------------------------------- file checks

def read_safetensors(path: Path) -> tuple[dict[str, Any], bytes]:
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    return header, data[8 + n:]


def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate keys in the tree: {keys}"
    return dict(pairs)


def check_json_numbers(node: Any) -> None:
    if isinstance(node, bool):
        return
    if isinstance(node, int):
        assert abs(node) <= 2**53 - 1, f"{node} must be written as $int"
    elif isinstance(node, list):
        for v in node:
            check_json_numbers(v)
    elif isinstance(node, dict):
        for v in node.values():
            check_json_numbers(v)


def parse_float(text: str) -> float:
    assert repr(float(text)) == text, f"float {text} not written as its shortest repr"
    return float(text)


def check_file(path: Path, x: Any) -> None:
    """The file is a safetensors file holding every array and tensor of ``x`` as an entry."""
    header, data = read_safetensors(path)
    meta = header.get("__metadata__", {})
    assert meta.get("torchless.inert") == "1"
    tree = json.loads(meta["torchless.tree"], object_pairs_hook=no_duplicates,
                      parse_float=parse_float)
    check_json_numbers(tree)
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    with safe_open(str(path), "np") as f:
        assert set(f.keys()) == set(entries)
        assert f.metadata() == meta
    stored = set()
    for e in entries.values():
        start, end = e["data_offsets"]
        stored.add(data[start:end])
    distinct = arrays_and_tensors(x)
    assert len(entries) <= len(distinct), "more entries than distinct arrays and tensors"
    for a in distinct:
        want = torch_bytes(a) if isinstance(a, torch.Tensor) else a.tobytes()
        assert want in stored, f"no entry holds the bytes of {type(a).__name__} {a.dtype}"


def roundtrip(x: Any, *, torch_mode: bool = False, check: bool = True,
              **load_kw: Any) -> Any:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "obj.inert"
        TL.save(x, path)
        if check:
            check_file(path, x)
        y = TL.load(path, framework="pt" if torch_mode else "numpy",
                           **load_kw)
        deep_equal(x, y, torch_mode=torch_mode)
        return y


# --------------------------------------------------------------------------- properties

@SETTINGS
@given(linked(with_torch=True, with_ml=False))
def test_roundtrip_torch_mode(x: Any) -> None:
    roundtrip(x, torch_mode=True)


@SETTINGS
@given(linked(with_torch=True, with_ml=True))
def test_roundtrip_numpy_mode(x: Any) -> None:
    roundtrip(x, torch_mode=False)


@SETTINGS
@given(linked(with_torch=False, with_ml=True))
def test_roundtrip_numpy_mode_copy_gives_writeable_arrays(x: Any) -> None:
    y = roundtrip(x, copy=True)
    for a in arrays_and_tensors(y):
        assert a.flags.writeable


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.lists(st.integers()), st.dictionaries(st.text(), st.integers())),
                min_size=1, max_size=4), st.lists(st.integers(0, 3), min_size=1, max_size=8))
def test_shared_references_keep_identity(objs: list[Any], picks: list[int]) -> None:
    x = [objs[i % len(objs)] for i in picks]
    y = roundtrip(x)
    for i in range(len(x)):
        for j in range(len(x)):
            assert (y[i] is y[j]) == (x[i] is x[j])


# --------------------------------------------------------------------------- targeted

def test_example_of_the_spec() -> None:
    x = {"epoch": 3, "lr": 1e-3, "args": argparse.Namespace(seed=1),
         "w": torch.tensor([1.0, 2.0])}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "ex.inert"
        TL.save(x, path)
        header, _ = read_safetensors(path)
        tree = json.loads(header["__metadata__"]["torchless.tree"])
        assert tree["epoch"] == 3 and tree["lr"] == 0.001
        assert tree["args"] == {"$namespace": {"seed": 1}}
        t = tree["w"]["$tensor"]
        assert t["dtype"] == "float32" and t["shape"] == [2]
        assert header[t["name"]]["dtype"] == "F32"
        y = TL.load(path)
        assert type(y["w"]) is np.ndarray and not y["w"].flags.writeable
        np.testing.assert_array_equal(y["w"], np.array([1.0, 2.0], dtype=np.float32))


@pytest.mark.parametrize("bits", [0x7FF8000000000000, 0x7FF0000000000001, 0xFFF8000000000000,
                                  0x7FFFFFFFFFFFFFFF, 0xFFF0000000DEAD00, 0x7FF4000000000000])
def test_nan_payload_bits(bits: int) -> None:
    v = nan_with_bits(bits)
    y = roundtrip([v, complex(v, -v)])
    assert float_bits(y[0]) == float_bits(v)


@pytest.mark.parametrize("v", [-0.0, 0.0, math.inf, -math.inf, 5e-324, 1.7976931348623157e308,
                               0.1, 1e22, 1e-7])
def test_special_floats(v: float) -> None:
    assert float_bits(roundtrip(v)) == float_bits(v)
    assert float_bits(roundtrip([v])[0]) == float_bits(v)


@pytest.mark.parametrize("v", [2**200, -(2**200), 2**53, -(2**53), 2**53 - 1, 2**64,
                               10**4299, -(10**4299), 0, True, False],
                         ids=lambda v: f"{type(v).__name__}{len(str(v))}{str(v)[:6]}")
def test_big_and_edge_ints(v: int) -> None:
    y = roundtrip({"v": v, "k": {v: v}})
    assert type(y["v"]) is type(v) and y["v"] == v


def test_int_beyond_4300_digits_is_refused_with_a_torchless_error(tmp_path: Path) -> None:
    path = tmp_path / "big.inert"
    try:
        TL.save(10**5000, path)
    except torchless.CheckpointError:
        assert not path.exists()
    else:  # a writer may raise the limit; then it must read back
        assert TL.load(path, limits=torchless.Limits(max_int_digits=6000)) == 10**5000


@pytest.mark.parametrize("offset", [dt.timedelta(microseconds=1),
                                    dt.timedelta(microseconds=500000),
                                    dt.timedelta(seconds=-1, microseconds=999999),
                                    dt.timedelta(hours=5, seconds=7, microseconds=3)], ids=str)
def test_sub_second_utc_offsets(offset: dt.timedelta) -> None:
    tz = dt.timezone(offset)
    x = [dt.datetime(2020, 1, 1, 12, tzinfo=tz), dt.time(11, 18, 5, 108567, tzinfo=tz)]
    y = roundtrip(x)
    assert y[0].utcoffset() == offset and y[1].utcoffset() == offset


@pytest.mark.parametrize("descr", [">f8", ">i4", ">c16", ">u2", ">M8[ns]", "<U3", ">U3",
                                   "|S4", "|V5", "<m8[D]"])
def test_byte_orders_and_kinds(descr: str) -> None:
    dtype = np.dtype(descr)
    raw = np.frombuffer(bytes(range(256)) * 2, dtype="u1")[:6 * dtype.itemsize]
    a = np.frombuffer(raw.tobytes(), dtype=dtype).reshape(2, 3).copy()
    roundtrip({"a": a})


@pytest.mark.parametrize("descr", ["<f4", ">f8", "|u1", "<c8"])
def test_fortran_order(descr: str) -> None:
    a = np.asfortranarray(np.arange(12).reshape(3, 4).astype(descr))
    assert a.flags.f_contiguous and not a.flags.c_contiguous
    y = roundtrip(a)
    assert y.flags.f_contiguous and not y.flags.c_contiguous
    np.testing.assert_array_equal(y, a)


def test_strided_view_keeps_values() -> None:
    base = np.arange(40, dtype=np.float32).reshape(5, 8)
    views = [base[::2, 1::3], base.T, base[:, 3]]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "v.inert"
        TL.save(views, path)
        y = TL.load(path)
    for a, b in zip(views, y, strict=True):
        assert b.dtype == a.dtype
        np.testing.assert_array_equal(b, a)


@pytest.mark.parametrize("mdt", ML_DTYPES, ids=lambda d: np.dtype(d).name)
def test_ml_dtypes_arrays_keep_their_dtype(mdt: Any) -> None:
    a = np.frombuffer(bytes(range(12)) * np.dtype(mdt).itemsize, dtype=mdt)[:12].reshape(3, 4)
    y = roundtrip(a)
    assert y.dtype == np.dtype(mdt)


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 0, 2), ()])
@pytest.mark.parametrize("descr", ["<f4", ">f8", "|b1", "<c16", "|S2"])
def test_empty_and_zero_d_arrays(shape: tuple[int, ...], descr: str) -> None:
    a = np.zeros(shape, dtype=descr)
    y = roundtrip([a, a])
    assert y[0] is y[1]


def test_object_arrays() -> None:
    a = np.empty((2, 2), dtype=object)
    inner = [1, 2]
    a[0, 0] = inner
    a[0, 1] = (3.5, "x")
    a[1, 0] = np.arange(3)
    a[1, 1] = None
    y = roundtrip({"a": a, "inner": inner})
    assert y["a"][0, 0] is y["inner"]


@pytest.mark.parametrize("name", TORCH_DTYPES)
@pytest.mark.parametrize("shape", [(2, 3), (), (0,), (4,)])
def test_every_torch_dtype(name: str, shape: tuple[int, ...]) -> None:
    n = math.prod(shape)
    size = itemsize(name)
    if name == "bool":
        t = torch.tensor([i % 2 == 0 for i in range(n)], dtype=torch.bool).reshape(shape)
    else:
        t = make_tensor(name, shape, bytes((7 * i + 3) % 256 for i in range(n * size)))
    y = roundtrip({"t": t}, torch_mode=True)
    assert y["t"].dtype == t.dtype and y["t"].shape == t.shape
    assert torch_bytes(y["t"]) == torch_bytes(t)
    z = roundtrip({"t": t})  # numpy mode: the bytes under the matching numpy dtype
    assert z["t"].dtype == numpy_of_torch(name)


@pytest.mark.parametrize("grad", [True, False])
def test_parameters_and_requires_grad(grad: bool) -> None:
    p = torch.nn.Parameter(torch.arange(6, dtype=torch.float32).reshape(2, 3),
                           requires_grad=grad)
    g = torch.ones(3, dtype=torch.float64, requires_grad=True)
    y = roundtrip({"p": p, "g": g, "again": p}, torch_mode=True)
    assert type(y["p"]) is torch.nn.Parameter and y["p"].requires_grad is grad
    assert type(y["g"]) is torch.Tensor and y["g"].requires_grad
    assert y["again"] is y["p"]


def test_torch_scalars_in_numpy_mode() -> None:
    x = {"dt": torch.bfloat16, "dev": torch.device("cuda:1"), "size": torch.Size([2, 3])}
    y = roundtrip(x)
    assert y["dt"].name == "bfloat16" and y["dev"] == "cuda:1" and y["size"] == (2, 3)
    y = roundtrip(x, torch_mode=True)
    assert y["dt"] is torch.bfloat16 and y["size"] == torch.Size([2, 3])


def test_cycles_through_every_mutable_container() -> None:
    lst: list[Any] = []
    lst.append(lst)
    d: dict[str, Any] = {}
    d["self"] = d
    od: collections.OrderedDict[str, Any] = collections.OrderedDict()
    od["self"] = od
    dd: collections.defaultdict[str, Any] = collections.defaultdict(list)
    dd["self"] = dd
    dq: collections.deque[Any] = collections.deque(maxlen=3)
    dq.append(dq)
    ns = argparse.Namespace()
    ns.me = ns
    sn = types.SimpleNamespace()
    sn.me = sn
    op = Opaque(Global("m", "C"), (), None, newobj=True)
    op.state = {"me": op}
    through_tuple: list[Any] = []
    through_tuple.append((through_tuple, 1))
    x = [lst, d, od, dd, dq, ns, sn, op, through_tuple]
    y = roundtrip(x)
    assert y[0][0] is y[0]
    assert y[1]["self"] is y[1]
    assert y[2]["self"] is y[2]
    assert y[3]["self"] is y[3]
    assert y[4][0] is y[4] and y[4].maxlen == 3
    assert y[5].me is y[5]
    assert y[6].me is y[6]
    assert y[7].state["me"] is y[7]
    assert y[8][0][0] is y[8]


@pytest.mark.parametrize("shared", [(1, 2), [1, 2]], ids=["tuple", "list"])
def test_opaque_state_shared_with_items(shared: Any) -> None:
    o = Opaque(Global("m", "C"), (), None, newobj=True)
    o.items = [shared]
    o.dict_items = [("k", shared)]
    o.state = shared
    y = roundtrip(o)
    assert y.state is y.items[0] is y.dict_items[0][1]


def test_odict_metadata_attribute() -> None:
    sd: collections.OrderedDict[str, Any] = collections.OrderedDict(
        [("b", np.ones(2)), ("a", np.zeros(1))])
    vars(sd)["_metadata"] = {"": {"version": 1}, "layer": {"version": 2}}
    y = roundtrip(sd)
    assert list(y) == ["b", "a"]
    assert y._metadata == {"": {"version": 1}, "layer": {"version": 2}}


# --------------------------------------------------------------------------- type registry

class Point:
    def __init__(self, x: int, y: int) -> None:
        self.x = x
        self.y = y


def counting_registry(name: str | None = None) -> tuple[Any, list[Any]]:
    calls: list[Any] = []

    def decode(state: Any) -> Point:
        calls.append(state)
        return Point(*state)

    reg = TL.TypeRegistry()
    reg.register(Point, lambda p: [p.x, p.y], decode, name=name)
    return reg, calls


def test_registered_type_round_trip(tmp_path: Path) -> None:
    reg, calls = counting_registry()
    p = Point(1, 2)
    path = tmp_path / "p.inert"
    TL.save({"p": p, "q": p, "other": Point(3, 4)}, path, types=reg)
    tree = json.loads(read_safetensors(path)[0]["__metadata__"]["torchless.tree"])
    assert f"{Point.__module__}:{Point.__qualname__}" in json.dumps(tree)
    y = TL.load(path, types=reg)
    assert type(y["p"]) is Point and (y["p"].x, y["p"].y) == (1, 2)
    assert y["q"] is y["p"]
    assert (y["other"].x, y["other"].y) == (3, 4)
    assert calls == [[1, 2], [3, 4]]


def test_unregistered_type_loads_as_opaque(tmp_path: Path) -> None:
    reg, calls = counting_registry()
    path = tmp_path / "p.inert"
    TL.save([Point(5, 6)], path, types=reg)
    y = TL.load(path, types=TL.TypeRegistry())
    o = y[0]
    assert type(o) is Opaque
    assert o.callable == Global(Point.__module__, Point.__qualname__)
    assert o.newobj is True
    assert o.state == [5, 6]
    assert calls == []


def test_registered_name_without_colon(tmp_path: Path) -> None:
    reg, calls = counting_registry(name="myapp.Point")
    path = tmp_path / "p.inert"
    TL.save(Point(7, 8), path, types=reg)
    y = TL.load(path, types=reg)
    assert (y.x, y.y) == (7, 8) and calls == [[7, 8]]
    o = TL.load(path, types=TL.TypeRegistry())
    assert type(o) is Opaque and o.callable.module == "myapp.Point"


def test_default_registry(tmp_path: Path) -> None:
    class Local:
        def __init__(self, v: int) -> None:
            self.v = v

    TL.register_type(Local, lambda o: o.v, Local,
                            name="tests.test_inert_roundtrip:Local-default")
    path = tmp_path / "l.inert"
    TL.save({"l": Local(9)}, path)
    y = TL.load(path)
    assert type(y["l"]) is Local and y["l"].v == 9


# --------------------------------------------------------------------------- refusals

def _gen() -> Iterator[int]:
    yield 1


UNSUPPORTED: dict[str, Callable[[], Any]] = {
    "lambda": lambda: {"f": lambda: 0},
    "generator": lambda: [_gen()],
    "structured dtype": lambda: np.dtype([("a", "<f4"), ("b", "<i8")]),
    "structured array": lambda: np.zeros(3, dtype=[("a", "<f4")]),
    "module": lambda: {"m": json},
    "cycle through a tuple only": lambda: _tuple_cycle(),
}


def _tuple_cycle() -> Any:
    inner: list[Any] = []
    t = (inner,)
    inner.append(t)
    return t  # the root is the tuple: its own descendant refers to it


@pytest.mark.parametrize("make", list(UNSUPPORTED.values()), ids=list(UNSUPPORTED))
def test_unsupported_values_are_refused_without_leaving_a_file(
        make: Callable[[], Any], tmp_path: Path) -> None:
    path = tmp_path / "out.inert"
    with pytest.raises(torchless.CheckpointError):
        TL.save(make(), path)
    assert list(tmp_path.iterdir()) == []


def test_failed_save_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "out.inert"
    TL.save({"ok": 1}, path)
    before = path.read_bytes()
    with pytest.raises(torchless.CheckpointError):
        TL.save({"ok": 2, "bad": lambda: 0}, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["out.inert"]
    TL.save({"ok": 3}, path)
    assert TL.load(path) == {"ok": 3}


def test_a_path_whose_text_reads_back_as_another_is_refused(tmp_path: Path) -> None:
    odd = PureWindowsPath("//:/")
    assert PureWindowsPath(str(odd)) != odd  # the pathlib quirk itself
    with pytest.raises(torchless.ConversionError, match="reads its text"):
        torchless.save({"p": odd}, tmp_path / "odd.safetensors")
    assert not list(tmp_path.iterdir())
