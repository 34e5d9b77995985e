"""Real checkpoint fixtures from other readers' test suites, checked against what torch read.

``data/fixtures/REFERENCE.json`` records, per file, what torch 2.13 read: the flat tensors
``{name: [safetensors dtype, shape, sha256 of contiguous little-endian bytes]}`` and a JSON
skeleton of the whole object (``tree``); files torch could not read carry ``error``. Every
expected value below comes from that file, never from torchless.

The tree encoding (see ``../shared/fixtures/README.md``): a dict is ``{"__dict__": [[key,
value], ...]}`` in insertion order, a list is ``{"__list__": [...]}``, a float is
``{"__float__": repr(x)}``, a tensor is ``{"__t__": flat name}``; str, int, bool and None are
plain JSON. The JSON object keys are sorted, so the ``tensors`` mapping is in sorted order: the
order torch yields tensors in is the order of the ``__t__`` references in the tree.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import torchless

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "fixtures"
REFERENCE: dict[str, dict[str, Any]] = json.loads((FIXTURES / "REFERENCE.json").read_text())

#: Which torchless ``Checkpoint.format`` values fit the magic REFERENCE.json records.
#: "pickle" (a \x80 PROTO opcode) is a legacy stream or a plain pickle; "4c31313935343730" is
#: "L1195470", the protocol-0 text of the legacy magic number.
FORMATS_BY_MAGIC = {
    "zip": {"zip", "torchscript"},
    "pickle": {"legacy", "pickle"},
    "4c31313935343730": {"legacy"},
    "tar": {"tar"},
}
#: Files torch 2.13 reads that torchless refuses on purpose, with the message it must give.
#: torch.load reads safetensors files; torchless is a reader of torch checkpoints and tells
#: the user to use the safetensors package (issue 3: "a clear message for what is not a
#: checkpoint at all (safetensors, …)").
OK = sorted(k for k, v in REFERENCE.items() if v["ok"])
REFUSED = sorted(k for k, v in REFERENCE.items() if not v["ok"])


# ---- comparing with torch's reading (shared with test_corpus.py) --------------------------

def sha256_le(arr: np.ndarray) -> str:
    """sha256 of the array's values laid out contiguously (C order), little-endian."""
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def tree_tensor_names(tree: Any) -> list[str]:
    """Flat names of the ``__t__`` references of a REFERENCE tree, in depth-first order."""
    names: list[str] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(reversed(node))
        elif isinstance(node, dict):
            if "__t__" in node:
                if node["__t__"] not in names:
                    names.append(node["__t__"])
            elif "__dict__" in node or "__module__" in node:
                pairs = node.get("__dict__", node.get("__module__"))
                stack.extend(reversed([value for _, value in pairs]))
            else:
                stack.extend(reversed(list(node.values())))
    return names


def to_reference_tree(obj: Any, arrays: dict[str, np.ndarray] | None = None,
                      path: str = "") -> Any:
    """The REFERENCE.json skeleton of a :func:`torchless.load` result.

    Arrays stand where torch had tensors and are named by their path (dict keys and list
    indices joined by '.'); ``arrays`` collects them by that name. Encodings no fixture
    exercises yet are our best reading of the format (tuples ``__tuple__``, modules saved
    whole ``__module__``, bytes ``__bytes__``, non-str dict keys encoded like values);
    anything else becomes an ``__unexpected__`` tag that can never match a reference.
    """
    if arrays is None:
        arrays = {}

    def child(key: Any) -> str:
        k = key if isinstance(key, str) else str(key)
        return f"{path}.{k}" if path else k

    if isinstance(obj, np.ndarray):
        arrays[path] = obj
        return {"__t__": path}
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return {"__float__": repr(float(obj))}
    if isinstance(obj, dict):
        pairs = [[k if isinstance(k, str) else to_reference_tree(k),
                  to_reference_tree(v, arrays, child(k))] for k, v in obj.items()]
        tag = "__module__" if type(obj).__name__ == "ModuleDict" else "__dict__"
        return {tag: pairs}
    if isinstance(obj, (list, tuple)):
        items = [to_reference_tree(v, arrays, child(i)) for i, v in enumerate(obj)]
        return {"__list__" if isinstance(obj, list) else "__tuple__": items}
    if isinstance(obj, bytes):
        return {"__bytes__": obj.hex()}
    return {"__unexpected__": f"{type(obj).__module__}.{type(obj).__qualname__}: {obj!r}"[:200]}


# ---- the tests ----------------------------------------------------------------------------

def test_every_reference_entry_has_its_file() -> None:
    on_disk = {p.relative_to(FIXTURES).as_posix() for p in FIXTURES.rglob("*")
               if p.is_file() and p.name not in ("REFERENCE.json", "PROVENANCE.md")}
    assert on_disk == set(REFERENCE)
    assert len(REFERENCE) == 169


def test_files_match_provenance_hashes() -> None:
    """The copies are byte-identical to what PROVENANCE.md records (no line-ending damage)."""
    text = (FIXTURES / "PROVENANCE.md").read_text()
    table = text.split("## Full hashes", 1)[1]
    rows = re.findall(r"^\| (\S+) \| \S+ \| [0-9a-f]{40} \| ([0-9a-f]{64}) \|$", table, re.M)
    assert {name for name, _ in rows} == set(REFERENCE)
    for name, digest in rows:
        assert hashlib.sha256((FIXTURES / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.parametrize("name", OK)
def test_tensors_match_torch(name: str) -> None:
    ref = REFERENCE[name]
    expected_order = tree_tensor_names(ref["tree"])
    assert sorted(expected_order) == sorted(ref["tensors"]), "REFERENCE tree/tensors disagree"
    with torchless.open(FIXTURES / name) as ckpt:
        if ref["magic"] in FORMATS_BY_MAGIC:
            assert ckpt.format in FORMATS_BY_MAGIC[ref["magic"]]
        assert dict(ckpt.unsupported) == {}
        assert list(ckpt.tensors) == expected_order
        got = {}
        for tname, tensor in ckpt.tensors.items():
            arr = tensor.numpy()
            assert not arr.flags.writeable, tname
            assert arr.shape == tuple(tensor.shape), tname
            got[tname] = [tensor.dtype.safetensors, list(tensor.shape), sha256_le(arr)]
        assert got == ref["tensors"]


@pytest.mark.parametrize("name", OK)
def test_tree_matches_torch(name: str) -> None:
    ref = REFERENCE[name]
    obj = torchless.load(FIXTURES / name)
    arrays: dict[str, np.ndarray] = {}
    tree = to_reference_tree(obj, arrays)
    assert tree == ref["tree"]
    # == lets True equal 1; their JSON text does not.
    assert json.dumps(tree, sort_keys=True) == json.dumps(ref["tree"], sort_keys=True)
    hashes = {tname: sha256_le(arr) for tname, arr in arrays.items()}
    assert hashes == {tname: v[2] for tname, v in ref["tensors"].items()}


@pytest.mark.parametrize("name", REFUSED)
def test_unreadable_files_are_refused(name: str) -> None:
    """torch could not read these; torchless must refuse them with one of its errors."""
    assert REFERENCE[name]["error"]
    for reader in (torchless.open, torchless.load):
        with pytest.raises(torchless.CheckpointError) as info:
            reader(FIXTURES / name)
        assert type(info.value) is not torchless.CheckpointError, (
            f"a bare CheckpointError (torchless's wrapper for its own bugs): {info.value}")
