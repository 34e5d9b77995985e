"""The object tree's text is bounded while it is encoded: one string (or bytes, or a global
name) a file holds once can be referenced thousands of times through the memo, and each
reference is written out in full. Past what a safetensors header holds (100,000,000
bytes) convert and save stop at once with a ConversionError naming --no-tree; the
tree was built whole first (20,000 references to 1 MiB of bytes: 28 GB of base64)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

import torchless
from tests._fuzz_inputs import state_dict_pickle, tensor_ops, zip_checkpoint
from torchless import ConversionError

MiB = 1 << 20


def _references(n: int, payload: bytes) -> bytes:
    """``{"w": tensor, "x": [payload] * n}``: the payload once, then n BINGETs of it."""
    head = state_dict_pickle([("w", tensor_ops("0", 2, 0, (2,), (1,)))])[:-1]
    return (head + b"X\x01\x00\x00\x00x" + payload + b"q\x05" + b"0]("
            + b"h\x05" * n + b"es.")


@pytest.mark.parametrize("payload", [
    b"X" + struct.pack("<I", MiB) + b"s" * MiB,
    b"B" + struct.pack("<I", MiB) + b"b" * MiB,
], ids=["str", "bytes"])
def test_many_references_to_one_long_value(tmp_path: Path, payload: bytes) -> None:
    src = tmp_path / "r.pt"
    src.write_bytes(zip_checkpoint(_references(200, payload), {"0": bytes(8)}))
    with torchless.open(src) as ckpt:
        assert len(ckpt.tree["x"]) == 200
    out = tmp_path / "r.safetensors"
    with pytest.raises(ConversionError, match="more than 100000000 characters of text"):
        torchless.convert(src, out)
    assert not out.exists()
    torchless.convert(src, out, tree=False)
    assert list(torchless.load(out)) == ["w"]


def test_save_of_an_object_with_too_much_text(tmp_path: Path) -> None:
    text = "t" * MiB
    with pytest.raises(ConversionError, match="characters of text"):
        torchless.save({"many": [text] * 200}, tmp_path / "o.inert")
    assert not (tmp_path / "o.inert").exists()
    torchless.save({"some": [text] * 20}, tmp_path / "o.inert")
    assert torchless.load(tmp_path / "o.inert")["some"][19] == text
