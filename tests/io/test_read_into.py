"""Source.read_into: a file's bytes read straight into a caller's buffer (the drop-in's
storages), with positioned reads or, where they are missing, through the map."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from torchless.errors import TruncatedInputError
from torchless.io.source import Source


def _file(tmp_path: Path, n: int = 10_000) -> tuple[Path, bytes]:
    data = os.urandom(n)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    return path, data


@pytest.mark.parametrize("preadv", [True, False])
def test_the_bytes_at_the_offset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 preadv: bool) -> None:
    path, data = _file(tmp_path)
    if not preadv:
        monkeypatch.delattr(os, "preadv", raising=False)
    with Source(path) as s:
        for offset, n in ((0, 10_000), (17, 5000), (9_999, 1), (4096, 0)):
            out = bytearray(n)
            s.read_into(offset, out)
            assert out == data[offset:offset + n]


def test_short_reads_are_continued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not hasattr(os, "preadv"):
        pytest.skip("no os.preadv on this system")  # pragma: no cover - Linux CI has it
    path, data = _file(tmp_path)
    real = os.preadv

    def at_most_7(fd: int, buffers: list[memoryview], offset: int) -> int:
        return real(fd, [buffers[0][:7]], offset)

    monkeypatch.setattr(os, "preadv", at_most_7)
    with Source(path) as s:
        out = bytearray(1000)
        s.read_into(123, out)
    assert out == data[123:1123]


def test_a_range_past_the_end_is_refused(tmp_path: Path) -> None:
    path, _ = _file(tmp_path, 100)
    with Source(path) as s, pytest.raises(TruncatedInputError):
        s.read_into(90, bytearray(11))


def test_a_file_cut_while_open(tmp_path: Path) -> None:
    if not hasattr(os, "preadv"):
        pytest.skip("no os.preadv on this system")  # pragma: no cover - Linux CI has it
    path, _ = _file(tmp_path)
    with Source(path) as s:
        os.truncate(path, 5000)
        with pytest.raises(TruncatedInputError, match="cut while open"):
            s.read_into(4000, bytearray(2000))
