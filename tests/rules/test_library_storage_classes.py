"""A class whose name ends in "Storage" is a torch storage type only in torch's modules.

torch's loader asks ``StorageType(name)`` first for any name holding "Storage" and, when torch
has no such dtype, imports ``module.name`` like any other class; so a library's own class
(torch_geometric's ``GlobalStorage``, which ``torch.save(Data(...))`` writes) is an unvetted
class kept as an inert record, not a forged storage type to refuse. Names in torch's own
modules that torch has no storage type for are still refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import torchless
from torchless.core import dtypes

# GLOBAL torch_geometric.data.storage GlobalStorage; NEWOBJ(); BUILD {"a": 1}
_PICKLE = b"\x80\x02ctorch_geometric.data.storage\nGlobalStorage\n)\x81}X\x01\x00\x00\x00aK\x01sb."


@pytest.mark.parametrize(
    ("module", "name", "expected"),
    [
        ("torch", "FloatStorage", True),
        ("torch.cuda", "HalfStorage", True),
        ("torch", "EvilStorage", True),
        ("torch_geometric.data.storage", "GlobalStorage", False),
        ("torchvision.x", "BaseStorage", False),
        ("torch", "storage.Storage", False),
    ],
)
def test_names_storage_type(module: str, name: str, expected: bool) -> None:
    assert dtypes.names_storage_type(module, name) is expected


def test_library_storage_class_is_an_inert_record(tmp_path: Path) -> None:
    path = tmp_path / "data.pkl"
    path.write_bytes(_PICKLE)
    obj = torchless.load(path)
    assert isinstance(obj, torchless.Opaque)
    assert obj.class_path == "torch_geometric.data.storage.GlobalStorage"
    assert obj.state == {"a": 1}
    report = torchless.scan(path)
    assert [f.status for f in report.files] == ["unvetted"]


def test_unknown_storage_name_in_torch_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.pkl"
    path.write_bytes(
        _PICKLE.replace(b"torch_geometric.data.storage\nGlobalStorage", b"torch\nEvilStorage")
    )
    with pytest.raises(torchless.UnsafeGlobalError, match="no such storage type"):
        torchless.load(path)
