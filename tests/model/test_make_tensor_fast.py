"""``make_tensor``'s short way for one dimension against its general checks: the same size
and stride given as lists (which the short way does not take) must give the same tensor or
the same error, at and around every bound."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from torchless.core import dtypes
from torchless.core.limits import Limits
from torchless.errors import CheckpointError
from torchless.model.tensor import Storage, make_tensor

F32 = dtypes.by_torch_name("float32")
BIG = (1 << 63) - 1


def _outcome(storage: Storage, offset: Any, size: Any, stride: Any, limits: Limits) -> Any:
    assert F32 is not None
    try:
        t = make_tensor(storage, offset, size, stride, F32, limits, requires_grad=True)
    except CheckpointError as e:
        return type(e).__name__, str(e)
    return t.shape, t.stride, t.storage_offset, t.requires_grad, t.storage is storage


@pytest.mark.parametrize("limits", [Limits(), Limits(max_ndim=0), Limits(max_tensor_bytes=40)])
def test_one_dimension_short_way_is_the_general_way(limits: Limits) -> None:
    assert F32 is not None
    storage = Storage("0", F32, 40, lambda: bytes(40))
    sizes = [0, 1, 2, 9, 10, 11, True, -1, 2.0, BIG, BIG // 4 + 1]
    strides = [0, 1, 2, 3, -1, True, BIG]
    offsets = [0, 1, 9, 10, -1, True, BIG]
    seen = set()
    for n, s, off in itertools.product(sizes, strides, offsets):
        fast = _outcome(storage, off, (n,), (s,), limits)
        general = _outcome(storage, off, [n], [s], limits)
        assert fast == general, (n, s, off)
        seen.add(fast if isinstance(fast[0], str) else "tensor")
    # the cases reach a tensor (where a dimension is allowed) and several distinct refusals
    assert ("tensor" in seen) == (limits.max_ndim >= 1) and len(seen) >= 4, seen
