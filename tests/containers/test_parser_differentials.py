"""Parser differentials: files that torch's own parsers read one way and other readers
another (issue 14, "torch's parsers, byte for byte").

torch reads a ZIP archive with miniz: the end record is the last end-record signature in the
file, even one inside another record's comment, and member names are looked up ignoring
ASCII case. It tries ``tarfile`` before the legacy stream: ``tarfile`` accepts pre-POSIX
headers, applies PAX global and extended records and GNU long names, and reads the last
member of a name. Each case here is written by the test, loaded by torch (the oracle: what
torch reads), then:

* where torch's reading is the only one, ``torchless`` reads the same object;
* where two parsers would see different objects, ``torchless.open`` refuses with
  ``AmbiguousArchiveError`` and ``torchless.scan`` lists the differential as an anomaly and
  scans what torch would read (a payload there makes the file dangerous).

Only benign variants are loaded by torch; the variants with a payload are only scanned.
"""

from __future__ import annotations

import io
import random
import tarfile
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import torchless
from tests._differentials import (
    PAYLOAD,
    eocd_in_comment,
    gnu_long_name,
    legacy_tar,
    obj,
    pickle_tar,
    tar_header,
    tar_members,
    tar_of,
    v7,
    zip_checkpoint,
    zip_members,
)
from tests._fuzz_inputs import ZipMember, make_zip, tar_checkpoint
from torchless.io import detect
from torchless.scanner.files import FileScan, scan

pytestmark = pytest.mark.torch


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _torch_load(torch: ModuleType, path: Path) -> Any:
    return torch.load(path, weights_only=False)


def _scan(path: Path) -> FileScan:
    (got,) = scan(path).files
    return got


def _refused(path: Path) -> None:
    with pytest.raises(torchless.AmbiguousArchiveError) as info:
        torchless.open(path)
    assert info.value.hint


def _dangerous(path: Path, kind: str) -> None:
    got = _scan(path)
    assert got.status == "dangerous", got
    assert ("posix", "system") in {(g.module, g.name) for g in got.dangerous}
    assert kind in {a.kind for a in got.anomalies}, got.anomalies


# ---- ZIP: the end record ------------------------------------------------------------------

def test_torch_reads_the_end_record_inside_the_comment(torch: ModuleType,
                                                        tmp_path: Path) -> None:
    path = _write(tmp_path, "eocd.pt", eocd_in_comment(zip_checkpoint(obj("outer")),
                                                        zip_checkpoint(obj("inner"))))
    assert _torch_load(torch, path) == {"who": "inner"}
    _refused(path)
    hostile = _write(tmp_path, "eocd-payload.pt", eocd_in_comment(
        zip_checkpoint(obj("outer")), zip_checkpoint(PAYLOAD)))
    _dangerous(hostile, "eocd")


def test_a_comment_without_a_record_is_read(torch: ModuleType, tmp_path: Path) -> None:
    data = zip_checkpoint(obj("commented"))
    data = data[:-2] + (9).to_bytes(2, "little") + b"a comment"
    path = _write(tmp_path, "comment.pt", data)
    assert torchless.load(path) == _torch_load(torch, path) == {"who": "commented"}
    assert _scan(path).status == "clean"


# ---- ZIP: names ignoring case -------------------------------------------------------------

@pytest.mark.parametrize("names", [("archive/version", "archive/data.PKL"),
                                   ("archive/version", "archive/Data.Pkl")])
def test_member_names_are_looked_up_ignoring_case(torch: ModuleType, tmp_path: Path,
                                                  names: tuple[str, str]) -> None:
    """One member whose name differs from the one torch asks for only in case: torch reads
    it (miniz ignores case), so torchless reads it too."""
    data = make_zip([ZipMember(names[0], b"3\n"), ZipMember(names[1], obj("folded"))])
    path = _write(tmp_path, "folded.pt", data)
    expected = _torch_load(torch, path)
    assert expected == {"who": "folded"}
    assert torchless.load(path) == expected
    assert _scan(path).status == "clean"


def test_a_storage_name_is_looked_up_ignoring_case(torch: ModuleType, tmp_path: Path) -> None:
    buf = io.BytesIO()
    torch.save({"t": torch.arange(6, dtype=torch.float32)}, buf)
    raw = buf.getvalue()
    i = raw.index(b"/data/0")
    # rename the storage record of the one tensor (local header and central entry alike)
    path = _write(tmp_path, "storage.pt", raw.replace(raw[i:i + 7], b"/DATA/0"))
    expected = _torch_load(torch, path)["t"].numpy()
    assert np.array_equal(torchless.load(path)["t"], expected)


@pytest.mark.parametrize("first", ["data.pkl", "DATA.PKL"])
def test_names_equal_but_for_case_are_refused(torch: ModuleType, tmp_path: Path,
                                              first: str) -> None:
    """Two members torch cannot tell apart: miniz takes one (its sorted directory decides
    which), other readers the other: refused, and both are scanned."""
    second = "DATA.PKL" if first == "data.pkl" else "data.pkl"
    path = _write(tmp_path, "dup.pt", zip_members((first, obj(first)), (second, obj(second))))
    assert _torch_load(torch, path) in ({"who": first}, {"who": second})
    _refused(path)
    hostile = _write(tmp_path, "dup-payload.pt",
                     zip_members((first, obj(first)), (second, PAYLOAD)))
    _dangerous(hostile, "duplicate")


# ---- TAR: what tarfile accepts ------------------------------------------------------------

def test_a_pre_posix_tar_checkpoint_is_read(torch: ModuleType, tmp_path: Path) -> None:
    data = v7(tar_checkpoint())
    assert b"ustar" not in data
    path = _write(tmp_path, "v7.tar", data)
    expected = _torch_load(torch, path)
    got = torchless.load(path)
    for key in ("w", "tail"):
        assert np.array_equal(got[key], expected[key].numpy())
    assert _scan(path).status == "clean"


def test_a_pickle_that_is_also_a_tar_archive(torch: ModuleType, tmp_path: Path) -> None:
    """torch tries tarfile first: it loads the TAR checkpoint, pickle.load the pickle."""
    path = _write(tmp_path, "pickle-tar.pt", pickle_tar())
    assert set(_torch_load(torch, path)) == {"w", "tail", "view"}
    _refused(path)
    members = tar_members(tar_checkpoint())
    hostile = tar_of([(n, PAYLOAD if n == "pickle" else raw, {}) for n, raw in members.items()])
    _dangerous(_write(tmp_path, "pickle-tar-payload.pt", pickle_tar(hostile)), "polyglot")


def test_a_legacy_stream_that_is_also_a_tar_archive(torch: ModuleType, tmp_path: Path) -> None:
    buf = io.BytesIO()
    torch.save({"legacy": torch.ones(2)}, buf, _use_new_zipfile_serialization=False)
    path = _write(tmp_path, "legacy-tar.pt", legacy_tar(buf.getvalue()))
    assert set(_torch_load(torch, path)) == {"w", "tail", "view"}
    _refused(path)
    members = tar_members(tar_checkpoint())
    hostile = tar_of([(n, PAYLOAD if n == "pickle" else raw, {}) for n, raw in members.items()])
    _dangerous(_write(tmp_path, "legacy-tar-payload.pt", legacy_tar(buf.getvalue(), hostile)),
               "polyglot")


# ---- TAR: names --------------------------------------------------------------------------

def _renamed(torch: ModuleType, tmp_path: Path, data: bytes, hostile: bytes) -> None:
    path = _write(tmp_path, "renamed.tar", data)
    assert _torch_load(torch, path) == {"who": "renamed"}
    _refused(path)
    _dangerous(_write(tmp_path, "renamed-payload.tar", hostile), "pax")


def _ordered(notes: bytes) -> list[tuple[str, bytes, dict[str, str]]]:
    members = tar_members(tar_checkpoint())
    return [(n, members[n], {}) for n in ("sys_info", "storages", "tensors", "pickle")] + [
        ("notes", notes, {})]


def test_a_pax_global_path_renames_a_later_member(torch: ModuleType, tmp_path: Path) -> None:
    """A PAX global header applies to every later member: 'notes' becomes the second
    'pickle', and tarfile reads the last member of a name."""
    _renamed(torch, tmp_path, tar_of(_ordered(obj("renamed")), glob={"path": "pickle"}, at=4),
             tar_of(_ordered(PAYLOAD), glob={"path": "pickle"}, at=4))


def test_a_gnu_long_name_renames_the_next_member(torch: ModuleType, tmp_path: Path) -> None:
    def build(notes: bytes) -> bytes:
        base = tar_of(_ordered(notes)[:4])[:-1024]
        return (base + gnu_long_name(b"pickle")
                + tar_header(b"notes", len(notes), magic=b"ustar\x0000") + notes
                + b"\0" * (-len(notes) % 512) + b"\0" * 1024)
    _renamed(torch, tmp_path, build(obj("renamed")), build(PAYLOAD))


def test_a_pax_size_that_differs_from_the_header_is_refused(tmp_path: Path) -> None:
    members = _ordered(obj("sized"))
    members[4] = ("notes", obj("sized"), {"size": "3"})
    data = tar_of(members)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:  # the oracle: tarfile's size
        assert tar.getmember("notes").size == 3
    path = _write(tmp_path, "size.tar", data)
    _refused(path)
    assert "pax" in {a.kind for a in _scan(path).anomalies}


# ---- the TAR sniff is tarfile's test -------------------------------------------------------

def _tarfile_accepts(block: bytes) -> bool:
    try:
        tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except tarfile.HeaderError:
        return False
    return True


_NUMBERS = [b"0000644\x00", b" 17 \x00", b"0o17\x00", b"-1\x00", b"1_0\x00", b"89\x00",
            b"\x80" + bytes(6) + b"\x01", b"\xff" * 8, b"\x85 12\x00", b"\x1f7\x00", b"",
            b"7\x00garbage", b"+7\x00", b"0x7\x00", b"\xc3\xa9\x00"]


def test_the_tar_sniff_is_tarfiles_header_test() -> None:
    """detect.is_tar says yes exactly when tarfile reads a first header: checksums signed
    or unsigned, numeric fields in every form tarfile takes or refuses."""
    rng = random.Random(14)
    seen = {True: 0, False: 0}
    bases = [tar_checkpoint()[:512], v7(tar_checkpoint())[:512], pickle_tar()[:512],
             tar_header(b"x", 0, b"S", b"ustar  \x00")]
    for _ in range(3000):
        h = bytearray(rng.choice(bases))
        for a, b in rng.sample([(100, 108), (108, 116), (124, 136), (136, 148), (329, 337),
                                (386, 398), (483, 495)], rng.randint(0, 2)):
            h[a:b] = rng.choice(_NUMBERS).ljust(b - a, b"\x00")[:b - a]
        if rng.random() < 0.3:
            h[rng.randrange(512)] = rng.randrange(256)
        h[148:156] = b" " * 8
        unsigned = sum(h)
        signed = unsigned - 256 * sum(1 for c in h if c > 127)
        choice = rng.random()
        total = unsigned if choice < 0.45 else signed if choice < 0.9 else unsigned + 1
        h[148:156] = (b"%06o\x00 " % total) if total >= 0 else b"-1\x00     "
        block = bytes(h)
        verdict = detect.is_tar(block, 512)
        assert verdict == _tarfile_accepts(block), block
        seen[verdict] += 1
    assert min(seen.values()) > 300
