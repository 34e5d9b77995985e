"""ZIP64 as torch writes it, read as torch reads it.

torch.save writes through miniz with ZIP64 on from the start: a ZIP64 end record and locator
in every archive, and, for each member that is 4 GiB or larger or whose local header starts
at 4 GiB or later, a ZIP64 extra field in both headers and a data descriptor with 8-byte
sizes. The first test writes a real checkpoint of more than 4 GiB with torch.save and reads
it with every entry point; the unit tests build small archives of the same form by hand
(the ZIP64 treatment given to members at small offsets, which the format allows) and hold
torchless to what torch.load does with the same bytes.

Expected values come from torch (torch.load of the same file), from the bytes the tests
write, or from the ZIP format (APPNOTE 4.3.9, 4.5.3), never from torchless.
"""

from __future__ import annotations

import hashlib
import io
import json
import mmap
import struct
import subprocess
import sys
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import torchless
from torchless import AmbiguousArchiveError, ArchiveFormatError, UnsupportedError
from torchless.scanner.files import FileScan, scan

pytestmark = pytest.mark.torch

_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
_EOCD64 = struct.Struct("<4sQHHIIQQQQ")
_LOCATOR = struct.Struct("<4sIQI")
_EOCD = struct.Struct("<4sHHHHIIH")
U32 = 0xFFFFFFFF


def sha256(buf: Any) -> str:
    h = hashlib.sha256()
    view = memoryview(buf).cast("B")
    for i in range(0, len(view), 1 << 26):
        h.update(view[i:i + (1 << 26)])
    return h.hexdigest()


def extra_fields(extra: bytes) -> dict[int, bytes]:
    out, i = {}, 0
    while i < len(extra):
        tag, size = struct.unpack_from("<HH", extra, i)
        out[tag] = extra[i + 4:i + 4 + size]
        i += 4 + size
    assert i == len(extra), "malformed extra block"
    return out


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchless", *args], capture_output=True,
                          text=True, timeout=300)


# ---- a real torch.save of more than 4 GiB ----------------------------------------------------

#: One byte more than 4 GiB + 4: the big member is a ZIP64 member by size, and every member
#: torch writes after it starts past 4 GiB.
BIG = (1 << 32) + 5
#: Bytes set at known places, so that misplaced data changes the hashes: the first byte,
#: both sides of the 4 GiB boundary, the last byte.
MARKS = {0: 3, (1 << 32) - 1: 0x41, 1 << 32: 0x42, BIG - 1: 7}


@pytest.fixture(scope="module")
def big_checkpoint(torch: ModuleType, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[Path]:
    """A torch.save file of three tensors, the first larger than 4 GiB; deleted afterwards
    (with whatever the tests wrote beside it). The big tensor is torch.empty: the tests
    compare torch's bytes with torchless's and need no content but MARKS, and pages never
    written cost neither time nor memory (they read as zeros)."""
    folder = tmp_path_factory.mktemp("zip64_torch")
    path = folder / "big.pt"
    try:
        big = torch.empty(BIG, dtype=torch.uint8)
        for pos, value in MARKS.items():
            big[pos] = value
        torch.save({"big": big, "after": torch.arange(6, dtype=torch.float32) / 3,
                    "last": torch.tensor([1, -2, 1 << 40], dtype=torch.int64)}, path)
        del big
        yield path
    finally:
        for p in folder.iterdir():
            p.unlink()


@pytest.fixture(scope="module")
def torch_tensors(torch: ModuleType, big_checkpoint: Path) -> dict[str, tuple[str, tuple[int, ...],
                                                                              str]]:
    """name -> (dtype, shape, sha256 of the bytes) as torch.load (mapped) reads them."""
    loaded = torch.load(big_checkpoint, mmap=True, weights_only=True)
    out = {k: (str(t.dtype).removeprefix("torch."), tuple(t.shape), sha256(t.numpy()))
           for k, t in loaded.items()}
    del loaded
    return out


@pytest.mark.slow
def test_torch_writes_zip64_members_past_4gib(big_checkpoint: Path) -> None:
    """What torch.save writes, checked with zipfile and struct: the premise of the tests
    below (if torch changes its writer, this says how)."""
    with zipfile.ZipFile(big_checkpoint) as z:
        infos = z.infolist()
    names = [i.filename.split("/", 1)[1] for i in infos]
    assert names[:5] == ["data.pkl", ".format_version", ".storage_alignment", "byteorder",
                         "data/0"]
    with open(big_checkpoint, "rb") as f:
        def read(pos: int, n: int) -> bytes:
            f.seek(pos)
            return f.read(n)

        for info in infos:
            h = info.header_offset
            (sig, _, flags, method, _, _, crc, csize, usize, nlen, elen) = _LOCAL.unpack(
                read(h, _LOCAL.size))
            assert (sig, flags, method, crc, csize, usize) == (b"PK\x03\x04", 0x0808, 0, 0, 0,
                                                               0)
            local = extra_fields(read(h + 30 + nlen, elen))
            data_end = h + 30 + nlen + elen + info.file_size
            descriptor = read(data_end, 24)
            assert descriptor[:4] == b"PK\x07\x08"
            if info.file_size >= U32:  # ZIP64 by size: (size, compressed size so far = 0)
                assert local[1] == struct.pack("<QQ", info.file_size, 0)
            elif h >= U32:  # ZIP64 by offset: the local header's own offset
                assert local[1] == struct.pack("<Q", h)
            else:
                assert 1 not in local
                assert descriptor[4:16] == struct.pack("<III", info.CRC, info.file_size,
                                                       info.file_size)
                continue
            assert descriptor[4:24] == struct.pack("<IQQ", info.CRC, info.file_size,
                                                   info.file_size)
        late = [i for i in infos if i.header_offset >= U32]
        assert [i.filename.split("/", 1)[1] for i in late][:2] == ["data/1", "data/2"]

        # the central entries: saturated fields, and only those, in the ZIP64 field
        size = f.seek(0, 2)
        eocd = read(size - _EOCD.size, _EOCD.size)
        _, _, _, n_here, n_total, cd_size, cd_off, _ = _EOCD.unpack(eocd)
        assert (n_here, n_total, cd_off) == (len(infos), len(infos), U32)
        loc_sig, loc_disk, rec_off, disks = _LOCATOR.unpack(
            read(size - _EOCD.size - _LOCATOR.size, _LOCATOR.size))
        assert (loc_sig, loc_disk, disks) == (b"PK\x06\x07", 0, 1)
        rec = _EOCD64.unpack(read(rec_off, _EOCD64.size))
        assert rec[0] == b"PK\x06\x06" and rec[1] == 44 and rec[8] == cd_size
        pos = rec[9]
        for info in infos:
            entry = _CENTRAL.unpack(read(pos, _CENTRAL.size))
            csize, usize, nlen, elen, clen, disk, hoff = (*entry[8:13], entry[13], entry[16])
            fields = extra_fields(read(pos + _CENTRAL.size + nlen, elen))
            expect = b""
            if info.file_size >= U32:
                assert (usize, csize) == (U32, U32)
                expect += struct.pack("<QQ", info.file_size, info.file_size)
            if info.header_offset >= U32:
                assert hoff == U32
                expect += struct.pack("<Q", info.header_offset)
            assert fields == ({1: expect} if expect else {}), info.filename
            assert disk == 0
            pos += _CENTRAL.size + nlen + elen + clen


@pytest.mark.slow
def test_open_reads_the_bytes_torch_loads(big_checkpoint: Path,
                                          torch_tensors: dict[str, Any]) -> None:
    with torchless.open(big_checkpoint) as ckpt:
        assert ckpt.format == "zip"
        assert list(ckpt.tensors) == list(torch_tensors)
        for name, (dtype, shape, digest) in torch_tensors.items():
            t = ckpt.tensors[name]
            assert (t.dtype.name, t.shape) == (dtype, shape), name
            arr = t.numpy()
            assert sha256(arr) == digest, name
            del arr
        big = ckpt.tensors["big"].numpy()
        assert {pos: int(big[pos]) for pos in MARKS} == MARKS
        del big


@pytest.mark.slow
def test_cli_inspect_convert_scan(big_checkpoint: Path, torch_tensors: dict[str, Any]) -> None:
    r = cli("inspect", "--json", str(big_checkpoint))
    assert r.returncode == 0, r.stderr
    (report,) = json.loads(r.stdout)["files"]
    assert [(t["name"], t["dtype"], tuple(t["shape"])) for t in report["tensors"]] == [
        (name, dtype, shape) for name, (dtype, shape, _) in torch_tensors.items()]

    r = cli("scan", str(big_checkpoint))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 clean" in r.stdout

    out = big_checkpoint.with_suffix(".safetensors")
    r = cli("convert", str(big_checkpoint), "-o", str(out))
    assert r.returncode == 0, r.stderr
    try:
        with open(out, "rb") as f:  # the safetensors layout, read by hand
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            header.pop("__metadata__", None)
        st_dtypes = {"U8": "uint8", "F32": "float32", "I64": "int64"}
        with open(out, "rb") as f:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                got = {}
                for name, meta in header.items():
                    lo, hi = meta["data_offsets"]
                    got[name] = (st_dtypes[meta["dtype"]], tuple(meta["shape"]),
                                 sha256(memoryview(m)[8 + n + lo:8 + n + hi]))
        assert got == torch_tensors
    finally:
        out.unlink(missing_ok=True)


# ---- small archives of the same form, built by hand --------------------------------------------


def torch_records(torch: ModuleType) -> list[tuple[str, bytes]]:
    """The records of a small torch.save archive, in torch's order."""
    buf = io.BytesIO()
    torch.save({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3),
                "b": torch.tensor([1, 2], dtype=torch.int64)}, buf)
    with zipfile.ZipFile(buf) as z:
        return [(i.filename, z.read(i)) for i in z.infolist()]


def miniz_archive(records: list[tuple[str, bytes]], zip64_from: int, *, signed: bool = True,
                  narrow: bool = False, central_extra: Callable[[int], bytes] | None = None,
                  local_extra: Callable[[int], bytes] | None = None) -> bytes:
    """The records laid out as torch's writer (miniz) lays them out: local header with sizes
    0 and the data-descriptor flag, 64-byte aligned data (the 'FB' padding field), a data
    descriptor, then the central directory, a ZIP64 end record, its locator and a classic
    end record with the directory offset saturated.

    Records from index ``zip64_from`` on get the treatment miniz gives a member whose local
    header starts at 4 GiB or later: a ZIP64 field holding the offset in both headers, the
    central offset saturated, 8-byte descriptor sizes. Variants: ``signed`` (descriptor
    signature), ``narrow`` (4-byte descriptor sizes even so), ``central_extra`` /
    ``local_extra`` (the ZIP64 field replaced, given the member's offset)."""
    out, central = bytearray(), []
    for i, (name, data) in enumerate(records):
        off, raw, crc = len(out), name.encode(), zlib.crc32(data)
        wide = i >= zip64_from
        z64 = (local_extra or (lambda o: struct.pack("<HHQ", 1, 8, o)))(off) if wide else b""
        pad = -(off + 30 + len(raw) + len(z64) + 4) % 64
        extra = z64 + struct.pack("<HH", 0x4246, pad) + b"Z" * pad
        out += _LOCAL.pack(b"PK\x03\x04", 0, 0x0808, 0, 0, 0x21, 0, 0, 0, len(raw), len(extra))
        out += raw + extra + data
        out += b"PK\x07\x08" if signed else b""
        out += struct.pack("<IQQ" if wide and not narrow else "<III", crc, len(data), len(data))
        cextra = (central_extra or (lambda o: struct.pack("<HHQ", 1, 8, o)))(off) if wide \
            else b""
        central.append(_CENTRAL.pack(b"PK\x01\x02", 0, 0, 0x0808, 0, 0, 0x21, crc, len(data),
                                     len(data), len(raw), len(cextra), 0, 0, 0, 0,
                                     U32 if wide else off) + raw + cextra)
    cd_off, cd, n = len(out), b"".join(central), len(central)
    out += cd
    rec = len(out)
    out += _EOCD64.pack(b"PK\x06\x06", 44, 0x031E, 45, 0, 0, n, n, len(cd), cd_off)
    out += _LOCATOR.pack(b"PK\x06\x07", 0, rec, 1)
    out += _EOCD.pack(b"PK\x05\x06", 0, 0, n, n, len(cd), U32, 0)
    return bytes(out)


@pytest.fixture(scope="module")
def records(torch: ModuleType) -> list[tuple[str, bytes]]:
    recs = torch_records(torch)
    names = [n.split("/", 1)[1] for n, _ in recs]
    assert names.index("data/1") > names.index("data/0") > names.index("data.pkl") == 0
    return recs


def first_storage_after(records: list[tuple[str, bytes]]) -> int:
    """Index of data/1: the place a 4 GiB data/0 would push every later member past 4 GiB."""
    return [n.split("/", 1)[1] for n, _ in records].index("data/1")


def torch_loads(torch: ModuleType, path: Path) -> dict[str, Any] | None:
    """What torch.load gives (as NumPy arrays), or None if it refuses the file."""
    try:
        loaded = torch.load(path, weights_only=True)
    except RuntimeError:
        return None
    return {k: t.numpy() for k, t in loaded.items()}


def torchless_loads(path: Path) -> dict[str, Any]:
    with torchless.open(path) as ckpt:
        return {k: np.array(t.numpy()) for k, t in ckpt.tensors.items()}


def scanned(path: Path) -> FileScan:
    (f,) = scan(str(path)).files
    return f


def write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "z64.pt"
    path.write_bytes(data)
    return path


def assert_same(got: dict[str, Any], expected: dict[str, Any] | None) -> None:
    assert expected is not None, "torch.load refused the archive"
    assert list(got) == list(expected)
    for k, arr in expected.items():
        assert got[k].dtype == arr.dtype and got[k].shape == arr.shape, k
        assert got[k].tobytes() == arr.tobytes(), k


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
@pytest.mark.parametrize("where", ["after_data0", "every_member"])
def test_zip64_descriptor_after_local_zip64_field(torch: ModuleType, tmp_path: Path,
                                                  records: list[tuple[str, bytes]], signed: bool,
                                                  where: str) -> None:
    """8-byte descriptor sizes for small members whose local header has a ZIP64 field (the
    format's rule; torch's form for members past 4 GiB), with or without the descriptor's
    optional signature: read as torch reads them, and clean to the scanner."""
    start = first_storage_after(records) if where == "after_data0" else 0
    path = write(tmp_path, miniz_archive(records, start, signed=signed))
    assert_same(torchless_loads(path), torch_loads(torch, path))
    f = scanned(path)
    assert (f.status, f.anomalies) == ("clean", ())


def test_narrow_descriptor_after_local_zip64_field_is_refused(
        torch: ModuleType, tmp_path: Path, records: list[tuple[str, bytes]]) -> None:
    """4-byte descriptor sizes although the local header has a ZIP64 field. torch reads it
    (miniz never reads descriptors), but a reader that follows the format takes 8-byte
    sizes and finds the next member elsewhere: refused, and an anomaly to the scanner."""
    path = write(tmp_path, miniz_archive(records, first_storage_after(records), narrow=True))
    assert torch_loads(torch, path) is not None
    with pytest.raises(AmbiguousArchiveError, match="data descriptor"):
        torchless_loads(path)
    f = scanned(path)
    assert f.status == "anomalous"
    assert "descriptor" in {a.kind for a in f.anomalies}


def test_malformed_local_extra_before_a_descriptor_is_refused(
        torch: ModuleType, tmp_path: Path, records: list[tuple[str, bytes]]) -> None:
    """A local extra block whose field runs past it: whether it holds a ZIP64 field (and so
    how wide the descriptor is) depends on the reader. torch ignores local extra fields and
    reads it; torchless refuses it and the scanner flags it."""
    path = write(tmp_path, miniz_archive(records, first_storage_after(records),
                                         local_extra=lambda o: struct.pack("<HHQ", 7, 0xFFF0, o)))
    assert torch_loads(torch, path) is not None
    with pytest.raises(ArchiveFormatError, match="runs past the extra block"):
        torchless_loads(path)
    assert any(a.kind == "header" and "local header" in a.message
               for a in scanned(path).anomalies)


def _tag1(*values: int, size: int | None = None) -> bytes:
    body = b"".join(struct.pack("<Q", v) for v in values)
    return struct.pack("<HH", 1, len(body) if size is None else size) + body


#: Central ZIP64 fields of members whose offset is saturated (given the real offset), and
#: whether miniz reads the archive (from its mz_zip_file_stat_internal: the first field with
#: tag 1 gives each saturated value, 8 bytes each, in the order size, compressed size,
#: offset; a value missing, or the extra block malformed before that field, fails).
CENTRAL_EXTRAS: dict[str, tuple[Callable[[int], bytes], bool]] = {
    "offset": (lambda o: _tag1(o), True),
    "after_another_field": (lambda o: struct.pack("<HHI", 0x000A, 4, 0) + _tag1(o), True),
    "offset_and_disk": (lambda o: struct.pack("<HHQI", 1, 12, o, 0), True),
    "first_of_two": (lambda o: _tag1(o) + _tag1(1), True),
    "then_a_malformed_field": (lambda o: _tag1(o) + struct.pack("<HH", 0x000A, 40), True),
    "second_of_two": (lambda o: _tag1(1) + _tag1(o), False),
    "cut_short": (lambda o: _tag1(o, size=16), False),
    "too_short": (lambda o: struct.pack("<HHI", 1, 4, o), False),
    "empty_then_another_field": (lambda o: _tag1() + struct.pack("<HHQ", 0x000A, 8, o), False),
    "missing": (lambda o: struct.pack("<HHQ", 0x000A, 8, o), False),
    "malformed_before": (lambda o: struct.pack("<HH", 0x000A, 2) + _tag1(o), False),
}


@pytest.mark.parametrize("variant", list(CENTRAL_EXTRAS))
@pytest.mark.parametrize("form", ["torch", "central_only"])
def test_central_zip64_field_read_as_miniz_reads_it(
        torch: ModuleType, tmp_path: Path, records: list[tuple[str, bytes]], form: str,
        variant: str) -> None:
    """torchless reads exactly the archives torch reads (the same bytes) and refuses the
    others; the scanner flags them. Form ``central_only``: no ZIP64 field in the local
    header and 4-byte descriptor sizes (how Go's writer treats small members past 4 GiB)."""
    extra, readable = CENTRAL_EXTRAS[variant]
    local: dict[str, Any] = {"local_extra": lambda o: b"", "narrow": True} \
        if form == "central_only" else {}
    path = write(tmp_path, miniz_archive(records, first_storage_after(records),
                                         central_extra=extra, **local))
    expected = torch_loads(torch, path)
    assert (expected is not None) == readable, "torch.load does not do what miniz's code says"
    if expected is None:
        with pytest.raises(ArchiveFormatError):
            torchless_loads(path)
        assert scanned(path).status == "anomalous"
    else:
        assert_same(torchless_loads(path), expected)
        assert scanned(path).status == "clean"


def _patch(data: bytes, at: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


def test_zip64_disk_number_is_refused(torch: ModuleType, tmp_path: Path,
                                      records: list[tuple[str, bytes]]) -> None:
    """A central entry's disk number saturated (0xFFFF, the ZIP64 form): miniz refuses the
    archive as multi-disk, whatever the ZIP64 field holds."""
    data = miniz_archive(records, first_storage_after(records),
                         central_extra=lambda o: struct.pack("<HHQI", 1, 12, o, 0))
    entry = data.index(b"PK\x01\x02")
    path = write(tmp_path, _patch(data, entry + 34, "<H", 0xFFFF))
    assert torch_loads(torch, path) is None
    with pytest.raises(UnsupportedError, match="another disk"):
        torchless_loads(path)
    assert "header" in {a.kind for a in scanned(path).anomalies}


@pytest.mark.parametrize("disks", [0, 2])
def test_locator_disk_count_other_than_one_is_refused(torch: ModuleType, tmp_path: Path,
                                                      records: list[tuple[str, bytes]],
                                                      disks: int) -> None:
    """The ZIP64 locator's total number of disks: torch writes 1 and reads nothing else."""
    data = miniz_archive(records, first_storage_after(records))
    locator = data.rindex(b"PK\x06\x07")
    path = write(tmp_path, _patch(data, locator + 16, "<I", disks))
    assert torch_loads(torch, path) is None
    with pytest.raises(UnsupportedError, match="multi-disk"):
        torchless_loads(path)
    assert "eocd" in {a.kind for a in scanned(path).anomalies}


def test_zip64_directory_of_4gib_is_refused(torch: ModuleType, tmp_path: Path,
                                            records: list[tuple[str, bytes]]) -> None:
    """miniz refuses a ZIP64 end record whose directory size does not fit 32 bits."""
    data = miniz_archive(records, first_storage_after(records))
    rec = data.rindex(b"PK\x06\x06")
    path = write(tmp_path, _patch(data, rec + 40, "<Q", 1 << 32))
    assert torch_loads(torch, path) is None
    with pytest.raises(UnsupportedError, match="4 GiB"):
        torchless_loads(path)
