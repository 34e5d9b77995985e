"""``torchless.torch.load`` on the tensor kinds torchless reads as records (sparse,
quantized, nested, meta): it returns the torch tensors ``torch.load`` returns, compared part
by part with torch's own accessors (``tests._kinds_oracle``). It refused them, though
``torchless.load(framework="pt")`` rebuilt them.
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


@pytest.mark.parametrize("protocol", [2, 5])
def test_drop_in_gives_torch_dtypes_and_constants(torch: ModuleType, tmp_path: Path,
                                                  protocol: int) -> None:
    """dtypes (a config's ``torch_dtype``), layouts, qschemes and memory formats saved as
    values come back as torch's own objects, as from ``torch.load`` (they came back as
    torchless's ``DType`` and inert ``Global`` records, which ``model.to(dtype)`` rejects)."""
    import torchless.torch as drop_in

    obj: dict[str, Any] = {
        "torch_dtype": torch.bfloat16,
        "dtypes": [torch.float8_e4m3fn, torch.qint8, torch.uint16, torch.complex32],
        "by_dtype": {torch.float16: 1, "x": 2}, "layout": torch.sparse_csr,
        "strided": torch.strided, "qscheme": torch.per_channel_affine, "w": torch.ones(2)}
    if protocol >= 4:  # pickle cannot write a memory format at protocols 2 and 3
        obj["format"] = torch.channels_last
    path = tmp_path / "values.pt"
    torch.save(obj, path, pickle_protocol=protocol)
    expected = torch.load(path, weights_only=False)  # our own file
    loaded = drop_in.load(path)
    assert {k: v for k, v in loaded.items() if k != "w"} == \
        {k: v for k, v in expected.items() if k != "w"}
    assert all(type(loaded[k]) is type(expected[k]) for k in expected)
    assert [type(k) for k in loaded["by_dtype"]] == [type(k) for k in expected["by_dtype"]]
    assert all(type(d) is torch.dtype for d in loaded["dtypes"])
    assert torch.equal(loaded["w"], expected["w"])
