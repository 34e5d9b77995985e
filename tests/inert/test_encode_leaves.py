"""The encoder's short way for a plain tensor leaf (one reached once, without attributes)
against its general way: the same tree where every tensor is an instance of a subclass of
:class:`Tensor` (which the short way does not take) must encode to the same text and the
same entries, with names given (as ``convert`` gives them) and without."""

from __future__ import annotations

import collections
import math
from typing import Any

import pytest

from torchless.core import dtypes
from torchless.core.limits import Limits
from torchless.errors import ConversionError, LimitError
from torchless.inert.encode import Encoder
from torchless.model.tensor import Storage, Tensor


class _General(Tensor):
    """A Tensor the encoder's leaf test (``type(obj) is Tensor``) does not match."""

    __slots__ = ()


def _tensor(cls: type[Tensor], i: int, **flags: Any) -> Tensor:
    dt = dtypes.by_torch_name(("float32", "float16", "int64", "bool")[i % 4])
    assert dt is not None
    shape = ((3,), (2, 2), (), (0, 4))[i % 4]
    n = math.prod(shape) * dt.itemsize
    storage = Storage(str(i), dt, n, lambda: bytes(n), location=flags.pop("location", "cpu"))
    stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    return cls(storage, dt, shape, stride, 0, **flags)


def _tree(cls: type[Tensor]) -> tuple[Any, list[Tensor]]:
    ts = [_tensor(cls, i) for i in range(12)]
    both = [1, 2]  # reached twice: through a tensor's attribute and the tree
    ts += [_tensor(cls, 12, requires_grad=True, is_parameter=True),
           _tensor(cls, 13, location="cuda:0"), _tensor(cls, 14, is_storage=True),
           _tensor(cls, 15, attrs={"note": "x", "twin": ts[2], "list": both})]
    shared = ts[3]
    tree = {"state": {f"w{i}": t for i, t in enumerate(ts)},
            "again": [shared, (ts[5], ts[5]), collections.OrderedDict(a=ts[6]), both],
            "$odd": ts[7], 7: ts[8], "epoch": 3}
    return tree, ts


@pytest.mark.parametrize("named", [True, False])
def test_leaf_short_way_is_the_general_way(named: bool) -> None:
    texts, entries = [], []
    for cls in (Tensor, _General):
        tree, ts = _tree(cls)
        names = {id(t): f"entry.{i}" for i, t in enumerate(ts) if i not in (0, 5, 10)} \
            if named else {}
        enc = Encoder(names=names, reserved={"entry.0"}, records=False)
        texts.append(enc.encode(tree))
        entries.append({n: (t.dtype.name, t.shape) for n, t in enc.tensors.items()})
    assert texts[0] == texts[1]
    assert entries[0] == entries[1]
    assert '"$ref"' in texts[0] and '"requires_grad":true' in texts[0]
    assert '"attrs":{"note":"x","twin":' in texts[0]  # the attributes: docs/inert-format.md


def test_depth_limit_holds_for_leaves() -> None:
    """A leaf one level past max_depth is refused by either way."""
    for cls in (Tensor, _General):
        tree: Any = _tensor(cls, 0)
        for _ in range(4):
            tree = [tree]
        Encoder(limits=Limits(max_depth=4)).encode(tree)
        with pytest.raises((LimitError, ConversionError)):
            Encoder(limits=Limits(max_depth=3)).encode(tree)
