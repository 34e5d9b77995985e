"""Converting checkpoints whose storages are deflated ZIP members: streamed, bounded memory.

The expectation is always the conversion of the same checkpoint with stored (uncompressed)
members, which the rest of the suite checks against torch and the safetensors package, and
torch's own reading of the re-packed file.
"""

from __future__ import annotations

import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import torchless
from tests.reader.test_differential_torch import tg  # noqa: F401 (a fixture)
from torchless.containers.ziparchive import ZipArchive
from torchless.core.limits import Limits
from torchless.errors import CheckpointError, ChecksumError
from torchless.io.source import Source
from torchless.model import chunks as _chunks
from torchless.model import tensor as _tensor

pytestmark = pytest.mark.torch

MiB = 1 << 20


def _pair(torch: ModuleType, tg: ModuleType, tmp_path: Path, obj: object,  # noqa: F811
          deflate: bool = True) -> tuple[Path, Path]:
    """The same checkpoint twice, under one file name: as torch saved it and re-packed with
    every member deflated."""
    (tmp_path / "stored").mkdir()
    (tmp_path / "deflated").mkdir()
    plain, packed = tmp_path / "stored" / "m.pt", tmp_path / "deflated" / "m.pt"
    with tg.quiet():
        torch.save(obj, plain)
    tg.repack(plain, packed, lambda name: deflate)
    with zipfile.ZipFile(packed) as z:
        assert all(i.compress_type == zipfile.ZIP_DEFLATED for i in z.infolist())
    return plain, packed


def _mixed(torch: ModuleType) -> dict[str, object]:
    g = torch.Generator().manual_seed(4)
    base = torch.randn(64, 48, generator=g)
    fused = torch.randn(3 * 40, 24, generator=g)
    q, k, v = fused.split(40)  # three views of one storage, at offsets
    return {
        "w": base,
        "wt": base.t(),  # strided view of the same storage: the chunked path
        "q": q, "k": k, "v": v,
        "bf16": torch.randn(33, 17, generator=g).to(torch.bfloat16),
        "i8": torch.randint(-128, 127, (1000,), generator=g, dtype=torch.int8),
        "b": torch.rand(7, 5, generator=g) > 0.5,
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.zeros(0, 3),
        "big": torch.randn(3 * MiB // 4 + 3, generator=g),  # several inflate chunks
    }


def test_deflated_converts_like_stored(torch: ModuleType, tg: ModuleType,  # noqa: F811
                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # small inflate chunks, so that every tensor of some size takes several of them
    monkeypatch.setattr(_chunks, "INFLATE_CHUNK_BYTES", 64 << 10)
    plain, packed = _pair(torch, tg, tmp_path, _mixed(torch))
    a = torchless.convert(plain, tmp_path / "a.safetensors")
    b = torchless.convert(packed, tmp_path / "b.safetensors")
    assert (a.tensors, a.bytes) == (b.tensors, b.bytes)
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    import safetensors.torch

    with tg.quiet():
        expected = torch.load(packed, weights_only=True)  # torch reads the re-packed file
    got = safetensors.torch.load_file(tmp_path / "b.safetensors")
    assert sorted(got) == sorted(expected)
    for name, t in expected.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name], t.contiguous()), name
    assert torchless.verify(packed, tmp_path / "b.safetensors").ok


def test_streaming_does_not_load_the_storage(torch: ModuleType, tg: ModuleType,  # noqa: F811
                                             tmp_path: Path) -> None:
    _, packed = _pair(torch, tg, tmp_path, {"x": torch.arange(1000.0)})
    with torchless.open(packed) as ckpt:
        t = ckpt.tensors["x"]
        blocks = list(t.storage.iter_bytes(400, 4000, 1000))
        assert len(blocks) >= 4 and all(0 < len(x) <= 1000 for x in blocks)
        assert b"".join(blocks) == torch.arange(1000.0).numpy().tobytes()[400:4000]
        assert t.storage.streams  # still not loaded: reading it did not keep the bytes
        assert t.numpy().tobytes() == torch.arange(1000.0).numpy().tobytes()
        assert not t.storage.streams  # loaded now: later reads come from memory
        blocks = list(t.storage.iter_bytes(400, 4000, 1000))
        assert [len(x) for x in blocks] == [1000, 1000, 1000, 600]
        assert b"".join(blocks) == torch.arange(1000.0).numpy().tobytes()[400:4000]


def _traced_peak(run: Callable[[], object]) -> int:
    """The peak of Python-traced memory while ``run`` runs."""
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_deflated_memory_is_bounded(torch: ModuleType, tg: ModuleType,  # noqa: F811
                                    tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(1)
    big = torch.randint(0, 1 << 12, (16 * MiB,), generator=g, dtype=torch.int32).float()
    plain, packed = _pair(torch, tg, tmp_path, {"big": big, "small": big[:10].clone()})
    del big
    assert packed.stat().st_size > 16 * MiB  # really compressed data, not a trivial stream
    torchless.convert(plain, tmp_path / "a.safetensors")
    peak = _traced_peak(lambda: torchless.convert(packed, tmp_path / "b.safetensors"))
    assert peak < 20 * MiB, f"peak {peak / MiB:.1f} MiB while converting a 64 MiB tensor"
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


def test_deflated_views_are_inflated_once_into_a_spill_file(
        torch: ModuleType, tg: ModuleType, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Strided views and slices of one deflated 64 MiB storage: the storage is inflated once,
    into a temporary file read through a map, not into memory and not once per view."""
    g = torch.Generator().manual_seed(2)
    big = torch.randint(0, 1 << 12, (16 * MiB,), generator=g, dtype=torch.int32).float()
    square = big.view(4096, 4096)
    obj = {"t": square.t(), "even_rows": square[::2], "q": square[:100], "k": square[100:300]}
    plain, packed = _pair(torch, tg, tmp_path, obj)
    del big, square, obj
    torchless.convert(plain, tmp_path / "a.safetensors")
    inflated: list[str] = []
    spill = _tensor.Storage.spill

    def counting(self: _tensor.Storage, *args: Any, **kwargs: Any) -> None:
        if self.streams:
            inflated.append(self.key)
        spill(self, *args, **kwargs)

    monkeypatch.setattr(_tensor.Storage, "spill", counting)
    peak = _traced_peak(lambda: torchless.convert(packed, tmp_path / "b.safetensors"))
    assert inflated == ["0"]
    assert peak < 40 * MiB, f"peak {peak / MiB:.1f} MiB for views of a 64 MiB storage"
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    assert not [p for p in tmp_path.iterdir() if "torchless" in p.name]  # spill file unlinked
    assert torchless.verify(packed, tmp_path / "b.safetensors").ok


def _corrupt(packed: Path, member: str, edit: str) -> Path:
    """A copy of ``packed`` whose ``member`` has a wrong CRC or invalid deflate data."""
    raw = bytearray(packed.read_bytes())
    with zipfile.ZipFile(packed) as z:
        info = z.getinfo(member)
    with Source(packed) as src:
        e = ZipArchive(src, Limits()).entries[member]
        start = e.data_offset
    if edit == "crc":
        new_crc = (info.CRC ^ 1).to_bytes(4, "little")
        old_crc = info.CRC.to_bytes(4, "little")
        assert raw.count(old_crc) == 2  # local header and central directory
        raw = bytearray(bytes(raw).replace(old_crc, new_crc))
    else:  # the first deflate block header says block type 3, which does not exist
        raw[start] |= 0x06
    out = packed.with_name("bad.pt")
    out.write_bytes(bytes(raw))
    return out


def test_stream_checks_crc_and_size(torch: ModuleType, tg: ModuleType,  # noqa: F811
                                    tmp_path: Path) -> None:
    _, packed = _pair(torch, tg, tmp_path, {"x": torch.randn(50000)})
    with zipfile.ZipFile(packed) as z:
        member = next(n for n in z.namelist() if n.endswith("data/0"))
        expected = z.read(member)
    with Source(packed) as src:
        archive = ZipArchive(src, Limits())
        got = b"".join(archive.iter_member(member, 4096, check_crc=True))
        assert got == expected == bytes(archive.data(member, check_crc=True))
    bad = _corrupt(packed, member, "crc")
    with Source(bad) as src:
        archive = ZipArchive(src, Limits())
        with pytest.raises(ChecksumError):
            b"".join(archive.iter_member(member, 4096, check_crc=True))
        with pytest.raises(ChecksumError):
            archive.data(member, check_crc=True)  # the whole-member path agrees
    bad = _corrupt(packed, member, "data")
    with Source(bad) as src:
        archive = ZipArchive(src, Limits())
        with pytest.raises(CheckpointError):
            archive.data(member, check_crc=True)
        with pytest.raises(CheckpointError):
            b"".join(archive.iter_member(member, 4096, check_crc=True))
    out = tmp_path / "bad.safetensors"
    with pytest.raises(CheckpointError):
        torchless.convert(bad, out)
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


_RSS_CHILD = r"""
import sys, torchless

def hwm():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) * 1024

with torchless.open(sys.argv[1]) as ckpt:  # imports and parsing out of the measurement
    ckpt.tensors["big"].shape
before = hwm()
torchless.convert(sys.argv[1], sys.argv[2])
print(hwm() - before)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_stored_copy_resident_memory_is_flat(torch: ModuleType, tmp_path: Path) -> None:
    """A 128 MiB stored tensor is written from the map without its pages piling up in the
    process: the resident high-water mark grows by far less than the tensor (the map's pages
    are released every RELEASE_BYTES)."""
    import subprocess
    import sys

    src = tmp_path / "big.pt"
    torch.save({"big": torch.ones(32 * MiB)}, src)  # 128 MiB of float32
    out = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(src), str(tmp_path / "o.st")],
                         capture_output=True, text=True, check=True)
    growth = int(out.stdout)
    assert growth < 48 * MiB, f"resident set grew by {growth / MiB:.0f} MiB for 128 MiB"
    with open(tmp_path / "o.st", "rb") as f:
        f.seek(-4, 2)
        assert f.read() == b"\x00\x00\x80\x3f"  # the last float32 1.0, little-endian
