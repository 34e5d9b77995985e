"""Converting real checkpoints keeps the whole object: ``torchless.load`` of the converted
file gives what torch 2.13 read from the original (REFERENCE.json: the tree and every
tensor's SHA-256), for every fixture whose tensors safetensors can hold.

The oracle is torch's own reading, recorded in tests/data/fixtures/REFERENCE.json.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import torchless
from tests.reader.test_fixtures import (
    FIXTURES,
    OK,
    REFERENCE,
    sha256_le,
    to_reference_tree,
)

#: Fixtures whose every tensor has a safetensors dtype (the others are skipped by name when
#: converted, so their tree differs on purpose).
CONVERTIBLE = [n for n in OK if all(v[0] is not None for v in REFERENCE[n]["tensors"].values())]


def test_most_fixtures_are_convertible() -> None:
    assert len(CONVERTIBLE) >= 0.8 * len(OK), (len(CONVERTIBLE), len(OK))


@pytest.mark.parametrize("name", CONVERTIBLE)
def test_converted_file_loads_like_torch(name: str, tmp_path: Path) -> None:
    ref = REFERENCE[name]
    out = tmp_path / "out.safetensors"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torchless.OpaqueObjectWarning)
        torchless.convert(FIXTURES / name, out)
    obj = torchless.load(out)
    arrays: dict[str, np.ndarray] = {}
    tree = to_reference_tree(obj, arrays)
    assert json.dumps(tree, sort_keys=True) == json.dumps(ref["tree"], sort_keys=True)
    hashes = {tname: sha256_le(arr) for tname, arr in arrays.items()}
    assert hashes == {tname: v[2] for tname, v in ref["tensors"].items()}
    # and the weights-only output holds the same tensors, without a tree
    torchless.convert(FIXTURES / name, tmp_path / "w.safetensors", tree=False)
    plain = torchless.load(tmp_path / "w.safetensors")
    assert {k: sha256_le(v) for k, v in plain.items()} == {
        tname: v[2] for tname, v in ref["tensors"].items()}


@pytest.mark.parametrize("name", sorted(n for n in REFERENCE if n.endswith(".safetensors")))
def test_load_reads_plain_safetensors_like_torch(name: str) -> None:
    """load() reads a plain safetensors file: its tensors by name, as torch read them."""
    ref = REFERENCE[name]
    got = torchless.load(FIXTURES / name)
    assert {k: sha256_le(v) for k, v in got.items()} == {
        tname: v[2] for tname, v in ref["tensors"].items()}
    st_names = {"float32": "F32", "float64": "F64", "float16": "F16", "int64": "I64",
                "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}
    assert {k: [st_names[str(v.dtype)], list(v.shape)] for k, v in got.items()} == {
        k: [v[0], v[1]] for k, v in ref["tensors"].items()}
