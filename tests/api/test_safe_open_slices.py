"""``get_slice(name)[index]`` takes what safetensors' own ``get_slice`` takes, with its
results, and refuses what it refuses (None, lists of indices, floats, NumPy bools, a step
below 1, two ellipses, more indices than dimensions, an int out of range). The one
difference, documented: slice bounds past the end or negative are clipped as Python clips
them, where safetensors 0.8 raises; NumPy's result for the same index is then the oracle.

Oracles: the ``safetensors`` package (0.8) on the same file, and NumPy."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import torchless

from ..conftest import require

SHAPES = {"a": (2, 3, 4), "s": (), "e": (0, 3), "v": (5,)}


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require("safetensors")
    from safetensors.numpy import save_file

    arrays = {n: np.asarray(np.arange(int(np.prod(s)), dtype=np.float32).reshape(s) + 1)
              for n, s in SHAPES.items()}
    out = tmp_path_factory.mktemp("slices") / "x.safetensors"
    save_file(arrays, str(out))
    return out


_FIXED: list[Any] = [
    0, -1, -2, 1, 2, 5, -3, True, False, np.int64(1), np.int32(-1), np.bool_(True),
    (), Ellipsis, (Ellipsis, 1), (0, Ellipsis, 1), (0, 0, 0, Ellipsis), (Ellipsis, Ellipsis),
    (0, 1, 2), (0, 1, 2, 3), (0, 0, Ellipsis, 0, 0), (True, True),
    slice(None), slice(1, None), slice(0, 2, 3), slice(None, None, 2), slice(1, 1),
    slice(None, None, -1), slice(None, None, 0), slice(np.int64(1), None), slice(None, 1.0),
    (slice(None), slice(None, None, 2)), (slice(1, None), 2), (0, slice(None), Ellipsis),
    slice(0, 10), slice(-1, None), slice(None, -1), slice(2, 2), slice(10, None),
    [], [0], [1, 0], ([0, 1],), (0, []), None, (None,), (None, 0), (0, None),
    (slice(None), None, 1), 1.0, "a", np.array([1]), [True, False],
]


def _random(rng: random.Random) -> Any:
    def one() -> Any:
        kind = rng.randrange(6)
        if kind == 0:
            return rng.randrange(-6, 6)
        if kind == 1:
            return Ellipsis
        bound = [None, *range(-6, 7)]
        return slice(rng.choice(bound), rng.choice(bound), rng.choice([None, 1, 2, 3]))
    items = tuple(one() for _ in range(rng.randrange(0, 5)))
    return items[0] if len(items) == 1 and rng.random() < 0.5 else items


def _clippable(index: Any, shape: tuple[int, ...]) -> bool:
    """Ints in range, slices of step 1 or more, at most one ``...``: an index safetensors
    refuses only for its slice bounds, which torchless clips as NumPy does."""
    if isinstance(index, list):
        return not index and bool(shape)  # [] is the slice 0:0 of the first dimension
    items = index if isinstance(index, tuple) else (index,)
    if sum(i is Ellipsis for i in items) > 1:
        return False
    rest = [i for i in items if i is not Ellipsis]
    if len(rest) > len(shape):
        return False
    after = len(items) - 1 - next((k for k, i in enumerate(items) if i is Ellipsis),
                                  len(items) - 1)
    for k, item in enumerate(rest):
        dim = shape[k] if k < len(rest) - after or after == 0 else shape[
            len(shape) - (len(rest) - k)]
        if isinstance(item, slice):
            if not all(b is None or type(b) is int or (
                    isinstance(b, np.integer)) for b in (item.start, item.stop)):
                return False
            if item.step is not None and (type(item.step) is not int or item.step < 1):
                return False
        elif type(item) is not int or not -dim <= item < dim:
            return False
    return True


def test_slices_as_safetensors_takes_them(path: Path) -> None:
    import safetensors

    rng = random.Random(5)
    indexes = [*_FIXED, *(_random(rng) for _ in range(400))]
    agreed = clipped = refused = 0
    with torchless.safe_open(path, "np") as ours, safetensors.safe_open(str(path), "np"
                                                                         ) as theirs:
        for name, shape in SHAPES.items():
            full = theirs.get_tensor(name)
            for index in indexes:
                try:
                    want = theirs.get_slice(name)[index]
                except Exception:  # SafetensorError, OverflowError, TypeError
                    want = None
                if want is not None:
                    got = ours.get_slice(name)[index]
                    assert got.dtype == want.dtype and got.shape == want.shape, (name, index)
                    assert got.tobytes() == want.tobytes(), (name, index)
                    agreed += 1
                elif _clippable(index, shape):
                    got = ours.get_slice(name)[index]
                    want = full[index]
                    assert got.shape == want.shape, (name, index)
                    assert got.tobytes() == want.tobytes(), (name, index)
                    clipped += 1
                else:
                    with pytest.raises((TypeError, IndexError, ValueError)):
                        ours.get_slice(name)[index]
                    refused += 1
    assert agreed > 300 and clipped > 50 and refused > 100, (agreed, clipped, refused)


def test_pt_slices_as_torch_indexes(path: Path) -> None:
    """framework="pt": safetensors indexes as torch does (None, lists, bool masks, bounds
    clipped); so does torchless. The one difference: two ellipses, which torch takes as
    one and NumPy refuses."""
    torch = require("torch")
    import safetensors

    rng = random.Random(9)
    lists: list[Any] = [[0], [1, 0], [-1], [True, False], (slice(None), [0, 2]),
                        ([0, 1], 0), (None, slice(None), None), ([0, 0, 1],),
                        (Ellipsis, None), (0, [2, 1], slice(1, 3))]
    indexes = [*_FIXED, *lists, *(_random(rng) for _ in range(300))]
    agreed = refused = 0
    with torchless.safe_open(path, "pt") as ours, safetensors.safe_open(str(path), "pt"
                                                                         ) as theirs:
        for name in SHAPES:
            for index in indexes:
                items = index if isinstance(index, tuple) else (index,)
                if sum(i is Ellipsis for i in items) > 1:
                    continue
                try:
                    want = theirs.get_slice(name)[index]
                except Exception:  # torch's IndexError, ValueError, TypeError
                    want = None
                if want is None:
                    with pytest.raises((TypeError, IndexError, ValueError)):
                        ours.get_slice(name)[index]
                    refused += 1
                    continue
                got = ours.get_slice(name)[index]
                assert isinstance(got, torch.Tensor), (name, index)
                assert got.shape == want.shape and torch.equal(got, want), (name, index)
                agreed += 1
    assert agreed > 300 and refused > 50, (agreed, refused)
