"""``.pt2`` archives (torch.export.save) and torch.package archives, against torch.

The expected tensors come from torch: ``ExportedProgram.state_dict`` and ``.constants`` (and
what ``torch.export.load`` gives back), ``PackageImporter.load_pickle``. Variants torchless
does not read are refused naming what they are.
"""

from __future__ import annotations

import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import torchless

pytestmark = pytest.mark.torch


def _same(torch: Any, ours: torchless.Tensor, theirs: Any) -> None:
    assert ours.dtype.name == str(theirs.dtype).removeprefix("torch.")
    assert ours.shape == tuple(theirs.shape)
    assert ours.requires_grad == theirs.requires_grad
    assert ours.is_parameter == isinstance(theirs, torch.nn.Parameter)
    assert torch.equal(ours.to_torch().detach(), theirs.detach())


def _export(torch: Any, path: Path) -> Any:
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(3, 2)
            self.emb = torch.nn.Parameter(torch.arange(8, dtype=torch.float16).reshape(4, 2))
            self.register_buffer("steps", torch.tensor([7, 9], dtype=torch.int64))
            self.register_buffer("scratch", torch.ones(2), persistent=False)
            self.lifted = torch.tensor([0.5, -1.5])  # a plain attribute: a lifted constant

        def forward(self, x: Any) -> Any:
            y = self.lin(x) + self.steps + self.scratch + self.lifted
            return y + self.emb.float().sum()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(M(), (torch.randn(1, 3),))
        torch.export.save(ep, path)
    return ep


def test_pt2_tensors_equal_state_dict_and_constants(torch: Any, tmp_path: Path) -> None:
    path = tmp_path / "m.pt2"
    ep = _export(torch, path)
    want = {**ep.state_dict, **ep.constants}
    assert "scratch" in ep.constants and "lifted" in ep.constants  # the case is what it says
    with torchless.open(path) as ckpt:
        assert ckpt.format == "pt2"
        assert ckpt.info["archive_version"] == 0
        assert ckpt.info["models"] == ["model"]
        assert sorted(ckpt.info["constants"]) == sorted(ep.constants)
        assert "PT2 archive version 0" in ckpt.info["era"]
        assert sorted(ckpt.tensors) == sorted(want)
        for name, t in want.items():
            _same(torch, ckpt.tensors[name], t)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = torch.export.load(path)
    loaded = torchless.load(path)
    for name, t in {**back.state_dict, **back.constants}.items():
        np.testing.assert_array_equal(loaded[name], t.detach().numpy())


def test_pt2_aliased_weights_share_one_record(torch: Any, tmp_path: Path) -> None:
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(2, 2, bias=False)
            self.b = torch.nn.Linear(2, 2, bias=False)
            self.b.weight = self.a.weight
            self.register_buffer("tail", torch.arange(8.)[4:])  # a view at an offset

        def forward(self, x: Any) -> Any:
            return self.b(self.a(x)) + self.tail[:2]

    path = tmp_path / "tied.pt2"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(Tied(), (torch.randn(1, 2),))
        torch.export.save(ep, path)
    with torchless.open(path) as ckpt:
        assert sorted(ckpt.tensors) == sorted(ep.state_dict)
        for name, t in ep.state_dict.items():
            _same(torch, ckpt.tensors[name], t)


def _rewrite(src: Path, dst: Path, change: dict[str, bytes | None]) -> None:
    """A copy of a ZIP archive with some members replaced (None: removed) or added."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        names = zin.namelist()
        prefix = names[0].split("/", 1)[0] + "/"
        for name in names:
            rel = name[len(prefix):]
            if rel in change:
                data = change.pop(rel)
                if data is not None:
                    zout.writestr(name, data)
            else:
                zout.writestr(name, zin.read(name))
        for rel, data in change.items():
            if data is not None:
                zout.writestr(prefix + rel, data)


@pytest.mark.parametrize(("change", "error", "message"), [
    ({"archive_version": b"1"}, torchless.UnsupportedError, "PT2 archive version 1"),
    ({"archive_format": b"pt3"}, torchless.UnsupportedError, r"archive_format record is 'pt3'"),
    ({"models/model.json": None, "data/aotinductor/model/model.wrapper.so": b"\x7fELF"},
     torchless.UnsupportedError, "AOTInductor package"),
    ({"data/weights/model.pt": b"PK"}, torchless.UnsupportedError, "legacy layout"),
    ({"data/weights/model_weights_config.json": b"[1, 2"}, torchless.ArchiveFormatError,
     "not JSON"),
])
def test_pt2_variants_are_named(torch: Any, tmp_path: Path, change: dict[str, bytes | None],
                                error: type[Exception], message: str) -> None:
    path = tmp_path / "m.pt2"
    _export(torch, path)
    bad = tmp_path / "bad.pt2"
    _rewrite(path, bad, dict(change))
    with pytest.raises(error, match=message):
        torchless.open(bad)


def test_zip_without_data_pkl_says_what_torchless_reads(tmp_path: Path) -> None:
    path = tmp_path / "other.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x/readme.txt", b"hello")
    with pytest.raises(torchless.NotACheckpointError,
                       match=r"not a torch checkpoint \(a ZIP with 1 files") as info:
        torchless.open(path)
    assert "torch.export.save" in info.value.hint and "torch.package" in info.value.hint


_MODULE = '''
import torch

class Holder:
    def __init__(self):
        self.w = torch.arange(6.).reshape(2, 3)
        self.tag = "kept"

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
'''


def test_package_tensors_equal_load_pickle_and_classes_stay_inert(
        torch: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.package import PackageExporter, PackageImporter

    module = "tl_packaged_mod"
    (tmp_path / f"{module}.py").write_text(_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = __import__(module)
    obj = {"h": mod.Holder(), "t": torch.ones(3, dtype=torch.bfloat16), "net": mod.Net(),
           "shared": [torch.arange(4)] * 2}
    path = tmp_path / "p.pt"
    with warnings.catch_warnings(), PackageExporter(str(path)) as pe:
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
        pe.intern(module)
        pe.extern(["torch.**", "collections", "builtins"])
        pe.save_pickle("res", "obj.pkl", obj)
    del sys.modules[module]
    monkeypatch.syspath_prepend(str(tmp_path / "nowhere"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = PackageImporter(str(path)).load_pickle("res", "obj.pkl")
    want = {"h.w": theirs["h"].w, "t": theirs["t"], "shared.0": theirs["shared"][0],
            "shared.1": theirs["shared"][1],
            **{f"net.{k}": v for k, v in theirs["net"].state_dict(keep_vars=True).items()}}
    assert module not in sys.modules  # torch imported it under its own mangled name
    with torchless.open(path) as ckpt:
        assert ckpt.format == "package"
        assert ckpt.info["interned"] == [module]
        assert ckpt.info["pickles"] == ["res/obj.pkl"]
        assert sorted(ckpt.tensors) == sorted(want)
        for name, t in want.items():
            _same(torch, ckpt.tensors[name], t)
        assert ckpt.tensors["shared.0"].storage is ckpt.tensors["shared.1"].storage
        opaque = {f"{g.module}.{g.name}" for g in ckpt.opaque}
        assert opaque >= {f"{module}.Holder", f"{module}.Net"}
        assert ckpt.tree["h"].state["tag"] == "kept"
    assert module not in sys.modules  # torchless never imported the packaged module


def test_package_with_no_pickle_is_named(torch: Any, tmp_path: Path) -> None:
    from torch.package import PackageExporter

    path = tmp_path / "text.pt"
    with PackageExporter(str(path)) as pe:
        pe.save_text("res", "notes.txt", "no tensors here")
    with pytest.raises(torchless.ArchiveFormatError, match=r"torch\.package archive with no "
                                                         r"pickled resource"):
        torchless.open(path)


def test_an_unpacked_archive_directory_is_named(torch: Any, tmp_path: Path) -> None:
    path = tmp_path / "m.pt2"
    _export(torch, path)
    with zipfile.ZipFile(path) as z:
        z.extractall(tmp_path / "unpacked")
    for where in (tmp_path / "unpacked", next((tmp_path / "unpacked").iterdir())):
        with pytest.raises(torchless.NotACheckpointError, match=r"PT2 archive .* unpacked"):
            torchless.open(where)


def test_pt2_tensor_subclass_records_are_read_as_nested_checkpoints(
        torch: Any, tmp_path: Path) -> None:
    """A tensor subclass weight is a torch.save archive inside its record: read with the
    same rules as a .pt file of it (a wrapper subclass is listed by its kind)."""
    from torch.testing._internal.two_tensor import TwoTensor

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.p = torch.nn.Parameter(TwoTensor(torch.ones(2), torch.zeros(2)))
            self.register_buffer("plain", torch.arange(3.))

        def forward(self, x: Any) -> Any:
            return x + self.p + self.plain[:2]

    path, alone = tmp_path / "sub.pt2", tmp_path / "p.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(M(), (torch.ones(2),))
        torch.export.save(ep, path)
        torch.save(ep.state_dict["p"], alone)
    with torchless.open(alone) as ckpt:
        want = dict(ckpt.unsupported)
    with torchless.open(path) as ckpt:
        assert dict(ckpt.unsupported) == {"p": want[""]}
        _same(torch, ckpt.tensors["plain"], ep.state_dict["plain"])
        assert any(g.name == "TwoTensor" for g in ckpt.opaque)
