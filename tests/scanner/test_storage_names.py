"""Storage names, by loader: the scanner and the reader follow torch 2.13's find_class.

torch's ``UnpicklerWrapper.find_class`` (``torch/serialization.py``) returns
``StorageType(name)`` for a name of its storage table whatever the module, and imports the
module for any other name, ``*Storage`` or not; the legacy stream's header pickles are read
with plain ``pickle.load``, where every name is an import. Expected verdicts follow from
that code and from the import verdicts (a ``__main__`` module runs a program on import; an
unknown package is unvetted); the one file loaded with torch (in a subprocess) names only
``collections``.
"""

from __future__ import annotations

import pickle
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import torchless
from tests._fuzz_inputs import zip_checkpoint
from torchless.errors import UnsafeGlobalError
from torchless.scanner.files import FileScan, scan

MAGIC = 0x1950A86A20F9469CFC6C


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _uni(s: str) -> bytes:
    return b"X" + struct.pack("<I", len(s)) + s.encode()


def _tensor_pickle(storage_module: str, storage_name: str) -> bytes:
    """``_rebuild_tensor_v2`` of two float32 elements on storage '0' whose type is named
    ``storage_module.storage_name``."""
    pid = b"(" + _uni("storage") + _global(storage_module, storage_name) + _uni("0") + \
        _uni("cpu") + b"K\x02tQ"
    args = b"(" + pid + b"K\x00K\x02\x85K\x01\x85\x89" + _global("collections", "OrderedDict") \
        + b")Rt"
    return b"\x80\x02" + _global("torch._utils", "_rebuild_tensor_v2") + args + b"R."


def _legacy(sys_info: bytes, obj: bytes) -> bytes:
    return (pickle.dumps(MAGIC, protocol=2) + pickle.dumps(1001, protocol=2) + sys_info + obj
            + pickle.dumps([], protocol=2))


def _scan(tmp_path: Path, name: str, data: bytes) -> FileScan:
    path = tmp_path / name
    path.write_bytes(data)
    report = scan(str(path))
    assert len(report.files) == 1
    return report.files[0]


def _alone(module: str, name: str) -> bytes:
    return b"\x80\x02" + _global(module, name) + b"."


@pytest.mark.parametrize(("module", "name", "status"), [
    # a storage name of torch's table: StorageType, nothing imported, whatever the module
    ("os", "FloatStorage", "clean"),
    ("lib2to3.__main__", "HalfStorage", "clean"),
    # any other *Storage name falls through to the import of its module
    ("lib2to3.__main__", "Float8_e4m3fnStorage", "dangerous"),
    ("no_such_mod", "Float8_e4m3fnStorage", "unvetted"),
    ("os", "UntypedStorage", "dangerous"),
    ("torch.storage", "UntypedStorage", "clean"),
])
def test_zip_data_pkl(tmp_path: Path, module: str, name: str, status: str) -> None:
    got = _scan(tmp_path, "a.pt", zip_checkpoint(_alone(module, name)))
    assert got.status == status, (got.status, got.actions)
    if status == "dangerous":  # the reader refuses what the scanner calls dangerous
        with pytest.raises(UnsafeGlobalError):
            torchless.load(str(tmp_path / "a.pt"))


@pytest.mark.parametrize(("module", "name", "status"), [
    ("os", "FloatStorage", "dangerous"),  # a plain pass imports os
    ("no_such_mod", "FloatStorage", "unvetted"),
    ("collections", "OrderedDict", "clean"),
])
def test_legacy_sys_info_is_a_plain_pass(tmp_path: Path, module: str, name: str,
                                         status: str) -> None:
    sys_info = b"\x80\x02}" + _uni("little_endian") + b"\x88s" + _uni("x") + \
        _global(module, name) + b"s."  # a dict, as torch writes: nothing but the name is odd
    got = _scan(tmp_path, "a.pt", _legacy(sys_info, pickle.dumps({}, protocol=2)))
    assert got.status == status, (got.status, got.actions)


def test_legacy_object_maps_storage_names(tmp_path: Path) -> None:
    """The object pickle is read by torch's wrapper: os.FloatStorage imports nothing."""
    data = _legacy(pickle.dumps({}, protocol=2), _alone("os", "FloatStorage"))
    assert _scan(tmp_path, "a.pt", data).status == "clean"


def test_reader_refuses_an_import_in_a_plain_pass(tmp_path: Path) -> None:
    path = tmp_path / "a.pt"
    path.write_bytes(_legacy(_alone("os", "FloatStorage"), pickle.dumps({}, protocol=2)))
    with pytest.raises(UnsafeGlobalError, match=r"os\.FloatStorage"):
        torchless.load(str(path))


def test_storage_type_under_any_module_reads_as_torch_reads_it(tmp_path: Path) -> None:
    """``collections.FloatStorage`` in a persistent id: torch maps the name, reads the tensor;
    so does the reader, and the scan is clean."""
    pytest.importorskip("torch")
    path = tmp_path / "a.pt"
    path.write_bytes(zip_checkpoint(_tensor_pickle("collections", "FloatStorage"),
                                    {"0": struct.pack("<2f", 1.5, -2.0)}))
    cp = subprocess.run([sys.executable, "-c", "import sys, torch; print(torch.load(sys.argv[1], "
                         "weights_only=False).tolist())", str(path)], capture_output=True,
                        text=True, timeout=300, check=False)
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert cp.stdout.strip() == "[1.5, -2.0]"
    assert torchless.load(str(path)).tolist() == [1.5, -2.0]
    assert _scan(tmp_path, "b.pt", path.read_bytes()).status == "clean"


def test_plain_pickle_file_is_a_plain_pass(tmp_path: Path) -> None:
    """torch.load reads a plain pickle file as a legacy stream: its first pickle is the
    magic number, read with plain ``pickle.load``, so a storage name there is an import (torch
    itself shows it on a module that does not exist); a ``__main__`` module is dangerous."""
    pytest.importorskip("torch")
    path = tmp_path / "a.pkl"
    path.write_bytes(_alone("no_such_mod", "FloatStorage"))
    cp = subprocess.run([sys.executable, "-c", "import sys, torch\ntry:\n torch.load(sys.argv[1], "
                         "weights_only=False)\nexcept ImportError as e:\n print(e.name)",
                         str(path)], capture_output=True, text=True, timeout=300, check=False)
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert cp.stdout.strip() == "no_such_mod"
    assert _scan(tmp_path, "a.pkl", path.read_bytes()).status == "unvetted"
    got = _scan(tmp_path, "b.pkl", _alone("lib2to3.__main__", "FloatStorage"))
    assert got.status == "dangerous", got.actions
    with pytest.raises(UnsafeGlobalError):
        torchless.load(str(tmp_path / "b.pkl"))
