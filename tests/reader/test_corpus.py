"""Real checkpoints shipped in public packages, checked against what torch read from them.

``data/corpus/MANIFEST.json`` lists, per file, every tensor torch 2.13 reads (``expected``:
name, dtype, shape, stride, storage offset, sha256 of its contiguous bytes) in torch's order,
and the top-level keys of the object. For the TorchScript file the expectation is
``torch.jit.load(f).state_dict()``. Every expected value below comes from that manifest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import torchless
from tests.reader.test_fixtures import sha256_le

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus"
MANIFEST: list[dict[str, Any]] = json.loads((CORPUS / "MANIFEST.json").read_text())
ENTRIES = {e["file"]: e for e in MANIFEST}

#: torch dtype name -> safetensors dtype name (the safetensors spec's names).
SAFETENSORS = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8",
    "bool": "BOOL",
}
FORMAT = {"zip": "zip", "torchscript-zip": "torchscript", "legacy": "legacy"}


def test_every_manifest_entry_has_its_file() -> None:
    on_disk = {p.relative_to(CORPUS).as_posix() for p in CORPUS.rglob("*")
               if p.is_file() and p.name not in ("MANIFEST.json", "PROVENANCE.md")}
    assert on_disk == set(ENTRIES)
    for name, entry in ENTRIES.items():
        data = (CORPUS / name).read_bytes()
        assert len(data) == entry["size"], name


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_tensors_match_torch(name: str) -> None:
    entry = ENTRIES[name]
    kind = entry["container"]["kind"]
    expected = entry["expected"]
    assert len(expected) == entry["torch"]["n_tensors"]
    with torchless.open(CORPUS / name) as ckpt:
        assert ckpt.format == FORMAT[kind]
        assert dict(ckpt.unsupported) == {}
        assert list(ckpt.tensors) == [t["name"] for t in expected]
        for exp in expected:
            tensor = ckpt.tensors[exp["name"]]
            what = f"{exp['name']}: {exp}"
            assert tensor.dtype.safetensors == SAFETENSORS[exp["dtype"]], what
            assert list(tensor.shape) == exp["shape"], what
            assert list(tensor.stride) == exp["stride"], what
            assert tensor.storage_offset == exp["storage_offset"], what
            arr = tensor.numpy()
            assert not arr.flags.writeable, what
            assert arr.shape == tuple(exp["shape"]), what
            assert arr.strides == tuple(s * arr.itemsize for s in exp["stride"]), what
            assert sha256_le(arr) == exp["sha256"], what


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_load_matches_torch(name: str) -> None:
    """torchless.load gives the object torch gave: a dict of arrays (for TorchScript, the
    module's state_dict), its keys in torch's order."""
    entry = ENTRIES[name]
    obj = torchless.load(CORPUS / name)
    assert isinstance(obj, dict)
    assert list(obj) == entry["torch"]["top_keys"]
    by_name = {t["name"]: t for t in entry["expected"]}
    for key, value in obj.items():
        exp = by_name[key]
        assert isinstance(value, np.ndarray), key
        assert list(value.shape) == exp["shape"], key
        assert sha256_le(value) == exp["sha256"], key
