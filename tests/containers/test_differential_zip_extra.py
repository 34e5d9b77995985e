"""Differential tests for ZIP checkpoints that tests/reader/test_differential_torch.py does
not cover.

1. Big-endian archives: a torch.save archive re-packed with ``byteorder`` = ``big`` and every
   storage byte-swapped per element, as a big-endian host's torch writes it.
2. TorchScript archives holding a buffer of every dtype ``torch.jit.save`` writes.
3. ZIP64: an archive of more than 65,535 members, and a member larger than 4 GiB.

Expected values come from torch (torch.load / torch.jit.load of the same or of the original
file) or from the bytes the test itself wrote, never from torchless. Torch is only imported
through the ``torch`` fixture.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import re
import shutil
import struct
import types
import warnings
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import torchless
from tests.reader.test_differential_torch import (
    NUMPY_DTYPES,
    _check_script,
    _values,
    check_array,
    check_geometry,
    check_storage_sharing,
    check_tensor,
)

pytestmark = pytest.mark.torch

#: The README lists float8_e8m0fnu among the dtypes torchless reads; the main differential
#: file does not cover it (torch cannot turn it into NumPy itself).
E8M0 = "float8_e8m0fnu"
NATIVE: dict[str, np.dtype[Any]] = {**NUMPY_DTYPES, E8M0: np.dtype(ml_dtypes.float8_e8m0fnu)}
VALUE_DTYPES: tuple[str, ...] = (*NUMPY_DTYPES, E8M0)


@pytest.fixture(scope="session")
def tg(torch: ModuleType) -> ModuleType:
    """The torch-side builders (imports torch, so only after the fixture allowed it)."""
    from tests import _torchgen

    return _torchgen


# ---- comparing ----------------------------------------------------------------------------


def check_values(tg: ModuleType, arr: Any, t: Any, where: str, *, strides: bool = True) -> None:
    """A torchless array against a torch tensor: native NumPy dtype, shape, (byte strides),
    read-only, the bytes of the C-order copy and the values. Delegates to the main file's
    ``check_array`` where it applies."""
    name = tg.dtype_name(t.dtype)
    if strides and name in NUMPY_DTYPES:
        check_array(tg, arr, t, where)
        return
    assert isinstance(arr, np.ndarray), f"{where}: {type(arr).__name__}, not an ndarray"
    assert arr.dtype == NATIVE[name], f"{where}: numpy dtype {arr.dtype} for {name}"
    assert arr.shape == tuple(t.shape), f"{where}: shape {arr.shape} != {tuple(t.shape)}"
    if strides and t.numel() > 0:
        expected = tuple(s * t.element_size() for s in t.stride())
        assert arr.strides == expected, f"{where}: byte strides {arr.strides} != {expected}"
    assert not arr.flags.writeable, f"{where}: the array is writeable"
    assert np.ascontiguousarray(arr).tobytes() == tg.contiguous_bytes(t), f"{where}: bytes differ"
    if name == E8M0:
        got, ref = arr.astype(np.float32), t.float().numpy()
    else:
        got, ref = _values(arr, name), tg.reference_values(t)
    np.testing.assert_array_equal(got, ref, err_msg=where)


def storage_bytes(torch: ModuleType, t: Any) -> bytes:
    """The raw bytes of a tensor's whole storage (works for dtypes without any kernels)."""
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()).numpy().tobytes()


def assert_plain_layout(path: Path) -> None:
    """What torchless's strict reader wants, checked with zipfile and struct: members stored,
    back to back from byte 0, each local header agreeing with its central entry, the
    central directory right after the last member, no data descriptors."""
    raw = path.read_bytes()
    with zipfile.ZipFile(path) as z:
        infos, cd_start = z.infolist(), z.start_dir
    pos = 0
    for info in infos:
        assert info.header_offset == pos, f"{info.filename}: gap before its local header"
        assert raw[pos:pos + 4] == b"PK\x03\x04"
        flags, method, _, _, crc, csize, usize, nlen, elen = struct.unpack_from(
            "<HHHHIIIHH", raw, pos + 6)
        assert method == info.compress_type == zipfile.ZIP_STORED, info.filename
        assert flags == info.flag_bits and not flags & 0x08, info.filename
        assert (crc, csize, usize) == (info.CRC, info.compress_size, info.file_size)
        assert raw[pos + 30:pos + 30 + nlen] == info.filename.encode(), info.filename
        pos += 30 + nlen + elen + info.compress_size
    assert pos == cd_start, "bytes between the last member and the central directory"


# ---- 1. big-endian archives -----------------------------------------------------------------

#: torch.save pickles these through UntypedStorage + _rebuild_tensor_v3 (no typed storage
#: class exists for them), so torch.load byte-swaps their storage as uint8: it ignores the
#: byteorder record for them and returns the bytes as stored. torchless returns the values
#: the writer had (as it does for big-endian legacy files, docs/security.md).
TORCH_IGNORES_BYTEORDER = frozenset({"uint16", "uint32", "uint64", "complex32"})


def _big_endian_saved(torch: ModuleType, tg: ModuleType) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, name in enumerate(VALUE_DTYPES):
        with tg.quiet():
            base = tg.Rand(tg.dtype(name), 100 + i)(4, 6)
            out[name] = base
            out[f"{name}.transposed"] = base.t()
            out[f"{name}.offset"] = base[1:, 2:]
            out[f"{name}.expanded"] = base[2, 3:4].expand(3, 5)
    return out


def byteswap_archive(torch: ModuleType, src: Path, dst: Path, saved: dict[str, Any]) -> None:
    """Re-pack ``src`` (same member order and names, stored) as a big-endian host writes it:
    byteorder record ``big``, every storage swapped per element (per component for complex).
    Which dtype a storage record holds is found by matching its bytes to the saved tensors."""
    dtype_of: dict[bytes, Any] = {storage_bytes(torch, t): t.dtype for t in saved.values()}
    assert len(dtype_of) == len(VALUE_DTYPES), "storages must be told apart by their bytes"
    swapped = set()
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            record = info.filename.split("/", 1)[1]
            if record == "byteorder":
                assert data == b"little"
                data = b"big"
            elif record.startswith("data/"):
                dt = dtype_of[data]
                unit = dt.itemsize // 2 if dt.is_complex else dt.itemsize
                data = np.frombuffer(data, f"<u{unit}").astype(f">u{unit}").tobytes()
                swapped.add(dt)
            zout.writestr(info.filename, data)
    assert len(swapped) == len(VALUE_DTYPES)


@pytest.fixture(scope="module")
def big_endian(torch: ModuleType, tg: ModuleType,
               tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The big-endian archive and what the writer saved (torch.load of the original)."""
    saved = _big_endian_saved(torch, tg)
    folder = tmp_path_factory.mktemp("bigendian")
    little, big = folder / "little.pt", folder / "big.pt"
    with tg.quiet():
        torch.save(saved, little)
    byteswap_archive(torch, little, big, saved)
    with tg.quiet():
        original = torch.load(little, weights_only=False)
    return big, original


def test_big_endian_torch_oracle(torch: ModuleType, tg: ModuleType,
                                 big_endian: tuple[Path, dict[str, Any]]) -> None:
    """torch.load honours the byteorder record: the swapped archive gives the original
    values (except the dtypes torch pickles as untyped storages, see above)."""
    path, original = big_endian
    assert_plain_layout(path)
    with tg.quiet():
        loaded = torch.load(path, weights_only=False)
    assert list(loaded) == list(original)
    ignored = set()
    for name, t in original.items():
        got = loaded[name]
        assert got.dtype == t.dtype and got.shape == t.shape, name
        assert got.stride() == t.stride() and got.storage_offset() == t.storage_offset(), name
        if tg.contiguous_bytes(got) != tg.contiguous_bytes(t):
            ignored.add(tg.dtype_name(t.dtype))
    assert ignored <= TORCH_IGNORES_BYTEORDER, f"torch did not swap {ignored}"
    # the test is only worth something if torch swapped the multi-byte typed storages
    assert {"float64", "float32", "bfloat16", "int16", "complex64"}.isdisjoint(ignored)


def test_big_endian_torchless(torch: ModuleType, tg: ModuleType,
                              big_endian: tuple[Path, dict[str, Any]]) -> None:
    path, original = big_endian
    with torchless.open(path) as ckpt:
        assert ckpt.format == "zip"
        assert ckpt.info["byteorder"] == "big"
        assert not ckpt.unsupported
        assert list(ckpt.tensors) == list(original)
        for name, t in original.items():
            check_geometry(tg, ckpt.tensors[name], t, name)
            check_values(tg, ckpt.tensors[name].numpy(), t, name, strides=False)
        check_storage_sharing(tg, ckpt.tensors, original)
    loaded = torchless.load(path)
    assert list(loaded) == list(original)
    for name, t in original.items():
        check_values(tg, loaded[name], t, name, strides=False)


def test_big_endian_numpy_keeps_torch_strides(torch: ModuleType, tg: ModuleType,
                                              big_endian: tuple[Path, dict[str, Any]]) -> None:
    """Tensor.numpy() promises torch's strides. A big-endian file needs a byte-swapped copy,
    but the copy can be the whole storage swapped once and viewed with torch's strides (as
    for little-endian files), instead of a C-order copy of each view: that loses the
    strides, the sharing between views, and materialises stride-0 (expanded) views."""
    path, original = big_endian
    wrong = []
    with torchless.open(path) as ckpt:
        for dtype in ("float32", "complex128", "uint16"):
            for view in ("transposed", "offset", "expanded"):
                name = f"{dtype}.{view}"
                t = original[name]
                arr = ckpt.tensors[name].numpy()
                check_values(tg, arr, t, name, strides=False)
                expected = tuple(s * t.element_size() for s in t.stride())
                if arr.strides != expected:
                    wrong.append(f"{name}: byte strides {arr.strides} != torch's {expected}")
    assert not wrong, "\n".join(wrong)


# ---- 2. TorchScript x every dtype -----------------------------------------------------------

#: Quantized tensors: torchless lists them in Checkpoint.unsupported (README).
QUANTIZED = ("qint8", "quint8", "qint32", "quint4x2", "quint2x4")
#: Dtypes torchless knows but NumPy cannot hold: readable geometry, numpy() refused.
NO_NUMPY = ("bits8", "bits16", "bits1x8", "bits2x4", "bits4x2", "float4_e2m1fn_x2")
#: Sub-byte integer shells torch.save refuses but TorchScript writes; torchless has no
#: dtype for them, so a clean refusal is accepted as well as a correct read.
SUB_BYTE = tuple(f"{s}int{b}" for s in ("", "u") for b in range(1, 8))
ALL_DTYPES = (*VALUE_DTYPES, *QUANTIZED, *NO_NUMPY, *SUB_BYTE)

#: dtype -> pattern of torch's own error where torch.jit.save refuses the dtype
#: (none does in torch 2.13 when the tensor is built properly).
JIT_SAVE_REFUSES: dict[str, str] = {}
#: dtype -> pattern of torch's error where torch.jit.load cannot read back what
#: torch.jit.save wrote (packed quantized storages are saved at half/quarter size).
JIT_LOAD_FAILS = {"quint4x2": r"require a storage of at least \d+ bytes",
                  "quint2x4": r"require a storage of at least \d+ bytes"}


def _one_dtype_module(torch: ModuleType, tg: ModuleType, name: str) -> Any:
    """Buffers of one dtype (a base, a transposed and an offset view of it, a row of it in a
    submodule) next to float parameters and, for ordinary dtypes, a parameter of the dtype."""
    dt = getattr(torch, name)
    torch.manual_seed(ALL_DTYPES.index(name))
    with tg.quiet():
        if name in QUANTIZED:
            with warnings.catch_warnings():  # torch 2.13 deprecates quantized creation
                warnings.filterwarnings("ignore", message=r"torch\.quantize_per_tensor",
                                        category=UserWarning)
                base = torch.quantize_per_tensor(torch.randn(3, 4), 0.25, 3, dt)
        else:
            base = tg.Rand(dt, ALL_DTYPES.index(name))(3, 4)
        m = torch.nn.Module()
        m.weight = torch.nn.Parameter(torch.randn(2, 3).t())
        m.register_buffer("base", base)
        m.register_buffer("transposed", base.t())
        m.register_buffer("offset", base[1:, 1:])
        m.sub = torch.nn.Module()
        m.sub.register_buffer("row", base[2])
        m.sub.scale = torch.nn.Parameter(torch.randn(4))
        if name in VALUE_DTYPES:
            own = tg.Rand(dt, 7)(5, 2)
            m.own = torch.nn.Parameter(own[1:], requires_grad=False)
    return m


def _jit_save_or_skip(torch: ModuleType, tg: ModuleType, module: Any, path: Path,
                      name: str) -> dict[str, Any]:
    """Script and save the module, and return torch.jit.load(path).state_dict(); skip the
    dtypes torch itself cannot round-trip (with torch's reason checked)."""
    try:
        with tg._no_jit_deprecation(), tg.quiet():
            torch.jit.save(torch.jit.script(module), path)
    except Exception as e:
        assert name in JIT_SAVE_REFUSES, f"torch.jit.save refused {name}: {e}"
        assert re.search(JIT_SAVE_REFUSES[name], str(e)), str(e)
        pytest.skip(f"torch.jit.save refuses {name}: {str(e).splitlines()[0]}")
    try:
        with tg.quiet():
            return tg.jit_state_dict(path)
    except RuntimeError as e:
        assert name in JIT_LOAD_FAILS, f"torch.jit.load failed on {name}: {e}"
        assert re.search(JIT_LOAD_FAILS[name], str(e)), str(e)
        pytest.skip(f"torch.jit.load cannot read back {name}: {str(e).splitlines()[0]}")


def _check_script_values(tg: ModuleType, path: Path, expected: dict[str, Any]) -> None:
    with torchless.open(path) as ckpt:
        assert ckpt.format == "torchscript"
        assert not ckpt.unsupported
        assert list(ckpt.tensors) == list(expected)
        for key, t in expected.items():
            check_geometry(tg, ckpt.tensors[key], t, key)
            check_values(tg, ckpt.tensors[key].numpy(), t, key)
        check_storage_sharing(tg, ckpt.tensors, expected)
    loaded = torchless.load(path)
    assert list(loaded) == list(expected)
    for key, t in expected.items():
        check_values(tg, loaded[key], t, key)


@pytest.mark.parametrize("name", ALL_DTYPES)
def test_torchscript_dtype(torch: ModuleType, tg: ModuleType, tmp_path: Path,
                           name: str) -> None:
    if not isinstance(getattr(torch, name, None), torch.dtype):
        pytest.skip(f"this torch has no torch.{name}")
    path = tmp_path / f"{name}.pt"
    expected = _jit_save_or_skip(torch, tg, _one_dtype_module(torch, tg, name), path, name)
    assert {"base", "transposed", "offset", "sub.row", "weight", "sub.scale"} <= set(expected)
    assert expected["offset"].storage_offset() == 5  # views survive torch.jit.save
    if name in VALUE_DTYPES:
        _check_script_values(tg, path, expected)
        return
    if name in QUANTIZED:
        with torchless.open(path) as ckpt:
            quantized = [k for k, t in expected.items() if t.is_quantized]
            assert quantized == ["base", "transposed", "offset", "sub.row"]
            assert dict(ckpt.unsupported) == dict.fromkeys(quantized, "quantized")
            plain = [k for k in expected if k not in quantized]
            assert list(ckpt.tensors) == plain
            for key in plain:  # state_dict() detaches: requires_grad is not comparable
                check_geometry(tg, ckpt.tensors[key], expected[key], key)
                check_values(tg, ckpt.tensors[key].numpy(), expected[key], key)
            with pytest.raises(torchless.UnsupportedError, match="quantized"):
                ckpt.numpy("base")
            from tests import _kinds_oracle as ko

            for key in quantized:  # records of torch's parts
                record = ckpt.records[key].map(lambda t: t.numpy())
                assert not ko.differences(ko.parts_of_record(record),
                                          ko.torch_parts(expected[key])), key
        torchless.load(path)  # every tensor is read: the quantized ones as records
        return
    try:
        ckpt = torchless.open(path)
    except torchless.CheckpointError as e:
        if name in SUB_BYTE:  # no torchless dtype: refusing the file cleanly is fine
            return
        raise AssertionError(f"torchless refused a TorchScript file with a {name} buffer "
                             f"(a torch.save file with one opens): {e}") from e
    with ckpt:
        assert [k for k in expected if k in ckpt.tensors] == list(ckpt.tensors)
        assert set(ckpt.tensors) | set(ckpt.unsupported) == set(expected)
        for key, t in expected.items():
            if key in ckpt.unsupported:
                assert name in SUB_BYTE, f"{key}: listed as {ckpt.unsupported[key]}"
                continue
            check_geometry(tg, ckpt.tensors[key], t, key)
            if tg.dtype_name(t.dtype) in NUMPY_DTYPES:
                check_values(tg, ckpt.tensors[key].numpy(), t, key)
                continue
            with pytest.raises(torchless.UnsupportedError, match="NumPy"):
                ckpt.tensors[key].numpy()
            tl_bytes = bytes(ckpt.tensors[key].storage.buffer())
            assert tl_bytes == storage_bytes(torch, t), f"{key}: storage bytes differ"


def test_torchscript_all_dtypes_one_module(torch: ModuleType, tg: ModuleType,
                                           tmp_path: Path) -> None:
    """Every dtype of the main differential file as buffers of one scripted module, with
    views, parameters and nesting: names in state_dict order, values, storage sharing."""
    torch.manual_seed(0)
    root = torch.nn.Module()
    root.first = torch.nn.Parameter(torch.randn(3, 2))
    for i, name in enumerate(NUMPY_DTYPES):
        with tg.quiet():
            base = tg.Rand(tg.dtype(name), 50 + i)(4, 3)
            child = torch.nn.Module()
            child.register_buffer("base", base)
            child.register_buffer("transposed", base.t())
            child.register_buffer("offset", base[1:, 1:])
            if name.startswith(("float", "bfloat", "complex")):
                child.param = torch.nn.Parameter(tg.Rand(tg.dtype(name), i)(2, 5).t())
            setattr(root, f"m_{name}", child)
    root.register_buffer("last", torch.arange(6).reshape(2, 3)[:, 1:])
    path = tmp_path / "all.pt"
    tg.jit_save(_script(torch, tg, root), path)
    _check_script(torch, tg, path)


def _script(torch: ModuleType, tg: ModuleType, module: Any) -> Any:
    with tg._no_jit_deprecation(), tg.quiet():
        return torch.jit.script(module)


# ---- 3. ZIP64 ---------------------------------------------------------------------------------


class _StorageRef:
    """Pickled as the persistent id of storage ``key`` (numel elements of ``cls``)."""

    def __init__(self, cls: Any, key: str, numel: int) -> None:
        self.cls, self.key, self.numel = cls, key, numel


class _TensorRef:
    """Pickled as torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False, hooks),
    exactly what torch.save writes for a tensor."""

    def __init__(self, rebuild: Any, storage: _StorageRef, offset: int, size: tuple[int, ...],
                 stride: tuple[int, ...], hooks: Any) -> None:
        self.args = (rebuild, (storage, offset, size, stride, False, hooks))

    def __reduce__(self) -> Any:
        return self.args


class _TorchPickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, _StorageRef):
            return ("storage", obj.cls, obj.key, "cpu", obj.numel)
        return None


def torch_pickle(obj: Any) -> bytes:
    buf = io.BytesIO()
    _TorchPickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


def write_zip(path: Path, pkl: bytes, records: Iterable[tuple[str, bytes]]) -> None:
    """A torch-layout archive written by zipfile: data.pkl, byteorder, the storages, version."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", b"little")
        for key, data in records:
            z.writestr(f"archive/data/{key}", data)
        z.writestr("archive/version", b"3\n")


def zip64_end(path: Path) -> tuple[int, int]:
    """(entries in the classic end record, entries in the ZIP64 end record) of an archive
    without comment."""
    with open(path, "rb") as f:
        f.seek(-42, os.SEEK_END)
        tail = f.read()
        loc_sig, _, rec_off, _ = struct.unpack_from("<4sIQI", tail, 0)
        sig, _, _, _, classic, _, _, comment = struct.unpack_from("<4sHHHHIIH", tail, 20)
        assert sig == b"PK\x05\x06" and comment == 0
        assert loc_sig == b"PK\x06\x07", "no ZIP64 end-of-directory locator"
        f.seek(rec_off)
        rec_sig, _, _, _, _, _, _, total, _, _ = struct.unpack("<4sQHHIIQQQQ", f.read(56))
    assert rec_sig == b"PK\x06\x06", "no ZIP64 end-of-directory record"
    return classic, total


class _SampleUnpickler(pickle.Unpickler):
    """Lets torch.load rebuild only the tensors whose storage key is in ``sample`` (the
    others stay None): torch reads the same ZIP64 directory and pickle, but 70,000 full
    storage loads would take torch ~13 s. torch assigns ``persistent_load`` after building
    the unpickler; the property keeps torch's function and routes through ``_route``."""

    sample: frozenset[str] = frozenset()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._torch_persistent_load: Any = None
        super().__init__(*args, **kwargs)

    @property
    def persistent_load(self) -> Any:
        return self._route

    @persistent_load.setter
    def persistent_load(self, fn: Any) -> None:
        self._torch_persistent_load = fn

    def _route(self, pid: Any) -> Any:
        return self._torch_persistent_load(pid) if pid[2] in self.sample else None

    def find_class(self, module: str, name: str) -> Any:
        fn = super().find_class(module, name)
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda storage, *args: None if storage is None else fn(storage, *args)
        return fn


def torch_load_sample(torch: ModuleType, path: Path, keys: Iterable[str]) -> dict[str, Any]:
    mod = types.ModuleType("sample_pickle")
    mod.Unpickler = type("Unpickler", (_SampleUnpickler,),
                         {"sample": frozenset(keys)})
    loaded = torch.load(path, weights_only=False, pickle_module=mod)
    return {k: v for k, v in loaded.items() if v is not None}


@pytest.mark.slow
def test_zip64_many_members(torch: ModuleType, tg: ModuleType, tmp_path: Path) -> None:
    """70,000 one-byte tensors: 70,003 members, more than a classic end record can count."""
    n = 70_000
    size, hooks = (1,), collections.OrderedDict()  # shared: the pickle memoises them
    keys = [str(i) for i in range(n)]  # one str object per name: the pickle memoises it
    obj = {k: _TensorRef(torch._utils._rebuild_tensor_v2, _StorageRef(torch.ByteStorage, k, 1),
                         0, size, size, hooks) for k in keys}
    path = tmp_path / "many.pt"
    write_zip(path, torch_pickle(obj), ((k, bytes([i % 256])) for i, k in enumerate(keys)))
    classic, total = zip64_end(path)
    assert classic == 0xFFFF and total == n + 3

    # torch reads the same archive: a sample of tensors through torch.load itself
    sample = [str(i) for i in (*range(0, n, 997), 255, 256, 65535, 65536, n - 1)]
    expected = torch_load_sample(torch, path, sample)
    assert sorted(expected, key=int) == sorted(set(sample), key=int)
    for k, t in expected.items():
        assert t.dtype == torch.uint8 and t.tolist() == [int(k) % 256], k

    with torchless.open(path) as ckpt:
        assert ckpt.format == "zip"
        assert list(ckpt.tensors) == keys
        for k, t in expected.items():
            check_tensor(tg, ckpt.tensors[k], t, k)
        values = np.empty(n, np.uint8)
        for i, (k, tl) in enumerate(ckpt.tensors.items()):
            assert (tl.dtype.name, tl.shape, tl.stride, tl.storage_offset) == (
                "uint8", (1,), (1,), 0), k
            values[i] = tl.numpy()[0]
    np.testing.assert_array_equal(values, np.arange(n) % 256)


# -- a member larger than 4 GiB, in a sparse file --------------------------------------------

_CRC_POLY = 0xEDB88320


def _gf2_times(mat: list[int], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32 of A + B from crc(A), crc(B) and len(B) (zlib's crc32_combine)."""
    if len2 <= 0:
        return crc1
    odd = [_CRC_POLY] + [1 << n for n in range(31)]  # one zero bit
    even = [_gf2_times(odd, odd[n]) for n in range(32)]  # two zero bits
    odd = [_gf2_times(even, even[n]) for n in range(32)]  # four zero bits
    while True:
        even = [_gf2_times(odd, odd[n]) for n in range(32)]
        if len2 & 1:
            crc1 = _gf2_times(even, crc1)
        len2 >>= 1
        if not len2:
            break
        odd = [_gf2_times(even, even[n]) for n in range(32)]
        if len2 & 1:
            crc1 = _gf2_times(odd, crc1)
        len2 >>= 1
        if not len2:
            break
    return crc1 ^ crc2


def crc32_zeros_then(n_zeros: int, tail: bytes) -> int:
    """CRC-32 of ``n_zeros`` zero bytes followed by ``tail`` (n_zeros a power of two times
    64 KiB), by doubling: crc(Z + Z) = combine(crc(Z), crc(Z), len(Z))."""
    length, crc = 1 << 16, zlib.crc32(bytes(1 << 16))
    while length < n_zeros:
        crc, length = crc32_combine(crc, crc, length), length * 2
    assert length == n_zeros
    return crc32_combine(crc, zlib.crc32(tail), len(tail))


def _local(name: bytes, crc: int, csize: int, usize: int, extra: bytes = b"",
           need: int = 20) -> bytes:
    return struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", need, 0, 0, 0, 0x21, crc, csize, usize,
                       len(name), len(extra)) + name + extra


def _central(name: bytes, crc: int, csize: int, usize: int, offset: int, extra: bytes = b"",
             need: int = 20) -> bytes:
    return struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", need, need, 0, 0, 0, 0x21, crc,
                       csize, usize, len(name), len(extra), 0, 0, 0, 0, offset) + name + extra


def write_huge_archive(path: Path, pkl: bytes, size: int, tail: bytes) -> None:
    """By hand: data.pkl, version and byteorder, then a stored ``data/0`` of ``size`` bytes
    (zeros, then ``tail``) with ZIP64 sizes in local and central extra fields, the central
    directory (past 4 GiB), a ZIP64 end record, its locator and a classic end record."""
    small = [(b"archive/data.pkl", pkl), (b"archive/version", b"3\n"),
             (b"archive/byteorder", b"little")]
    big_name = b"archive/data/0"
    big_crc = crc32_zeros_then(size - len(tail), tail)
    sizes64 = struct.pack("<HHQQ", 1, 16, size, size)
    central = []
    with open(path, "wb") as f:
        for name, data in small:
            crc = zlib.crc32(data)
            central.append(_central(name, crc, len(data), len(data), f.tell()))
            f.write(_local(name, crc, len(data), len(data)) + data)
        central.append(_central(big_name, big_crc, 0xFFFFFFFF, 0xFFFFFFFF, f.tell(), sizes64,
                                need=45))
        f.write(_local(big_name, big_crc, 0xFFFFFFFF, 0xFFFFFFFF, sizes64, need=45))
        f.seek(size - len(tail), os.SEEK_CUR)  # the hole: size - 8 zero bytes
        f.write(tail)
        cd_off = f.tell()
        cd = b"".join(central)
        f.write(cd)
        eocd64_off = f.tell()
        n = len(central)
        f.write(struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, n, n, len(cd),
                            cd_off))
        f.write(struct.pack("<4sIQI", b"PK\x06\x07", 0, eocd64_off, 1))
        f.write(struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, n, n, len(cd), 0xFFFFFFFF, 0))


def test_crc32_combine_matches_zlib() -> None:
    """The CRC helper the 4 GiB test relies on, against zlib on sizes zlib can do at once."""
    tail = bytes(range(1, 9))
    for n_zeros in (1 << 16, 1 << 17, 1 << 20):
        assert crc32_zeros_then(n_zeros, tail) == zlib.crc32(bytes(n_zeros) + tail)
    assert crc32_combine(zlib.crc32(b"abc"), zlib.crc32(b"defg"), 4) == zlib.crc32(b"abcdefg")


@pytest.fixture
def sparse_dir(tmp_path: Path) -> Iterator[Path]:
    """tmp_path, if its filesystem keeps holes as holes; every file is deleted afterwards."""
    if shutil.disk_usage(tmp_path).free < 256 << 20:
        pytest.skip("less than 256 MiB free for the sparse 4 GiB archive")
    probe = tmp_path / "probe"
    try:
        with open(probe, "wb") as f:
            f.seek(64 << 20)
            f.write(b"\x01")
        if not hasattr(os.stat(probe), "st_blocks") or os.stat(probe).st_blocks * 512 > 8 << 20:
            pytest.skip("the filesystem does not keep sparse files sparse")
    finally:
        probe.unlink(missing_ok=True)
    try:
        yield tmp_path
    finally:
        for p in tmp_path.iterdir():
            p.unlink()


def test_zip64_member_over_4gib(torch: ModuleType, sparse_dir: Path) -> None:
    size = (1 << 32) + 8
    tail = bytes([1, 2, 3, 0x7F, 0x80, 0xAA, 0xFE, 0xFF])
    hooks = collections.OrderedDict()
    storage = _StorageRef(torch.ByteStorage, "0", size)
    rebuild = torch._utils._rebuild_tensor_v2
    views = {  # name -> (offset, size, stride)
        "whole": (0, (size,), (1,)),
        "tail": (size - 8, (8,), (1,)),
        "across_4gib": ((1 << 32) - 8, (2, 8), (8, 1)),
        "strided_tail": (size - 7, (2, 2), (4, 2)),
    }
    obj = {k: _TensorRef(rebuild, storage, off, shape, stride, hooks)
           for k, (off, shape, stride) in views.items()}
    pkl = torch_pickle(obj)
    path = sparse_dir / "huge.pt"
    try:
        write_huge_archive(path, pkl, size, tail)
    except OSError as e:  # e.g. EFBIG on filesystems without files past 4 GiB
        pytest.skip(f"cannot write a sparse file past 4 GiB here: {e}")
    assert os.stat(path).st_size > size
    if os.stat(path).st_blocks * 512 > 64 << 20:
        pytest.skip("the filesystem allocated the hole")

    # an independent reader agrees the directory is well-formed
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("archive/data/0")
        assert (info.file_size, info.compress_size) == (size, size)
        assert z.read("archive/data.pkl") == pkl
    classic, total = zip64_end(path)
    assert (classic, total) == (4, 4)

    with torchless.open(path) as ckpt:
        assert ckpt.format == "zip"
        assert list(ckpt.tensors) == list(views)
        for k, (off, shape, stride) in views.items():
            tl = ckpt.tensors[k]
            assert (tl.dtype.name, tl.shape, tl.stride, tl.storage_offset) == (
                "uint8", shape, stride, off), k
            assert tl.storage.nbytes == size, k
        assert ckpt.tensors["whole"].storage is ckpt.tensors["tail"].storage
        whole = ckpt.tensors["whole"].numpy()
        assert whole.shape == (size,) and not whole.flags.writeable
        assert whole[-8:].tobytes() == tail
        assert not whole[:4096].any() and not whole[(1 << 32) - 4096:(1 << 32)].any()
        assert ckpt.tensors["tail"].numpy().tobytes() == tail
        across = ckpt.tensors["across_4gib"].numpy()
        np.testing.assert_array_equal(across, np.stack([np.zeros(8, np.uint8),
                                                        np.frombuffer(tail, np.uint8)]))
        strided = ckpt.tensors["strided_tail"].numpy()
        expected = np.frombuffer(tail, np.uint8)[1:][np.array([[0, 2], [4, 6]])]
        np.testing.assert_array_equal(strided, expected)
        del whole, across, strided
