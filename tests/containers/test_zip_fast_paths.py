"""The ZIP reader's in-place check of a plain local header (``MemberLayout._plain_local``)
against the full check it stands in for (``_check_local_fully``): over archives torch writes
and damaged copies of them, in strict and report mode, both must place every member alike
and find (or raise) the same things."""

from __future__ import annotations

import random
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from torchless.containers.ziparchive import ZipArchive
from torchless.containers.ziplayout import MemberLayout
from torchless.core.limits import Limits
from torchless.errors import CheckpointError
from torchless.io.source import Source


def _outcome(path: Path, mode: str) -> Any:
    try:
        with Source(path) as src:
            z = ZipArchive(src, Limits(), mode=mode)  # type: ignore[arg-type]
            return ([(e.name, e.header_offset, e.data_offset, e.end_offset, e.located,
                      e.listed) for e in z.members],
                    [(a.kind, a.message, a.member, a.offset) for a in z.anomalies],
                    z.loose)
    except CheckpointError as e:
        return (type(e).__name__, str(e), e.offset)


def _both(path: Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    fast = _outcome(path, mode)
    with monkeypatch.context() as m:
        m.setattr(MemberLayout, "_plain_local", lambda self, e: False)
        full = _outcome(path, mode)
    return fast, full


@pytest.fixture(scope="module")
def archives(torch: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    tmp = tmp_path_factory.mktemp("zipfast")
    objs = {
        "small": {f"w{i}": torch.full((3,), float(i)) for i in range(200)},
        "mixed": {"big": torch.zeros(70_000), "s": torch.ones(2), "e": torch.zeros(0),
                  "b": torch.ones(5000, dtype=torch.uint8)},
        "module": torch.nn.Linear(4, 3),
    }
    paths = []
    for name, obj in objs.items():
        p = tmp / f"{name}.pt"
        torch.save(obj, p)
        paths.append(p)
    p = tmp / "nocrc.pt"  # CRCs of 0: descriptors and local headers of zeros
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(objs["small"], p)
    finally:
        torch.serialization.set_crc32_options(True)
    paths.append(p)
    p = tmp / "zipfile.pt"  # no data descriptors: CRC and sizes in the local headers
    with zipfile.ZipFile(p, "w") as z:
        for name, data in (("a/data.pkl", b"\x80\x02}q\x00."), ("a/version", b"3\n"),
                           ("a/data/0", bytes(range(40))), ("a/data/1", b"")):
            z.writestr(name, data)
    paths.append(p)
    return paths


def test_archives_torch_writes_read_alike(archives: list[Path],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for path in archives:
        for mode in ("strict", "report"):
            fast, full = _both(path, mode, monkeypatch)
            assert fast == full, (path.name, mode)
            assert isinstance(fast[0], list) and all(m[4] for m in fast[0])


def test_local_headers_without_descriptors_read_alike(
        archives: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A local header that leaves out its CRC and sizes without the descriptor flag, or
    claims the flag alone, is the full path's to judge."""
    data = archives[-1].read_bytes()
    at = data.index(b"PK\x03\x04", data.index(b"a/data/0") - 40)
    cases = []
    blank = bytearray(data)
    blank[at + 14:at + 26] = bytes(12)  # CRC and sizes left out
    cases.append(blank)
    flagged = bytearray(blank)
    flagged[at + 6] |= 0x08  # … and the descriptor flag set, unlike the central entry
    cases.append(flagged)
    for k, damaged in enumerate(cases):
        target = tmp_path / f"n{k}.pt"
        target.write_bytes(bytes(damaged))
        for mode in ("strict", "report"):
            fast, full = _both(target, mode, monkeypatch)
            assert fast == full, (k, mode)
            assert fast != _outcome(archives[-1], mode)


def test_damaged_local_headers_and_descriptors_read_alike(
        archives: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every byte of a few local headers (and their names and extra fields) and data
    descriptors, each changed once."""
    rng = random.Random(16)
    differs = k = 0
    for path in archives[:2] + archives[-1:]:
        data = path.read_bytes()
        chosen = set()
        for sig in (b"PK\x03\x04", b"PK\x07\x08", b"PK\x01\x02"):  # local, descriptor, central
            heads = [i for i in range(len(data) - 4) if data[i:i + 4] == sig]
            picked = rng.sample(heads[1:], min(2, len(heads[1:])))
            chosen.update(h + d for h in picked for d in range(46))
        for at in sorted(chosen):
            k += 1
            damaged = bytearray(data)
            damaged[at] = (damaged[at] + rng.randrange(1, 256)) % 256
            target = tmp_path / f"d{k}.pt"
            target.write_bytes(bytes(damaged))
            for mode in ("strict", "report"):
                fast, full = _both(target, mode, monkeypatch)
                assert fast == full, (path.name, at, mode)
            differs += _outcome(target, "strict") != _outcome(path, "strict")
    assert differs > k // 3  # the damage is seen, not only in bytes no check reads


def test_digit_keys_are_plain_record_names() -> None:
    """``TorchZip.persistent_load`` takes a key of ASCII digits (what torch writes) without
    its regular expression: every such key must be one the expression takes, and the
    others still go to it (random strings of digits, letters, ``_`` and look-alikes)."""
    from torchless.containers.torchzip import _KEY

    rng = random.Random(30)
    alphabet = "0123456789_aZ/.-\x00 \u0660\u00b2\u0966\uff10"  # ASCII and Unicode digits
    for _ in range(20000):
        key = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
        if key.isdigit() and key.isascii():
            assert _KEY.match(key), key
        shortcut = (key.isdigit() and key.isascii()) or bool(_KEY.match(key))
        assert shortcut == bool(_KEY.match(key)), key
