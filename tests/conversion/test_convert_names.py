"""A checkpoint whose file name is not UTF-8 (a name from another system; Python holds its
bytes as surrogate escapes) converts: the ``source`` recorded in ``__metadata__`` must be
JSON text, so the bytes that are not UTF-8 become U+FFFD (convert refused such a file with
"metadata is not valid Unicode")."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import torchless
from tests._fuzz_inputs import small_zip_checkpoint
from torchless.write.safetensors import read_header

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="byte file names (Linux)")


def test_a_file_name_that_is_not_utf8(tmp_path: Path) -> None:
    src = os.fsdecode(os.fsencode(tmp_path) + b"/w\xff\xfe.pt")
    with open(src, "wb") as f:
        f.write(small_zip_checkpoint())
    report = torchless.convert(src, verify=True)
    out = os.fsdecode(os.fsencode(tmp_path) + b"/w\xff\xfe.safetensors")
    assert report.verified is not None and report.verified.ok
    with open(out, "rb") as f:
        assert read_header(f.read()).metadata["source"] == "w\ufffd\ufffd.pt"
    assert sorted(torchless.load(out)) == ["b", "w", "wt"]


def test_a_model_directory_with_such_a_shard(tmp_path: Path) -> None:
    """The shard is named in the index with a JSON escape of its surrogate (the name
    Python gives the file); the output shard's ``source`` has U+FFFD for the byte."""
    src = tmp_path / "src"
    src.mkdir()
    with open(os.fsencode(src) + b"/pytorch_model-\xff.bin", "wb") as f:
        f.write(small_zip_checkpoint())
    (src / "pytorch_model.bin.index.json").write_text(
        '{"weight_map": {"w": "pytorch_model-\\udcff.bin", "wt": "pytorch_model-\\udcff.bin",'
        ' "b": "pytorch_model-\\udcff.bin"}}')
    torchless.convert(src, tmp_path / "out", verify=True)
    shards = [p for p in os.listdir(tmp_path / "out") if p.endswith(".safetensors")]
    assert len(shards) == 1
    with open(tmp_path / "out" / shards[0], "rb") as f:
        assert read_header(f.read()).metadata["source"] == "pytorch_model-\ufffd.bin"
