"""Opening a ZIP checkpoint reads its headers and records with ``pread``, never through the
file's map: a read through the map faults in whole readahead windows around each header and
keeps them resident (issue 16: a cold open of 2 GiB read the whole file). The map is for
tensor data alone."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import torchless
from torchless.errors import TruncatedInputError
from torchless.io.source import Source


def _saved(torch: ModuleType, tmp_path: Path) -> tuple[Path, dict[str, object]]:
    sd = {f"layers.{i}.weight": torch.arange(i * 10, i * 10 + 300, dtype=torch.float32)
          .reshape(3, 100) for i in range(12)}
    sd["big"] = torch.ones(70_000, dtype=torch.float32)  # pages between the headers
    path = tmp_path / "m.pt"
    torch.save(sd, path)
    return path, sd


@pytest.mark.skipif(not hasattr(os, "pread"), reason="no pread on this platform")
def test_open_never_views_the_map(torch: ModuleType, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path, sd = _saved(torch, tmp_path)
    views: list[tuple[int, int]] = []
    real_view = Source.view

    def counting(self: Source, offset: int, n: int, what: str = "data") -> memoryview:
        views.append((offset, n))
        return real_view(self, offset, n, what)

    monkeypatch.setattr(Source, "view", counting)
    monkeypatch.setattr(Source, "buffer", property(lambda self: pytest.fail("map read")))
    monkeypatch.setattr(Source, "raw", property(lambda self: pytest.fail("map read")))
    with torchless.open(path) as ckpt:
        assert views == []
        assert sorted(ckpt.tensors) == sorted(sd)
        got = ckpt.numpy("layers.3.weight")  # tensor data: a view of the map
        assert views and views[-1][1] == 300 * 4
        np.testing.assert_array_equal(got, sd["layers.3.weight"].numpy())


def test_read_equals_the_map_and_checks_bounds(tmp_path: Path) -> None:
    data = bytes(range(256)) * 64
    p = tmp_path / "f.bin"
    p.write_bytes(data)
    with Source(p) as src:
        for offset, n in ((0, 0), (0, 10), (1000, 5000), (len(data) - 3, 3)):
            assert src.read(offset, n) == data[offset:offset + n] == bytes(src.view(offset, n))
        with pytest.raises(TruncatedInputError):
            src.read(len(data) - 3, 4)


def test_read_of_a_file_cut_while_open(tmp_path: Path) -> None:
    p = tmp_path / "f.bin"
    p.write_bytes(b"x" * 10_000)
    with Source(p) as src:
        if not hasattr(os, "pread"):
            pytest.skip("no pread on this platform")
        os.truncate(p, 100)
        with pytest.raises(TruncatedInputError, match="cut while open"):
            src.read(50, 1000)
