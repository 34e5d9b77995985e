"""Which archive members' CRC-32 ``scan`` checks: every pickle, every member it reads whole
anyway, and tensor data only with ``verify_crc`` (torch reads tensor data unchecked and no
unpickler runs it; checking it reads every byte of the file)."""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path

from torchless.cli.main import main
from torchless.scanner.files import scan

BIG = 200 << 10  # past the 64 KiB the scanner reads of a member that is not a pickle


def _archive(tmp_path: Path, corrupt: str) -> str:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle.dumps({"a": 1}, protocol=2))
        z.writestr("archive/data/0", bytes(BIG))
        z.writestr("archive/data/1", bytes(1024))
        z.writestr("archive/version", b"3\n")
    data = bytearray(buf.getvalue())
    info = zipfile.ZipFile(io.BytesIO(bytes(data))).getinfo(corrupt)
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start + info.file_size - min(100, info.file_size // 2)] ^= 0x01  # big: past 64 KiB
    path = tmp_path / "m.pt"
    path.write_bytes(bytes(data))
    with zipfile.ZipFile(path) as z:  # the oracle: Python's zipfile finds the bad member
        assert z.testzip() == corrupt
    return str(path)


def _crc_members(path: str, verify: bool) -> list[str | None]:
    (f,) = scan(path, verify_crc=verify).files
    return [a.member for a in f.anomalies if a.kind == "crc"]


def test_tensor_data_crc_only_with_verify_crc(tmp_path: Path) -> None:
    path = _archive(tmp_path, "archive/data/0")
    assert _crc_members(path, False) == []
    assert scan(path).files[0].status == "clean"
    assert _crc_members(path, True) == ["archive/data/0"]
    assert main(["scan", "--json", path]) == 0
    assert main(["scan", "--verify-crc", "--json", path]) == 1


def test_crc_of_a_member_read_whole_always(tmp_path: Path) -> None:
    path = _archive(tmp_path, "archive/data/1")
    assert _crc_members(path, False) == ["archive/data/1"]
    assert _crc_members(path, True) == ["archive/data/1"]


def test_crc_of_the_pickle_always(tmp_path: Path) -> None:
    path = _archive(tmp_path, "archive/data.pkl")
    assert _crc_members(path, False) == ["archive/data.pkl"]
