"""Hand-made safetensors headers that are valid JSON but no writer makes: numbers past
Python's 4,300-digit int conversion, sizes past int64, more dimensions than NumPy holds.
Every reader of such a header (open, load, safe_open, verify, an index) refuses with a
torchless error, never the ``ValueError`` of ``json`` or NumPy."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

import torchless
from torchless.core import jsondepth
from torchless.errors import CheckpointError, FormatError, InternalError, UnsupportedError

_BIG = "1" * 5000


def _file(header_text: str, data: bytes = bytes(8)) -> bytes:
    raw = header_text.encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


def _entry(shape: str, offsets: str = "[0, 8]") -> str:
    return f'{{"w": {{"dtype": "U8", "shape": {shape}, "data_offsets": {offsets}}}}}'


HEADERS = {
    "huge int shape": (_entry(f"[{_BIG}]"), FormatError),
    "huge int offset": (_entry("[8]", f"[0, {_BIG}]"), FormatError),
    "huge int metadata": ('{"__metadata__": {"a": ' + _BIG + '}, '
                          '"w": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}',
                          FormatError),
    "size 2**64 beside 0": (_entry(f"[0, {1 << 64}]", "[0, 0]")[:-1]
                            + ', "v": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}',
                            FormatError),
    "offset 2**64": (_entry("[0]", f"[{1 << 64}, {1 << 64}]")[:-1]
                     + ', "v": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}',
                     FormatError),
    "65 dimensions": (_entry(json.dumps([8] + [1] * 64)), UnsupportedError),
}


def _read_all(path: Path, out: Path) -> list[Any]:
    """Each entry point's outcome: the exception it raised (or None)."""
    results: list[Any] = []

    def attempt(fn: Any) -> None:
        try:
            fn()
            results.append(None)
        except Exception as e:  # the type is what is checked
            results.append(e)

    def open_all() -> None:
        with torchless.open(path) as ckpt:
            for t in ckpt.tensors.values():
                t.numpy()

    def safe() -> None:
        with torchless.safe_open(path, framework="numpy") as f:
            for k in f.keys():
                f.get_tensor(k)

    attempt(open_all)
    attempt(lambda: torchless.load(path))
    attempt(safe)
    attempt(lambda: torchless.convert(path, out))
    return results


@pytest.mark.parametrize(("text", "error"), list(HEADERS.values()), ids=list(HEADERS))
def test_header_is_refused_by_every_reader(tmp_path: Path, text: str,
                                           error: type[CheckpointError]) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(_file(text))
    out = tmp_path / "out.safetensors"
    for e in _read_all(path, out):
        assert isinstance(e, error) and not isinstance(e, InternalError), repr(e)
        assert e.hint
    assert not out.exists()


def test_verify_against_a_header_with_a_huge_number(tmp_path: Path) -> None:
    """verify reads DST's header with the same parser."""
    src = tmp_path / "src.safetensors"
    src.write_bytes(_file(_entry("[8]")))
    dst = tmp_path / "dst.safetensors"
    dst.write_bytes(_file(_entry(f"[{_BIG}]")))
    with pytest.raises(FormatError) as info:
        torchless.verify(src, dst)
    assert not isinstance(info.value, InternalError)


def test_index_with_a_huge_number(tmp_path: Path) -> None:
    (tmp_path / "a.safetensors").write_bytes(_file(_entry("[8]")))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text('{"metadata": {"total_size": ' + _BIG + '}, '
                     '"weight_map": {"w": "a.safetensors"}}')
    with pytest.raises(FormatError) as info:
        torchless.open(index)
    assert not isinstance(info.value, InternalError)


def test_jsondepth_refuses_a_huge_number_as_format_error() -> None:
    """json.loads answers with a bare ValueError; jsondepth makes it a FormatError (still a
    ValueError for callers that catch that), and invalid JSON stays a JSONDecodeError."""
    with pytest.raises(FormatError, match="cannot read"):
        jsondepth.loads(f"[{_BIG}]", max_depth=4, what="x")
    with pytest.raises(json.JSONDecodeError):
        jsondepth.loads("[1,]", max_depth=4, what="x")
    assert jsondepth.loads("[" + "9" * 4300 + "]", max_depth=4, what="x") == [int("9" * 4300)]
