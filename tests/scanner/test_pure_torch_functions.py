"""``torch.zeros_like`` and ``torch.ones_like`` kept as values are vetted references.

normflows' ``MaskedAffineFlow`` keeps ``torch.zeros_like`` as an attribute; a whole-model
save pickles it (protocol 2) as ``getattr(torch._C._VariableFunctionsClass, "zeros_like")``.
The function makes a tensor shaped like its argument: pure tensor computation, like the
activations already vetted. A benign file holding it must scan clean.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

import torchless


@pytest.mark.parametrize("name", ["zeros_like", "ones_like"])
@pytest.mark.parametrize("protocol", [2, 4])
def test_like_functions_scan_clean(
    torch: ModuleType, tmp_path: Path, name: str, protocol: int
) -> None:
    path = tmp_path / f"{name}.pt"
    torch.save({"fill": getattr(torch, name), "w": torch.ones(2)}, path, pickle_protocol=protocol)
    (scan,) = torchless.scan(path).files
    assert scan.status == "clean", [(g.module, g.name, g.verdict, g.reason) for g in scan.globals]
    with torchless.open(path) as ckpt:
        assert list(ckpt.tensors) == ["w"]


def test_inspect_empty_is_a_vetted_sentinel(torch: ModuleType, tmp_path: Path) -> None:
    """torch_geometric's Inspector keeps ``inspect.Parameter.empty`` (the class
    ``inspect._empty``) in every whole-model save; ``inspect`` is a denied family, but this
    sentinel (a class whose body is a docstring) is data: read as an inert reference, and an
    instance of it as an inert record; the file scans clean."""
    import inspect

    path = tmp_path / "empty.pt"
    torch.save(
        {"default": inspect.Parameter.empty, "made": inspect.Parameter.empty(), "w": torch.ones(2)},
        path,
    )
    (scan,) = torchless.scan(path).files
    assert scan.status == "clean", [(g.module, g.name, g.verdict, g.reason) for g in scan.globals]
    obj = torchless.load(path)
    assert isinstance(obj["default"], torchless.Global)
    assert obj["default"].path == "inspect._empty"
    assert isinstance(obj["made"], torchless.Opaque)
    assert obj["made"].class_path == "inspect._empty"
    assert list(obj) == ["default", "made", "w"]
