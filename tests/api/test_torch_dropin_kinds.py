"""``torchless.torch.load`` on the tensor kinds torchless reads as records (sparse,
quantized, nested, meta): it returns the torch tensors ``torch.load`` returns, compared part
by part with torch's own accessors (``tests._kinds_oracle``). It refused them, though
``torchless.load(tensors="torch")`` rebuilt them.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.torch


def _kinds(torch: ModuleType) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> Any:
        return torch.randn(*shape, generator=g)

    coo = r(3, 3).to_sparse()
    return {
        "coo": coo, "same_coo": coo, "csr": r(3, 4).to_sparse_csr(),
        "bsc": r(4, 4).to_sparse_bsc((2, 2)),
        "q": torch.quantize_per_tensor(r(4), 0.1, 3, torch.quint8),
        "qc": torch.quantize_per_channel(r(2, 3), torch.tensor([0.1, 0.2]),
                                         torch.tensor([1, 2]), 0, torch.qint8),
        "q4": torch.quantize_per_tensor(r(4), 0.1, 3, torch.quint4x2),
        "nested": torch.nested.nested_tensor([r(2), r(3)]),
        "meta": torch.empty(3, 4, device="meta"),
        "meta_param": torch.nn.Parameter(torch.empty(2, device="meta")),
        "dense": r(2),
    }


@pytest.mark.parametrize("fmt", ["zip", "legacy"])
def test_drop_in_rebuilds_record_kinds(torch: ModuleType, tmp_path: Path, fmt: str) -> None:
    import torchless.torch as drop_in
    from tests import _kinds_oracle as ko

    with warnings.catch_warnings():  # TypedStorage, quantized and nested APIs warn
        warnings.simplefilter("ignore")
        obj = _kinds(torch)
        if fmt == "legacy":  # torch.load cannot read a nested tensor from a legacy stream
            del obj["nested"]
        path = tmp_path / "kinds.pt"
        torch.save(obj, path, _use_new_zipfile_serialization=fmt == "zip")
        expected = torch.load(path, weights_only=False)  # our own file
        loaded = drop_in.load(path)
    assert list(loaded) == list(expected)
    for key, exp in expected.items():
        act = loaded[key]
        assert type(act) is type(exp), key
        assert act.requires_grad == exp.requires_grad, key
        if key == "dense":
            assert torch.equal(act, exp)
        else:
            assert not ko.differences(ko.torch_parts(act), ko.torch_parts(exp)), key
    assert loaded["same_coo"] is loaded["coo"]  # one object, as torch gives it
