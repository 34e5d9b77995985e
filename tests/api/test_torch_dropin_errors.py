"""Issue 26 row 5: the drop-in's refusals are the exceptions code around ``torch.load``
catches. A refused global and a malformed pickle are ``pickle.UnpicklingError`` (what
``torch.load(weights_only=True)`` raises for the same file, asked here first) and still
torchless's own errors."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import torchless
import torchless.torch as tt

pytestmark = pytest.mark.torch


class _System:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch should-not-exist",))


def _torch_refuses(torch: ModuleType, path: Path) -> None:
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)


def test_a_refused_global_is_an_unpickling_error(torch: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(2), "x": _System()}, path)
    _torch_refuses(torch, path)
    with pytest.raises(pickle.UnpicklingError) as info:
        tt.load(path)
    e = info.value
    assert isinstance(e, torchless.UnsafeGlobalError) and isinstance(e, torchless.CheckpointError)
    assert type(e).__name__ == "UnsafeGlobalError" and e.path == str(path)
    assert any(n.endswith(".system") for n in e.names)
    try:  # the error torchless documents catches it too
        tt.load(path, weights_only=True)
    except torchless.CheckpointError as caught:
        assert isinstance(caught, pickle.UnpicklingError)
    else:
        pytest.fail("no error")
    with tt.patched(), pytest.raises(pickle.UnpicklingError):  # as a library's torch.load
        torch.load(path)
    # sent to another process (multiprocessing pickles exceptions), it is torchless's own
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is torchless.UnsafeGlobalError and again.names == e.names
    assert str(again) == str(e)
    assert not (tmp_path / "should-not-exist").exists()
    assert not Path("should-not-exist").exists()


def test_strict_refusals_are_unpickling_errors(torch: ModuleType, tmp_path: Path) -> None:
    import collections

    path = tmp_path / "odd.pt"
    torch.save({"c": collections.ChainMap({"a": 1})}, path)
    _torch_refuses(torch, path)
    assert isinstance(tt.load(path)["c"], torchless.Opaque)  # not strict: an inert record
    with pytest.raises(pickle.UnpicklingError):
        tt.load(path, strict=True)


def test_a_malformed_pickle_is_an_unpickling_error(torch: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "bad.pt"
    bad = b"\x80\x02}q\x00\xfe."  # 0xfe is no opcode
    writer = torch._C.PyTorchFileWriter(str(path))
    for name, data in (("data.pkl", bad), ("byteorder", b"little"), ("version", b"3\n")):
        writer.write_record(name, data, len(data))
    writer.write_end_of_file()
    del writer
    _torch_refuses(torch, path)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=False)  # pickle's own: invalid load key
    with pytest.raises(pickle.UnpicklingError) as info:
        tt.load(path)
    assert isinstance(info.value, torchless.PickleError)
    assert isinstance(info.value, ValueError)  # what PickleError always was


def test_other_errors_are_unchanged(torch: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "trunc.pt"
    torch.save({"w": torch.ones(4)}, path)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(torchless.FormatError) as info:
        tt.load(path)
    assert not isinstance(info.value, pickle.UnpicklingError)
    with pytest.raises(FileNotFoundError):
        tt.load(tmp_path / "absent.pt")
