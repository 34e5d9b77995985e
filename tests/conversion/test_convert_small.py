"""Converting many small tensors: their bytes read from the file into the gather buffer with
``os.preadv`` (:meth:`torchless.write.stream.Writer.read`), the pieces that follow each other
in the file in one call, against the path that copies them from the source's map. Both give
torch's bytes; short reads are retried, a file that ends early is an error with no output.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import torchless
from tests.conversion.test_convert import check_against_torch
from tests.reader.test_differential_torch import tg  # noqa: F401 (a fixture)
from torchless.write import stream as _stream

pytestmark = pytest.mark.torch


def _saved(torch: ModuleType) -> dict[str, Any]:
    """Small tensors whose name order is not their storages' order in the file (keys sort
    as text: 0, 1, 10, 100 …), views at an offset into a shared storage, several dtypes,
    an empty one and one big enough for the kernel-copy path."""
    flat = torch.arange(3000, dtype=torch.float32)
    out: dict[str, Any] = {f"t{i:03d}": torch.full((50 + i,), float(i)) for i in range(120)}
    out.update({"view_a": flat[10:400], "view_b": flat[400:2900], "half": torch.ones(
        33, dtype=torch.float16), "i64": torch.arange(7, dtype=torch.int64),
        "bool": torch.ones(5, dtype=torch.bool), "empty": torch.zeros(0),
        "big": torch.arange(300_000, dtype=torch.float32)})
    return out


def _convert(src: Path, dst: Path) -> bytes:
    torchless.convert(src, dst)
    return dst.read_bytes()


def test_read_path_equals_the_map_path_and_torch(torch: ModuleType, tg: ModuleType,  # noqa: F811
                                                 tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    saved = _saved(torch)
    src = tmp_path / "m.pt"
    torch.save(saved, src)
    calls: list[int] = []
    real = os.preadv

    def spy(fd: int, buffers: list[memoryview], offset: int) -> int:
        calls.append(len(buffers))
        return real(fd, buffers, offset)

    with monkeypatch.context() as m:
        m.setattr(os, "preadv", spy)
        read = _convert(src, tmp_path / "read.st")
    # some pieces followed each other in the file: fewer calls than small tensors
    assert calls and len(calls) < len(saved) - 2 and max(calls) > 1, calls
    with monkeypatch.context() as m:
        m.delattr(os, "preadv")
        mapped = _convert(src, tmp_path / "map.st")
    assert read == mapped
    # one piece a call, the buffer flushed every 64 bytes, at most 3 buffers a call
    with monkeypatch.context() as m:
        m.setattr(_stream, "READ_GAP_BYTES", 0)
        m.setattr(_stream, "GATHER_BYTES", 4096)
        m.setattr(_stream, "_IOV_MAX", 3)
        assert _convert(src, tmp_path / "tight.st") == mapped
    check_against_torch(torch, tg, src, tmp_path / "read.st", saved)


def test_short_reads_are_retried(torch: ModuleType, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A preadv that returns fewer bytes than asked (as the system may) is continued from
    where it stopped, mid-buffer too."""
    src = tmp_path / "m.pt"
    torch.save(_saved(torch), src)
    reference = _convert(src, tmp_path / "ref.st")
    real = os.preadv
    short: list[int] = []

    def stingy(fd: int, buffers: list[memoryview], offset: int) -> int:
        want = sum(len(b) for b in buffers)
        got = real(fd, [memoryview(buffers[0])[:37]], offset) if want > 37 else real(
            fd, buffers, offset)
        if got < want:
            short.append(got)
        return got

    monkeypatch.setattr(os, "preadv", stingy)
    assert _convert(src, tmp_path / "short.st") == reference
    assert short


def test_a_file_ending_early_is_an_error_and_leaves_nothing(
        torch: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "m.pt"
    torch.save(_saved(torch), src)
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(os, "preadv", lambda fd, buffers, offset: 0)
    with pytest.raises(torchless.ConversionError, match="ended early"):
        torchless.convert(src, out / "o.st")
    assert list(out.iterdir()) == []


def test_deflated_and_other_archives_are_not_read_by_offset(
        torch: ModuleType, tg: ModuleType, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a stored member of the very file converted says where its bytes are: deflated
    members (whose file bytes are not the tensor's) go the streaming way, also once a
    strided view written first ("a") has inflated their storage for the slice after it."""
    grid = torch.arange(600, dtype=torch.float32).reshape(20, 30)
    saved = {f"t{i}": torch.full((40,), float(i)) for i in range(20)}
    saved.update({"a": grid.t(), "b": grid[2]})
    plain, packed = tmp_path / "m.pt", tmp_path / "d.pt"
    torch.save(saved, plain)
    tg.repack(plain, packed, lambda name: "/data/" in name)
    with zipfile.ZipFile(packed) as z:
        assert any(i.compress_type == zipfile.ZIP_DEFLATED for i in z.infolist())
    monkeypatch.setattr(os, "preadv", lambda *a: pytest.fail("no read by offset"))
    torchless.convert(packed, tmp_path / "d.st")
    check_against_torch(torch, tg, packed, tmp_path / "d.st", saved)
