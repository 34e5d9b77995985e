"""The container registry: layouts found by content (a file's first bytes, a directory's
entries), a new one added by one register() call, and the layout reported."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pytest

import torchless
from torchless.containers import registry
from torchless.containers.base import PlainPickle, plain_regions
from torchless.containers.regions import RegionSink
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


def _toyfile_regions(source: Source, limits: Limits, sink: RegionSink) -> str:
    """The toy file layout's region walk: the pickle after its magic."""
    sink.chain(source.raw, 8, source.size, None, "toy")
    return "toyfile"


def _toydir_regions(path: str, limits: Limits, sink: RegionSink) -> str:
    """The toy directory layout's region walk: its manifest pickle."""
    with Source(str(Path(path) / "manifest.pkl")) as source:
        sink.chain(source.raw, 0, source.size, "manifest.pkl", "toy manifest")
    return "toydir"


@pytest.fixture
def toy_layouts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_FILES", list(registry._FILES))
    monkeypatch.setattr(registry, "_DIRECTORIES", list(registry._DIRECTORIES))
    registry.register(registry.DirectoryLayout(
        "toydir", lambda p: (Path(p) / "manifest.pkl").is_file(),
        lambda p, lim, crc: _DirectoryOfOnePickle(p, lim), _toydir_regions))

    class _Skipping(PlainPickle):
        """A toy file layout: 8 magic bytes, then a plain pickle."""

        def __init__(self, source: Source, limits: Limits) -> None:
            super().__init__(source, limits)

        def load(self, resolver: TorchResolver) -> Any:
            return run_pickle(self.source.raw, resolver, self.limits, start=8)[0]

    registry.register(registry.FileLayout(
        "toyfile", lambda head, size: head.startswith(b"TOYMAGIC"),
        lambda s, lim, crc: _Skipping(s, lim), _toyfile_regions), first=True)


def test_the_built_in_layouts_in_order() -> None:
    assert registry.layouts() == ("zip", "legacy", "tar", "pickle", "dcp", "dcp-hf",
                                  "zero", "ranks", "megatron-legacy",
                                  "megatron-dist")


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
                                              lambda s, lim, crc: PlainPickle(s, lim),
                                              plain_regions))


def test_a_directory_no_layout_reads_is_named(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(torchless.NotACheckpointError, match="directory") as info:
        torchless.open(tmp_path)
    assert "torchless convert DIR" in (info.value.hint or "")


def test_every_registered_layout_has_its_region_walk() -> None:
    """The scanner walks each layout through the registry: none is registered without the
    walk of what torch would unpickle in it (or, for a directory, a say that its files are
    scanned each as a file of its own)."""
    for layout in registry._FILES:
        assert callable(layout.regions), layout.name
    assert {d.name: callable(d.regions) or d.regions for d in registry._DIRECTORIES} == \
        {"dcp": True, "dcp-hf": "each file", "zero": "each file",
         "ranks": "each file", "megatron-legacy": "each file", "megatron-dist": True}


def test_a_layout_without_a_region_walk_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_FILES", list(registry._FILES))
    with pytest.raises(TypeError, match="no region walk"):
        registry.register(registry.FileLayout(
            "nowalk", lambda h, s: False, lambda s, lim, crc: PlainPickle(s, lim),
            None))  # type: ignore[arg-type]
    assert "nowalk" not in registry.layouts()


@pytest.mark.usefixtures("toy_layouts")
def test_the_scanner_dispatches_through_the_registry(tmp_path: Path) -> None:
    """A registered layout is scanned by its own region walk: the pickle after the toy
    magic is walked (a global torch would import there is found), and a toy directory is
    one item."""
    path = tmp_path / "model.pt"
    path.write_bytes(b"TOYMAGIC" + pickle.dumps(os.system, protocol=2))
    found = torchless.scan(path).files[0]
    assert found.status == "dangerous" and found.layout == "toyfile"
    assert [(g.name, g.verdict) for g in found.globals] == [("system", "dangerous")]
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "manifest.pkl").write_bytes(pickle.dumps(os.system, protocol=2))
    (item,) = torchless.scan(folder).files
    assert item.path == str(folder) and item.layout == "toydir"
    assert item.status == "dangerous" and item.globals[0].member == "manifest.pkl"
