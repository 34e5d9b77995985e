"""Differential tests: real torch writes the files and is the oracle for what they hold.

Every expected value here comes from torch (the saved objects, or torch.load /
torch.jit.load of the same file), never from torchless itself. Torch is only
imported through the ``torch`` fixture (and ``_torchgen``, which the ``tg``
fixture imports), so without torch these tests skip.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import math
import pathlib
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchless

pytestmark = pytest.mark.torch

PROTOCOLS = (2, 3, 4, 5)

#: What each torch dtype must become in NumPy (the documented mapping).
NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    "float64": np.dtype("<f8"),
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "float8_e4m3fnuz": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "float8_e5m2fnuz": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "int64": np.dtype("<i8"),
    "int32": np.dtype("<i4"),
    "int16": np.dtype("<i2"),
    "int8": np.dtype("i1"),
    "uint8": np.dtype("u1"),
    "uint16": np.dtype("<u2"),
    "uint32": np.dtype("<u4"),
    "uint64": np.dtype("<u8"),
    "bool": np.dtype("?"),
    "complex64": np.dtype("<c8"),
    "complex128": np.dtype("<c16"),
    "complex32": np.dtype([("real", "<f2"), ("imag", "<f2")]),
}
_WIDENED = {"bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"}


@pytest.fixture(scope="session")
def tg(torch: ModuleType) -> ModuleType:
    """The torch-side builders (imports torch, so only after the fixture allowed it)."""
    from tests import _torchgen

    return _torchgen


# ---- comparing one tensor ----------------------------------------------------------------


def _values(arr: np.ndarray[Any, Any], name: str) -> np.ndarray[Any, Any]:
    """torchless's array as plain NumPy values, widened like the torch reference."""
    if name in _WIDENED:
        return arr.astype(np.float32)
    if name == "complex32":
        out = np.empty(arr.shape, np.complex64)
        out.real = arr["real"].astype(np.float32)
        out.imag = arr["imag"].astype(np.float32)
        return out
    return arr


def check_array(tg: ModuleType, arr: Any, t: Any, where: str) -> None:
    """A torchless array against the torch tensor it must equal (dtype, geometry, bytes)."""
    name = tg.dtype_name(t.dtype)
    assert isinstance(arr, np.ndarray), f"{where}: {type(arr).__name__}, not an ndarray"
    assert arr.dtype == NUMPY_DTYPES[name], f"{where}: numpy dtype {arr.dtype} for {name}"
    assert arr.shape == tuple(t.shape), f"{where}: shape {arr.shape} != {tuple(t.shape)}"
    if t.numel() > 0:
        expected = tuple(s * t.element_size() for s in t.stride())
        assert arr.strides == expected, f"{where}: byte strides {arr.strides} != {expected}"
    assert not arr.flags.writeable, f"{where}: the array is writeable"
    assert np.ascontiguousarray(arr).tobytes() == tg.contiguous_bytes(t), f"{where}: bytes differ"
    np.testing.assert_array_equal(_values(arr, name), tg.reference_values(t), err_msg=where)


def check_geometry(tg: ModuleType, tl: Any, t: Any, where: str) -> None:
    """dtype name, shape, stride, storage offset and storage size of a torchless Tensor."""
    assert isinstance(tl, torchless.Tensor), f"{where}: {type(tl).__name__}, not a Tensor"
    assert tl.dtype.name == tg.dtype_name(t.dtype), f"{where}: {tl.dtype} != {t.dtype}"
    assert tl.shape == tuple(t.shape), f"{where}: shape {tl.shape} != {tuple(t.shape)}"
    assert tl.stride == t.stride(), f"{where}: stride {tl.stride} != {t.stride()}"
    assert tl.storage_offset == t.storage_offset(), (
        f"{where}: storage offset {tl.storage_offset} != {t.storage_offset()}")
    assert tl.storage.nbytes == tg.storage_nbytes(t), f"{where}: storage size differs"


def check_tensor(tg: ModuleType, tl: Any, t: Any, where: str) -> None:
    """check_geometry, then the parameter flags and the values."""
    import torch

    check_geometry(tg, tl, t, where)
    assert tl.is_parameter == isinstance(t, torch.nn.Parameter), f"{where}: is_parameter"
    assert tl.requires_grad == t.requires_grad, f"{where}: requires_grad"
    check_array(tg, tl.numpy(), t, where)


def check_storage_sharing(tg: ModuleType, tensors: Any, expected: dict[str, Any]) -> None:
    """Two names view one torchless storage exactly when torch's tensors share a storage
    (empty storages have no address in torch, so they are left out)."""
    names = [k for k, t in expected.items() if tg.storage_nbytes(t) > 0]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            same_torch = tg.storage_id(expected[a]) == tg.storage_id(expected[b])
            same_tl = tensors[a].storage is tensors[b].storage
            assert same_tl == same_torch, f"{a} / {b}: storage shared {same_tl}, torch {same_torch}"


# ---- comparing whole objects ----------------------------------------------------------------


def _same_scalar(exp: Any, act: Any) -> bool:
    if isinstance(exp, float) and math.isnan(exp):
        return isinstance(act, float) and math.isnan(act)
    if isinstance(exp, complex) and (math.isnan(exp.real) or math.isnan(exp.imag)):
        return isinstance(act, complex) and str(exp) == str(act)
    return bool(exp == act)


def assert_same(tg: ModuleType, exp: Any, act: Any, where: str = "root", *,
                tree: bool = False) -> None:
    """``act`` (torchless.load, or Checkpoint.tree with ``tree=True``) against ``exp``
    (what torch.load returned): same container types, keys in the same order, same
    scalars, and every tensor equal to torch's."""
    import torch

    if isinstance(exp, torch.nn.Module):
        assert isinstance(act, collections.OrderedDict), f"{where}: module is {type(act)}"
        exp = exp.state_dict(keep_vars=True)
        assert list(act) == list(exp), f"{where}: state_dict names differ"
        for k in exp:
            assert_same(tg, exp[k], act[k], f"{where}.{k}", tree=tree)
        return
    if isinstance(exp, torch.Tensor):
        if tree:
            check_tensor(tg, act, exp, where)
        else:
            check_array(tg, act, exp, where)
        return
    assert type(act) is type(exp), f"{where}: {type(act).__name__} != {type(exp).__name__}"
    if isinstance(exp, np.ndarray):
        assert act.dtype == exp.dtype and act.shape == exp.shape, where
        if exp.dtype.hasobject:
            assert act.tolist() == exp.tolist(), where
        else:
            assert np.ascontiguousarray(act).tobytes() == np.ascontiguousarray(exp).tobytes()
            np.testing.assert_array_equal(act, exp, err_msg=where)
    elif isinstance(exp, np.generic):
        assert act.dtype == exp.dtype and act.tobytes() == exp.tobytes(), where
    elif isinstance(exp, dict):
        assert list(act) == list(exp), f"{where}: keys {list(act)} != {list(exp)}"
        for k in exp:
            assert_same(tg, exp[k], act[k], f"{where}.{k}", tree=tree)
        if isinstance(exp, collections.defaultdict):
            assert act.default_factory is exp.default_factory, f"{where}: default_factory"
        if isinstance(exp, collections.OrderedDict):
            assert hasattr(act, "_metadata") == hasattr(exp, "_metadata"), f"{where}: _metadata"
            if hasattr(exp, "_metadata"):
                assert_same(tg, exp._metadata, act._metadata, f"{where}._metadata", tree=tree)
    elif isinstance(exp, (list, tuple, collections.deque)):
        assert len(act) == len(exp), f"{where}: length {len(act)} != {len(exp)}"
        if isinstance(exp, collections.deque):
            assert act.maxlen == exp.maxlen, f"{where}: maxlen"
        for i, (e, a) in enumerate(zip(exp, act, strict=True)):
            assert_same(tg, e, a, f"{where}.{i}", tree=tree)
    elif isinstance(exp, argparse.Namespace):
        assert list(vars(act)) == list(vars(exp)), f"{where}: namespace fields"
        for k, v in vars(exp).items():
            assert_same(tg, v, getattr(act, k), f"{where}.{k}", tree=tree)
    elif isinstance(exp, (set, frozenset, str, bytes, bytearray, int, float, complex,
                          datetime.date, datetime.time, datetime.timedelta, datetime.tzinfo,
                          slice, range, pathlib.PurePath, type(None))):
        assert _same_scalar(exp, act), f"{where}: {act!r} != {exp!r}"
        if isinstance(exp, (datetime.datetime, datetime.time)):
            assert act.tzinfo == exp.tzinfo, f"{where}: tzinfo"
    else:  # pragma: no cover - the builders only use the types above
        raise AssertionError(f"{where}: no comparison for {type(exp).__name__}")


def expected_tensor_names(exp: Any) -> dict[str, Any]:
    """Flat tensor names of a torch object, by the documented rule (keys and indices joined
    by '.'; a module whole is its state_dict)."""
    import torch

    out: dict[str, Any] = {}

    def walk(obj: Any, prefix: str) -> None:
        def child(name: Any) -> str:
            return f"{prefix}.{name}" if prefix else str(name)

        if isinstance(obj, torch.Tensor):
            out[prefix] = obj
        elif isinstance(obj, torch.nn.Module):
            for k, v in obj.state_dict(keep_vars=True).items():
                walk(v, child(k))
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, child(k))
        elif isinstance(obj, (list, tuple, collections.deque)):
            for i, v in enumerate(obj):
                walk(v, child(i))
        elif isinstance(obj, argparse.Namespace):
            for k, v in vars(obj).items():
                walk(v, child(k))

    walk(exp, "")
    return out


def check_flat(tg: ModuleType, ckpt: Any, exp: Any) -> None:
    """Checkpoint.tensors: the torch object's tensor names in order, each equal to torch's."""
    names = expected_tensor_names(exp)
    assert list(ckpt.tensors) == list(names)
    for k, t in names.items():
        check_tensor(tg, ckpt.tensors[k], t, k)


def torch_load(torch: ModuleType, path: Path) -> Any:
    return torch.load(path, weights_only=False)


# ---- 1. every dtype x every view x every pickle protocol ------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
def test_dtype_views(torch: ModuleType, tg: ModuleType, tmp_path: Path, dtype: str,
                     protocol: int) -> None:
    saved = tg.views(dtype, seed=protocol)
    path = tmp_path / "views.pt"
    with tg.quiet():
        torch.save(saved, path, pickle_protocol=protocol)
        expected = torch_load(torch, path)
    assert list(expected) == list(saved)
    with torchless.open(path) as ckpt:
        assert ckpt.format == "zip"
        assert not ckpt.unsupported
        assert list(ckpt.tensors) == list(expected)
        for name, t in expected.items():
            check_tensor(tg, ckpt.tensors[name], t, name)
        check_storage_sharing(tg, ckpt.tensors, expected)
    loaded = torchless.load(path)
    assert type(loaded) is dict and list(loaded) == list(expected)
    for name, t in expected.items():
        check_array(tg, loaded[name], t, name)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "complex32", "uint64", "bool"])
@pytest.mark.parametrize("protocol", [2, 5])
def test_bare_tensor_root(torch: ModuleType, tg: ModuleType, tmp_path: Path, dtype: str,
                          protocol: int) -> None:
    t = tg.Rand(tg.dtype(dtype), 7)(6, 5)[1:, ::2]
    path = tmp_path / "bare.pt"
    with tg.quiet():
        torch.save(t, path, pickle_protocol=protocol)
        expected = torch_load(torch, path)
    with torchless.open(path) as ckpt:
        assert list(ckpt.tensors) == [""]
        check_tensor(tg, ckpt.tensors[""], expected, "root")
    with torchless.open(path, root_name="weight") as ckpt:
        assert list(ckpt.tensors) == ["weight"]
        check_tensor(tg, ckpt.tensors["weight"], expected, "root")
    check_array(tg, torchless.load(path), expected, "root")


@pytest.mark.parametrize("protocol", [2, 5])
def test_empty_view_offset_past_storage(torch: ModuleType, tg: ModuleType, tmp_path: Path,
                                        protocol: int) -> None:
    """Empty views may carry a storage offset at or past their storage's end: torch
    saves and loads them (an empty tensor reads no bytes, so torch checks no bounds)."""
    full = torch.arange(6.0).reshape(2, 3)
    saved = {
        "of_empty_storage": torch.zeros(0, 2)[:, 1],  # offset 1 into a 0-byte storage
        "at_end": full[2:],  # offset 6 == storage end (fine)
        "past_end": full[2:].select(1, 1),  # offset 7 > 6 elements
        "full": full,
    }
    path = tmp_path / "empty.pt"
    torch.save(saved, path, pickle_protocol=protocol)
    expected = torch_load(torch, path)
    assert expected["of_empty_storage"].storage_offset() == 1
    assert expected["past_end"].storage_offset() == 7
    with torchless.open(path) as ckpt:
        assert list(ckpt.tensors) == list(expected)
        for name, t in expected.items():
            check_tensor(tg, ckpt.tensors[name], t, name)
    loaded = torchless.load(path)
    for name, t in expected.items():
        check_array(tg, loaded[name], t, name)


# ---- 2. archive variants: deflated members, CRC-less and re-aligned files ---------------------


def _mixed(tg: ModuleType) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dtype in ("float32", "bfloat16", "int8", "complex128", "float8_e5m2", "bool"):
        for view, t in tg.views(dtype, seed=11).items():
            out[f"{dtype}/{view}"] = t
    return out


_DEFLATE: dict[str, Any] = {
    "all": lambda name: True,
    "storages_only": lambda name: "/data/" in name,
    "pickle_only": lambda name: name.endswith("data.pkl"),
}


@pytest.mark.parametrize("protocol", [2, 5])
@pytest.mark.parametrize("deflate", list(_DEFLATE))
def test_deflated_archive(torch: ModuleType, tg: ModuleType, tmp_path: Path, deflate: str,
                          protocol: int) -> None:
    saved = _mixed(tg)
    plain, packed = tmp_path / "plain.pt", tmp_path / "deflated.pt"
    with tg.quiet():
        torch.save(saved, plain, pickle_protocol=protocol)
    tg.repack(plain, packed, _DEFLATE[deflate])
    with zipfile.ZipFile(plain) as a, zipfile.ZipFile(packed) as b:
        assert a.namelist() == b.namelist()
        methods = {i.compress_type for i in b.infolist() if i.file_size > 64}
        assert zipfile.ZIP_DEFLATED in methods
    with tg.quiet():
        expected = torch_load(torch, packed)  # torch itself still reads the re-packed file ...
        original = torch_load(torch, plain)
    for name, t in original.items():  # ... and reads the same values from it
        assert tg.contiguous_bytes(expected[name]) == tg.contiguous_bytes(t), name
    for verify_crc in (False, True):
        with torchless.open(packed, verify_crc=verify_crc) as ckpt:
            assert list(ckpt.tensors) == list(expected)
            for name, t in expected.items():
                check_tensor(tg, ckpt.tensors[name], t, name)
            check_storage_sharing(tg, ckpt.tensors, expected)
    loaded = torchless.load(packed)
    for name, t in expected.items():
        check_array(tg, loaded[name], t, name)


@pytest.mark.parametrize("config", [{"compute_crc32": False}, {"storage_alignment": 4096},
                                    {"storage_alignment": 16}])
def test_save_config_variants(torch: ModuleType, tg: ModuleType, tmp_path: Path,
                              config: dict[str, Any]) -> None:
    saved = _mixed(tg)
    path = tmp_path / "variant.pt"
    with tg.quiet(), tg.save_config(**config):
        torch.save(saved, path)
    with tg.quiet():
        expected = torch_load(torch, path)
    for verify_crc in (False, True):
        with torchless.open(path, verify_crc=verify_crc) as ckpt:
            assert list(ckpt.tensors) == list(expected)
            for name, t in expected.items():
                check_tensor(tg, ckpt.tensors[name], t, name)


def test_deflated_torchscript(torch: ModuleType, tg: ModuleType, tmp_path: Path) -> None:
    plain, packed = tmp_path / "plain.pt", tmp_path / "deflated.pt"
    tg.jit_save(tg.script("custom"), plain)
    tg.repack(plain, packed, lambda name: True)
    expected = tg.jit_state_dict(packed)
    with torchless.open(packed, verify_crc=True) as ckpt:
        assert ckpt.format == "torchscript"
        assert list(ckpt.tensors) == list(expected)
        for name, t in expected.items():
            check_array(tg, ckpt.tensors[name].numpy(), t, name)


@pytest.mark.parametrize("filename", ["weird name.v1.2.pt", "ünïcode.pt", "noext", ".hidden.pt",
                                      "a-b+c.tar"])
def test_archive_prefix(torch: ModuleType, tg: ModuleType, tmp_path: Path,
                        filename: str) -> None:
    """torch derives the archive's top folder from the file name (or 'archive')."""
    path = tmp_path / filename
    saved = {"x": torch.arange(5, dtype=torch.int16)[1::2]}
    torch.save(saved, path)
    with zipfile.ZipFile(path) as z:
        prefix = z.namelist()[0].split("/")[0]
    expected = torch_load(torch, path)
    with torchless.open(path) as ckpt:
        assert ckpt.format == "zip"
        assert ckpt.info["prefix"] == prefix
        check_tensor(tg, ckpt.tensors["x"], expected["x"], "x")


# ---- 3. TorchScript ---------------------------------------------------------------------------


def _check_script(torch: ModuleType, tg: ModuleType, path: Path) -> None:
    expected = tg.jit_state_dict(path)
    with torchless.open(path) as ckpt:
        assert ckpt.format == "torchscript"
        assert list(ckpt.tensors) == list(expected)
        for name, t in expected.items():
            tl = ckpt.tensors[name]
            assert tl.dtype.name == tg.dtype_name(t.dtype), name
            assert tl.shape == tuple(t.shape) and tl.stride == t.stride(), name
            assert tl.storage_offset == t.storage_offset(), name
            check_array(tg, tl.numpy(), t, name)
        check_storage_sharing(tg, ckpt.tensors, expected)
    loaded = torchless.load(path, modules="state_dict")  # a record by default
    assert isinstance(loaded, collections.OrderedDict)
    assert list(loaded) == list(expected)
    for name, t in expected.items():
        check_array(tg, loaded[name], t, name)


@pytest.mark.parametrize("name", ["nested_sequential", "batchnorm", "non_persistent_buffer",
                                  "custom", "outer", "tied"])
def test_torchscript_state_dict(torch: ModuleType, tg: ModuleType, tmp_path: Path,
                                name: str) -> None:
    path = tmp_path / f"{name}.pt"
    tg.jit_save(tg.script(name), path)
    _check_script(torch, tg, path)


def test_torchscript_traced(torch: ModuleType, tg: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "traced.pt"
    tg.jit_save(tg.traced(), path)
    _check_script(torch, tg, path)


def test_torchscript_reloaded_and_resaved(torch: ModuleType, tg: ModuleType,
                                          tmp_path: Path) -> None:
    """A scripted module loaded and saved again (classes now come from the archive)."""
    first, second = tmp_path / "first.pt", tmp_path / "second.pt"
    tg.jit_save(tg.script("outer"), first)
    tg.jit_resave(first, second)
    _check_script(torch, tg, second)


# ---- 4. modules saved whole ---------------------------------------------------------------


@pytest.mark.parametrize("protocol", [2, 5])
@pytest.mark.parametrize("model", ["sequential", "zoo", "net", "bf16_net", "channels_last_conv"])
def test_full_model(torch: ModuleType, tg: ModuleType, tmp_path: Path, model: str,
                    protocol: int) -> None:
    module = tg.MODELS[model]()
    path = tmp_path / "model.pt"
    torch.save(module, path, pickle_protocol=protocol)
    reloaded = torch_load(torch, path)
    assert type(reloaded) is type(module)
    expected = reloaded.state_dict(keep_vars=True)
    assert list(expected) == list(module.state_dict())
    with torchless.open(path) as ckpt:
        assert list(ckpt.tensors) == list(expected)
        for name, t in expected.items():
            check_tensor(tg, ckpt.tensors[name], t, name)
        check_storage_sharing(tg, ckpt.tensors, expected)
        assert isinstance(ckpt.tree, collections.OrderedDict)
    loaded = torchless.load(path, modules="state_dict")  # a record by default
    assert isinstance(loaded, collections.OrderedDict)
    assert_same(tg, reloaded, loaded)
    aliases = [(a, b) for a in expected for b in expected if a < b and expected[a] is expected[b]]
    for a, b in aliases:  # tied weights: one array object under both names
        assert loaded[a] is loaded[b], (a, b)
    if model == "net":
        assert ("embed.weight", "head.weight") in aliases


def test_model_inside_checkpoint(torch: ModuleType, tg: ModuleType, tmp_path: Path) -> None:
    """A module saved whole next to other entries: its names nest under its key."""
    model = tg.net()
    opt = torch.optim.Adam(model.parameters())
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    obj = {"epoch": 3, "model": model, "optimizer": opt.state_dict(), "best": [model.head]}
    path = tmp_path / "ckpt.pt"
    torch.save(obj, path)
    expected = torch_load(torch, path)
    with torchless.open(path) as ckpt:
        check_flat(tg, ckpt, expected)
        assert_same(tg, expected, ckpt.tree, tree=True)
    assert_same(tg, expected, torchless.load(path, modules="state_dict"))


# ---- 5. structure -----------------------------------------------------------------------------


def _rich_object(torch: ModuleType, tg: ModuleType) -> Any:
    torch.manual_seed(5)
    shared = torch.arange(24.0).reshape(4, 6)
    same = torch.randn(3, 2)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    state = model.state_dict()
    assert hasattr(state, "_metadata")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    ns = argparse.Namespace(lr=0.1, layers=[1, 2, 3], name="run", flag=True, weight=same)
    param_with_attr = torch.nn.Parameter(torch.randn(2))
    param_with_attr.tag = "saved through _rebuild_parameter_with_state"
    tagged = tg.Tagged(torch.randn(4))
    tagged.note = "a tensor subclass with state"
    return {
        "state_dict": state,
        "optimizer": opt.state_dict(),
        "plain_od": collections.OrderedDict([("b", 1), ("a", [2, 3])]),
        "scalars": [0, -1, 2**70, -(2**65), 1.5, -0.0, float("inf"), float("-inf"),
                    float("nan"), True, False, None, "", "héllo ✓", b"", b"\x00\xffbytes",
                    1 + 2j, complex(0, -3.5)],
        "nested": {"list": [1, [2, [3, (4, {"deep": torch.ones(2)})]]], "tuple": (),
                   "empty": {}, "empty_list": [], 7: "int key", (1, 2): "tuple key",
                   2.5: "float key", None: "none key"},
        "int_keyed": {0: torch.zeros(2), 1: {"x": torch.ones(1)}},
        "sets": [{1, 2, 3}, frozenset({"a", "b"}), set()],
        "args": ns,
        "when": [datetime.datetime(2024, 2, 29, 13, 14, 15, 123456),
                 datetime.datetime(2021, 1, 1, tzinfo=datetime.timezone.utc),
                 datetime.date(1999, 12, 31), datetime.time(23, 59, 1),
                 datetime.timedelta(days=3, seconds=7, microseconds=11)],
        "numpy": {
            "f32": np.arange(6, dtype=np.float32).reshape(2, 3),
            "fortran": np.asfortranarray(np.arange(12, dtype=np.int64).reshape(3, 4)),
            "bool": np.array([True, False, True]),
            "empty": np.zeros((0, 4), dtype=np.float64),
            "scalar_arr": np.array(3.25),
            "complex": np.array([1 + 2j, 3 - 4j], dtype=np.complex128),
            "strings": np.array(["ab", "cde"]),
            "objects": np.array([1, "two", None], dtype=object),
        },
        "numpy_scalars": [np.float32(1.5), np.float64(-2.25), np.int64(-7), np.int8(3),
                          np.uint32(4000000000), np.bool_(True), np.complex64(1 - 1j),
                          np.float16(0.5)],
        "param": torch.nn.Parameter(torch.randn(2, 3)),
        "frozen_param": torch.nn.Parameter(torch.randn(4), requires_grad=False),
        "grad_tensor": torch.randn(3, requires_grad=True),
        "shared_a": shared,
        "shared_b": shared[1:, ::2],
        "shared_c": shared.t(),
        "same_1": same,
        "same_2": same,
        "same_in_list": [same, shared],
        "bf16": torch.randn(3, 2).to(torch.bfloat16).t(),
        "param_with_attr": param_with_attr,
        "subclass": tagged,
        "subclass_view": torch.randn(2, 3).as_subclass(tg.Tagged).t(),
    }


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_structure(torch: ModuleType, tg: ModuleType, tmp_path: Path, protocol: int) -> None:
    path = tmp_path / "rich.pt"
    torch.save(_rich_object(torch, tg), path, pickle_protocol=protocol)
    expected = torch_load(torch, path)
    loaded = torchless.load(path)
    assert_same(tg, expected, loaded)
    with torchless.open(path) as ckpt:
        assert_same(tg, expected, ckpt.tree, tree=True)
        check_flat(tg, ckpt, expected)
        check_storage_sharing(tg, ckpt.tensors, expected_tensor_names(expected))
    # the same tensor object referenced twice stays one array
    assert expected["same_1"] is expected["same_2"]
    assert loaded["same_1"] is loaded["same_2"] is loaded["same_in_list"][0]
    assert loaded["args"].weight is loaded["same_1"]
    # views of one storage that overlap share memory; a different storage does not
    assert np.shares_memory(loaded["shared_a"], loaded["shared_b"])
    assert np.shares_memory(loaded["shared_a"], loaded["shared_c"])
    assert not np.shares_memory(loaded["shared_a"], loaded["same_1"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_state_dict_metadata(torch: ModuleType, tg: ModuleType, tmp_path: Path,
                             protocol: int) -> None:
    """A state_dict saved alone: an OrderedDict whose _metadata survives, names in order."""
    model = tg.net()
    state = model.state_dict()
    path = tmp_path / "sd.pt"
    torch.save(state, path, pickle_protocol=protocol)
    expected = torch_load(torch, path)
    assert isinstance(expected, collections.OrderedDict) and hasattr(expected, "_metadata")
    loaded = torchless.load(path)
    assert_same(tg, expected, loaded)
    with torchless.open(path) as ckpt:
        check_flat(tg, ckpt, expected)
        check_storage_sharing(tg, ckpt.tensors, dict(expected))


@pytest.mark.parametrize("protocol", [2, 5])
def test_structure_stdlib_extras(torch: ModuleType, tg: ModuleType, tmp_path: Path,
                                 protocol: int) -> None:
    """collections, pathlib, slice/range and bytearray values rebuild as torch.load does."""
    obj = {
        "defaultdict": collections.defaultdict(list, {"a": [1], "b": [torch.ones(2)]}),
        "counter": collections.Counter("abracadabra"),
        "deque": collections.deque([1, torch.zeros(1), 3], maxlen=5),
        "deque_unbounded": collections.deque(["x"]),
        "slice": slice(1, 9, 2),
        "range": range(2, 11, 3),
        "pure_path": pathlib.PurePosixPath("runs/exp1"),
        "path": pathlib.Path("/data/x.bin"),
        "bytearray": bytearray(b"\x00abc\xff"),
        "od_in_list": [collections.OrderedDict(z=1, a=torch.arange(3))],
    }
    path = tmp_path / "extras.pt"
    torch.save(obj, path, pickle_protocol=protocol)
    expected = torch_load(torch, path)
    assert_same(tg, expected, torchless.load(path))
    with torchless.open(path) as ckpt:
        check_flat(tg, ckpt, expected)


@pytest.mark.parametrize("protocol", [2, 5])
def test_torch_values_in_checkpoint(torch: ModuleType, tg: ModuleType, tmp_path: Path,
                                    protocol: int) -> None:
    """torch.Size, dtypes and devices saved as values: Size is a tuple of the same ints,
    a dtype names the same type, a device is its string."""
    obj = {"size": torch.Size([2, 3]), "dtype": torch.bfloat16, "half": torch.half,
           "device": torch.device("cpu"), "indexed": torch.device("cpu", 0)}
    path = tmp_path / "values.pt"
    torch.save(obj, path, pickle_protocol=protocol)
    expected = torch_load(torch, path)
    loaded = torchless.load(path)
    assert loaded["size"] == tuple(expected["size"])
    assert type(loaded["size"]) is tuple
    assert loaded["dtype"].name == tg.dtype_name(expected["dtype"])
    assert loaded["half"].name == tg.dtype_name(expected["half"])
    assert loaded["device"] == str(expected["device"])
    assert loaded["indexed"] == str(expected["indexed"])


@pytest.mark.parametrize("code", [">u2", ">f8", ">c8", "<i4"])
def test_numpy_array_byte_order(torch: ModuleType, tg: ModuleType, tmp_path: Path,
                                code: str) -> None:
    """NumPy arrays saved inside a checkpoint load as torch.load (pickle) returns them:
    NumPy's unpickler byte-swaps non-native arrays to native order."""
    arr = np.arange(-3, 5).astype(code)
    path = tmp_path / "np.pt"
    torch.save({"arr": arr, "dtype": arr.dtype}, path)
    expected = torch_load(torch, path)
    loaded = torchless.load(path)
    np.testing.assert_array_equal(loaded["arr"], expected["arr"])
    assert loaded["arr"].dtype == expected["arr"].dtype, (loaded["arr"].dtype,
                                                          expected["arr"].dtype)
    assert loaded["dtype"] == expected["dtype"]


# ---- 6. random shapes, strides and views --------------------------------------------------


@st.composite
def _view_recipe(draw: st.DrawFn) -> dict[str, Any]:
    ndim = draw(st.integers(0, 4))
    shape = draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim))
    ops: list[tuple[Any, ...]] = []
    dims = ndim
    sizes = list(shape)
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["permute", "slice", "select", "expand", "unsqueeze"]))
        if kind == "permute" and dims > 1:
            perm = draw(st.permutations(range(dims)))
            ops.append(("permute", tuple(perm)))
            sizes = [sizes[p] for p in perm]
        elif kind == "slice" and dims > 0:
            d = draw(st.integers(0, dims - 1))
            start = draw(st.integers(0, sizes[d]))
            stop = draw(st.integers(start, sizes[d]))
            step = draw(st.integers(1, 3))
            ops.append(("slice", d, start, stop, step))
            sizes[d] = len(range(start, stop, step))
        elif kind == "select" and dims > 0:
            d = draw(st.integers(0, dims - 1))
            if sizes[d] > 0:
                i = draw(st.integers(0, sizes[d] - 1))
                ops.append(("select", d, i))
                del sizes[d]
                dims -= 1
        elif kind == "expand":
            ones = [d for d in range(dims) if sizes[d] == 1]
            if ones:
                d = draw(st.sampled_from(ones))
                n = draw(st.integers(0, 4))
                ops.append(("expand", d, n))
                sizes[d] = n
        elif kind == "unsqueeze" and dims < 5:
            d = draw(st.integers(0, dims))
            ops.append(("unsqueeze", d))
            sizes.insert(d, 1)
            dims += 1
    return {"shape": tuple(shape), "ops": ops,
            "dtype": draw(st.sampled_from(["float32", "bfloat16", "int16", "complex64", "bool",
                                           "float8_e4m3fn", "complex32", "uint32"])),
            "protocol": draw(st.sampled_from(PROTOCOLS)),
            "seed": draw(st.integers(0, 2**16))}


def _apply(t: Any, ops: list[tuple[Any, ...]]) -> Any:
    for op in ops:
        if op[0] == "permute":
            t = t.permute(*op[1])
        elif op[0] == "slice":
            _, d, start, stop, step = op
            index = [slice(None)] * t.dim()
            index[d] = slice(start, stop, step)
            t = t[tuple(index)]
        elif op[0] == "select":
            t = t.select(op[1], op[2])
        elif op[0] == "expand":
            sizes = list(t.shape)
            sizes[op[1]] = op[2]
            t = t.expand(*sizes)
        else:
            t = t.unsqueeze(op[1])
    return t


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipe=_view_recipe())
def test_random_views(torch: ModuleType, tg: ModuleType,
                      tmp_path_factory: pytest.TempPathFactory, recipe: dict[str, Any]) -> None:
    rnd = tg.Rand(tg.dtype(recipe["dtype"]), recipe["seed"])
    with tg.quiet():
        base = rnd(*recipe["shape"])
        view = _apply(base, recipe["ops"])
        path = tmp_path_factory.mktemp("hyp") / "view.pt"
        torch.save({"view": view, "base": base}, path, pickle_protocol=recipe["protocol"])
        expected = torch_load(torch, path)
    with torchless.open(path) as ckpt:
        assert list(ckpt.tensors) == ["view", "base"]
        check_tensor(tg, ckpt.tensors["view"], expected["view"], "view")
        check_tensor(tg, ckpt.tensors["base"], expected["base"], "base")
        assert ckpt.tensors["view"].storage is ckpt.tensors["base"].storage
