"""The container registry: layouts found by content (a file's first bytes, a directory's
entries), a new one added by one register() call, and the layout reported."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

import torchless
from torchless.containers import registry
from torchless.containers.base import PlainPickle
from torchless.core.limits import Limits
from torchless.io.source import Source
from torchless.model.graph import ModuleHook, module_state_dict
from torchless.pickle.machine import run_pickle
from torchless.rules.resolver import TorchResolver


class _DirectoryOfOnePickle:
    """A toy directory layout: ``DIR/manifest.pkl`` holds the object."""

    format = "toydir"

    def __init__(self, path: str, limits: Limits) -> None:
        self.source = Source(str(Path(path) / "manifest.pkl"))
        self.limits = limits
        self.closed = False

    def load(self, resolver: TorchResolver) -> Any:
        return run_pickle(self.source.raw, resolver, self.limits)[0]

    def persistent_load(self, pid: Any, offset: int) -> Any:
        raise torchless.StorageError("the toy layout has no storages")

    def describe(self, resolver: TorchResolver) -> dict[str, Any]:
        return {"files": 1}

    def module_hook(self) -> ModuleHook:
        return module_state_dict

    def close(self) -> None:
        self.source.close()


@pytest.fixture
def toy_layouts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_FILES", list(registry._FILES))
    monkeypatch.setattr(registry, "_DIRECTORIES", list(registry._DIRECTORIES))
    registry.register(registry.DirectoryLayout(
        "toydir", lambda p: (Path(p) / "manifest.pkl").is_file(),
        lambda p, lim, crc: _DirectoryOfOnePickle(p, lim)))

    class _Skipping(PlainPickle):
        """A toy file layout: 8 magic bytes, then a plain pickle."""

        def __init__(self, source: Source, limits: Limits) -> None:
            super().__init__(source, limits)

        def load(self, resolver: TorchResolver) -> Any:
            return run_pickle(self.source.raw, resolver, self.limits, start=8)[0]

    registry.register(registry.FileLayout(
        "toyfile", lambda head, size: head.startswith(b"TOYMAGIC"),
        lambda s, lim, crc: _Skipping(s, lim)), first=True)


def test_the_built_in_layouts_in_order() -> None:
    assert registry.layouts() == ("zip", "legacy", "tar", "pickle", "dcp", "dcp-hf")


@pytest.mark.usefixtures("toy_layouts")
def test_a_registered_directory_layout_opens(tmp_path: Path) -> None:
    (tmp_path / "manifest.pkl").write_bytes(pickle.dumps({"epoch": 3}, protocol=2))
    with torchless.open(tmp_path) as ckpt:
        assert ckpt.info["layout"] == "toydir" and ckpt.format == "toydir"
        assert ckpt.tree == {"epoch": 3} and ckpt.info["files"] == 1
    assert torchless.load(tmp_path) == {"epoch": 3}


@pytest.mark.usefixtures("toy_layouts")
def test_a_registered_file_layout_opens_whatever_the_name(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(b"TOYMAGIC" + pickle.dumps([1, 2], protocol=2))
    with torchless.open(path) as ckpt:
        assert ckpt.info["layout"] == "toyfile" and ckpt.tree == [1, 2]


def test_a_name_is_registered_once() -> None:
    with pytest.raises(ValueError, match="already registered"):
        registry.register(registry.FileLayout("zip", lambda h, s: False,
                                              lambda s, lim, crc: PlainPickle(s, lim)))


def test_a_directory_no_layout_reads_is_named(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(torchless.NotACheckpointError, match="directory") as info:
        torchless.open(tmp_path)
    assert "torchless convert DIR" in (info.value.hint or "")


@pytest.mark.usefixtures("toy_layouts")
def test_the_scanner_dispatches_through_the_registry(tmp_path: Path) -> None:
    """A layout the scanner has no walk for is never called clean: its pickles were not
    looked at."""
    path = tmp_path / "model.pt"
    path.write_bytes(b"TOYMAGIC" + pickle.dumps([1, 2], protocol=2))
    found = torchless.scan(path).files[0]
    assert found.status == "anomalous" and found.layout == "toyfile"
    assert [a.kind for a in found.anomalies] == ["layout"]
