"""``torchless scan`` of DCP directories, PT2 archives and torch.package archives.

Benign files are written by torch itself (``tests._dcpgen``, ``torch.export.save``,
``PackageExporter``) and must scan clean; each hostile variant rewrites one part of a real
file, and torch's own loader is run on it in a subprocess to show that the payload (a
marker file written by ``os.system``) really runs, before the scan must call it dangerous.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests._dcpfixture import dcp_cases  # noqa: F401  (fixture)
from torchless.scanner.files import scan, scan_paths


class _Evil:
    """Pickles as ``os.system(<command>)``: ``torch.load(weights_only=False)`` runs it."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (self.command,))


def _runs(code: str, marker: Path) -> bool:
    """Whether torch, running ``code`` in a fresh process, writes ``marker``."""
    subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=300,
                   check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return marker.exists()


def _rewrite(path: Path, member_suffix: str, data: bytes) -> None:
    """The ZIP archive again, its member ending in ``member_suffix`` replaced by ``data``."""
    with zipfile.ZipFile(path) as z:
        members = [(i.filename, z.read(i)) for i in z.infolist()]
    assert any(n.endswith(member_suffix) for n, _ in members)
    with zipfile.ZipFile(path, "w") as z:
        for name, body in members:
            z.writestr(name, data if name.endswith(member_suffix) else body)


def _torch_save(torch: Any, obj: Any) -> bytes:
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


# ---- DCP ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["single", "fsdp", "dtensor", "st"])
def test_dcp_written_by_torch_is_one_clean_item(dcp_cases: Path, case: str) -> None:  # noqa: F811
    report = scan(dcp_cases / case)
    assert len(report.files) == 1
    f = report.files[0]
    assert (f.status, f.layout, f.anomalies) == ("clean", "dcp", ()), f
    assert f.pickles >= 1  # the metadata at least


def test_cli_scan_of_a_dcp_directory(dcp_cases: Path,  # noqa: F811
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from torchless.cli.main import main

    assert main(["scan", str(dcp_cases / "single")]) == 0
    out = capsys.readouterr().out
    assert "dcp" in out and "1 files: 1 clean" in out


def test_dcp_found_in_a_tree_is_one_item(dcp_cases: Path, tmp_path: Path) -> None:  # noqa: F811
    shutil.copytree(dcp_cases / "single", tmp_path / "run" / "step-1")
    report = scan_paths([tmp_path])
    assert [(f.path, f.status) for f in report.files] == [
        (str(tmp_path / "run" / "step-1"), "clean")]


def test_dcp_hostile_metadata(torch: Any, dcp_cases: Path, tmp_path: Path) -> None:  # noqa: F811
    d = tmp_path / "ckpt"
    shutil.copytree(dcp_cases / "single", d)
    marker = tmp_path / "ran"
    (d / ".metadata").write_bytes(pickle.dumps(_Evil(f"touch {marker}")))
    assert _runs("from torch.distributed.checkpoint import FileSystemReader; "
                 f"FileSystemReader({str(d)!r}).read_metadata()", marker)
    f = scan(d).files[0]
    assert f.status == "dangerous"
    assert {g.member for g in f.dangerous} == {".metadata"}


def _value_item(d: Path) -> tuple[Any, Any]:
    with open(d / ".metadata", "rb") as fh:
        meta = pickle.load(fh)
    for index in meta.storage_data:
        if type(meta.state_dict_metadata[index.fqn]).__name__ == "BytesStorageMetadata":
            return meta, index
    raise AssertionError("no value item")


def test_dcp_hostile_value(torch: Any, dcp_cases: Path, tmp_path: Path) -> None:  # noqa: F811
    """A non-tensor value pointed at a torch.save of a payload appended to the shard: DCP
    reads values with torch.load(weights_only=False)."""
    d = tmp_path / "ckpt"
    shutil.copytree(dcp_cases / "single", d)
    marker = tmp_path / "ran"
    meta, index = _value_item(d)
    info = meta.storage_data[index]
    shard = d / info.relative_path
    blob = _torch_save(torch, _Evil(f"touch {marker}"))
    offset = shard.stat().st_size
    with open(shard, "ab") as fh:
        fh.write(blob)
    # the old bytes of the value now belong to no item: give them back to a second name
    meta.storage_data[index] = type(info)(info.relative_path, offset, len(blob),
                                          info.transform_descriptors)
    meta.storage_data[type(index)(index.fqn + "_old", None, None)] = info
    meta.state_dict_metadata[index.fqn + "_old"] = meta.state_dict_metadata[index.fqn]
    with open(d / ".metadata", "wb") as fh:
        pickle.dump(meta, fh)
    assert _runs("from torch.distributed.checkpoint.format_utils import dcp_to_torch_save; "
                 f"dcp_to_torch_save({str(d)!r}, {str(tmp_path / 'out.pt')!r})", marker)
    f = scan(d).files[0]
    assert f.status == "dangerous", f
    assert all(g.member and g.member.startswith(f"{info.relative_path}@{offset}")
               for g in f.dangerous)
    assert not f.anomalies, f.anomalies


@pytest.mark.parametrize("change", ["trailing", "cut", "overlap"])
def test_dcp_shard_not_matching_metadata(dcp_cases: Path, tmp_path: Path,  # noqa: F811
                                         change: str) -> None:
    d = tmp_path / "ckpt"
    shutil.copytree(dcp_cases / "single", d)
    shard = d / "__0_0.distcp"
    size = shard.stat().st_size
    if change == "trailing":
        with open(shard, "ab") as fh:
            fh.write(b"\0" * 10)
    elif change == "cut":
        os.truncate(shard, size - 10)
    else:
        with open(d / ".metadata", "rb") as fh:
            meta = pickle.load(fh)
        (_, a), (second, b) = sorted(meta.storage_data.items(),
                                         key=lambda kv: kv[1].offset)[:2]
        meta.storage_data[second] = type(b)(b.relative_path, a.offset, b.length,
                                            b.transform_descriptors)
        with open(d / ".metadata", "wb") as fh:
            pickle.dump(meta, fh)
    f = scan(d).files[0]
    assert f.status == "anomalous", f
    kinds = {(a.kind, a.member) for a in f.anomalies}
    assert ("dcp", "__0_0.distcp") in kinds
    words = {"trailing": "belong to no item", "cut": "past the end",
             "overlap": "overlaps"}[change]
    assert any(words in a.message for a in f.anomalies), f.anomalies


@pytest.mark.parametrize("metadata", [b"", b"\x80\x04garbage", b"N.", b"(lp0\n."])
def test_dcp_unreadable_metadata_scans_every_file(dcp_cases: Path, tmp_path: Path,  # noqa: F811
                                                  metadata: bytes) -> None:
    d = tmp_path / "ckpt"
    shutil.copytree(dcp_cases / "single", d)
    (d / ".metadata").write_bytes(metadata)
    f = scan(d).files[0]
    assert f.status in ("anomalous", "dangerous"), f
    assert any(a.kind == "dcp" and a.member == ".metadata" for a in f.anomalies)
    # the shard, scanned as a file of its own: a run of ZIP archives
    assert any((a.member or "").startswith("__0_0.distcp") for a in f.anomalies)


def test_dcp_extra_checkpoint_file(torch: Any, dcp_cases: Path,  # noqa: F811
                                   tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    shutil.copytree(dcp_cases / "single", d)
    (d / "notes.txt").write_text("not a checkpoint\n")
    (d / "extra.pt").write_bytes(_torch_save(torch, _Evil("true")))
    f = scan(d).files[0]
    assert f.status == "dangerous", f
    assert {g.member.split(":")[0] for g in f.dangerous if g.member} == {"extra.pt"}
    assert [a.member for a in f.anomalies] == ["extra.pt"]


@pytest.mark.parametrize("change", ["directory", "pickle"])
def test_dcp_item_not_a_clean_archive(dcp_cases: Path, tmp_path: Path,  # noqa: F811
                                      change: str) -> None:
    """An item whose central directory is broken (walked by its local headers) and one that
    is a plain pickle (torch.load unpickles it on its legacy path): walked in the window."""
    d = tmp_path / "ckpt"
    shutil.copytree(dcp_cases / "single", d)
    meta, index = _value_item(d)
    info = meta.storage_data[index]
    shard = d / info.relative_path
    data = bytearray(shard.read_bytes())
    item = data[info.offset:info.offset + info.length]
    if change == "directory":
        at = item.rfind(b"PK\x01\x02")
        item[at:at + 4] = b"XX\x01\x02"
    else:
        payload = pickle.dumps(_Evil("true"), protocol=2)
        item[:] = payload + b"\0" * (len(item) - len(payload))
    data[info.offset:info.offset + info.length] = item
    shard.write_bytes(bytes(data))
    f = scan(d).files[0]
    where = f"{info.relative_path}@{info.offset}"
    if change == "directory":
        assert f.status == "anomalous", f
        assert all((a.member or "").startswith(where) for a in f.anomalies)
    else:
        assert f.status == "dangerous", f
        assert {g.member for g in f.dangerous} == {f"{where} ({index.fqn})"}


# ---- PT2 ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pt2_file(torch: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(3, 2)
            self.register_buffer("b", torch.ones(2))

        def forward(self, x: Any) -> Any:
            return self.lin(x) + self.b

    path = tmp_path_factory.mktemp("pt2") / "m.pt2"
    torch.export.save(torch.export.export(M(), (torch.randn(4, 3),)), path)
    return path


def test_pt2_written_by_torch_is_clean(pt2_file: Path) -> None:
    f = scan(pt2_file).files[0]
    assert (f.status, f.layout, f.anomalies) == ("clean", "pt2", ()), f
    # the sample inputs' torch.save archive was walked: its tensor globals are listed
    assert any("sample_inputs" in (g.member or "") for g in f.globals)


def test_pt2_hostile_sample_inputs(torch: Any, pt2_file: Path, tmp_path: Path) -> None:
    path = tmp_path / "evil.pt2"
    shutil.copy(pt2_file, path)
    marker = tmp_path / "ran"
    _rewrite(path, "data/sample_inputs/model.pt", _torch_save(torch, _Evil(f"touch {marker}")))
    assert _runs(f"import torch; torch.export.load({str(path)!r})", marker)
    f = scan(path).files[0]
    assert f.status == "dangerous", f
    assert all("data/sample_inputs/model.pt: " in (g.member or "") for g in f.dangerous)


def test_pt2_pickled_weight(torch: Any, tmp_path: Path) -> None:
    """A tensor-subclass parameter is saved with torch.save (``use_pickle``) and read back
    with ``torch.load(weights_only=False)``: its archive is walked, and a payload put in
    its place runs under torch.export.load and is dangerous."""
    from torch.testing._internal.two_tensor import TwoTensor

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.p = torch.nn.Parameter(TwoTensor(torch.ones(3), torch.ones(3)))

        def forward(self, x: Any) -> Any:
            return x + self.p

    path = tmp_path / "sub.pt2"
    torch.export.save(torch.export.export(M(), (torch.ones(3),)), path)
    f = scan(path).files[0]
    assert f.layout == "pt2" and not f.anomalies and not f.dangerous, f
    assert any(g.name == "TwoTensor" and "data/weights/weight_0: " in (g.member or "")
               for g in f.globals)
    marker = tmp_path / "ran"
    _rewrite(path, "data/weights/weight_0", _torch_save(torch, _Evil(f"touch {marker}")))
    assert _runs(f"import torch; torch.export.load({str(path)!r})", marker)
    f = scan(path).files[0]
    assert f.status == "dangerous", f
    assert all("data/weights/weight_0: " in (g.member or "") for g in f.dangerous)


def test_pt2_pickled_constant_is_scanned(pt2_file: Path, tmp_path: Path) -> None:
    """``opaque_obj_*`` constants are read with pickle.loads: scanned as a pickle even when
    the bytes would not pass for one among raw data (protocol 0, broken after the call)."""
    path = tmp_path / "evil.pt2"
    shutil.copy(pt2_file, path)
    with zipfile.ZipFile(path, "a") as z:
        prefix = z.namelist()[0].split("/", 1)[0]
        z.writestr(f"{prefix}/data/constants/opaque_obj_0",
                   b"cos\nsystem\n(S'true'\ntR\xff")
    f = scan(path).files[0]
    assert f.status == "dangerous", f
    assert {g.member for g in f.dangerous} == {f"{prefix}/data/constants/opaque_obj_0"}


def test_pt2_shared_library_is_code(pt2_file: Path, tmp_path: Path) -> None:
    path = tmp_path / "aoti.pt2"
    shutil.copy(pt2_file, path)
    with zipfile.ZipFile(path, "a") as z:
        prefix = z.namelist()[0].split("/", 1)[0]
        z.writestr(f"{prefix}/data/aotinductor/model/model.so", b"\x7fELF" + bytes(60))
    f = scan(path).files[0]
    assert f.status == "anomalous", f
    assert [(a.kind, a.member) for a in f.anomalies] == [
        ("code", f"{prefix}/data/aotinductor/model/model.so")]


def test_pt2_nested_archives_are_bounded(pt2_file: Path, tmp_path: Path) -> None:
    """A PT2 archive inside a PT2 archive's data/, six deep: scanned to the bound, no deeper,
    and the bound is an anomaly."""
    inner = pt2_file.read_bytes()
    prefix = "m"
    for _ in range(6):
        path = tmp_path / "nest.pt2"
        shutil.copy(pt2_file, path)
        with zipfile.ZipFile(path, "a") as z:
            prefix = z.namelist()[0].split("/", 1)[0]
            z.writestr(f"{prefix}/data/sample_inputs/extra.pt", inner)
        inner = path.read_bytes()
    f = scan(tmp_path / "nest.pt2").files[0]
    assert f.status == "anomalous", f
    limits = [a.member or "" for a in f.anomalies if a.kind == "limit"]
    nested = [a.member or "" for a in f.anomalies if a.kind == "nested"]
    assert len(limits) + len(nested) == len(f.anomalies)
    # each archive holds two nested ones; the two at depth 5 are not opened
    assert sorted(m.count("sample_inputs/extra.pt") for m in limits) == [4, 5]
    # a PT2 archive where torch.export.save writes a torch.save one, at depths 1 to 4
    assert sorted(m.count("sample_inputs/extra.pt") for m in nested) == [1, 2, 3, 4]


# ---- torch.package -----------------------------------------------------------------------


def _package(torch: Any, path: Path, obj: Any, intern: str | None = None) -> None:
    from torch.package import PackageExporter

    with warnings.catch_warnings(), PackageExporter(str(path)) as pe:
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
        pe.extern(["torch.**", "collections"])
        if intern:
            pe.intern(intern)
        pe.save_pickle("model", "model.pkl", obj)


def test_package_of_tensors_is_clean(torch: Any, tmp_path: Path) -> None:
    path = tmp_path / "sd.package"
    _package(torch, path, {"w": torch.ones(2, 3), "n": 3})
    f = scan(path).files[0]
    assert (f.status, f.layout, f.anomalies) == ("clean", "package", ()), f
    assert f.pickles == 1


def test_package_modules_are_code_that_runs(torch: Any, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pkgmod_helper.py").write_text("class Thing:\n    def __init__(self, t):\n"
                                                "        self.t = t\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import pkgmod_helper  # type: ignore[import-not-found]

    path = tmp_path / "mod.package"
    _package(torch, path, pkgmod_helper.Thing(torch.ones(2)), intern="pkgmod_helper")
    f = scan(path).files[0]
    assert f.status == "anomalous", f
    code = [a for a in f.anomalies if a.kind == "code"]
    assert [a.member for a in code] == ["mod/pkgmod_helper.py"]
    assert "runs on load" in code[0].message


def test_package_hostile_pickle(torch: Any, tmp_path: Path) -> None:
    path = tmp_path / "evil.package"
    _package(torch, path, {"w": torch.ones(2)})
    marker = tmp_path / "ran"
    _rewrite(path, "model/model.pkl", pickle.dumps(_Evil(f"touch {marker}"), protocol=3))
    # the importer imports only the archive's own and its listed extern modules
    with zipfile.ZipFile(path) as z:
        externs = z.read("evil/.data/extern_modules")
    _rewrite(path, ".data/extern_modules", externs + b"posix\n")
    assert _runs("from torch.package import PackageImporter; "
                 f"PackageImporter({str(path)!r}).load_pickle('model', 'model.pkl')", marker)
    f = scan(path).files[0]
    assert f.status == "dangerous", f
    assert {g.member for g in f.dangerous} == {"evil/model/model.pkl"}


def test_package_module_running_on_import(torch: Any, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The packaged source runs when the pickle names its class: no global of the pickle
    is dangerous, the module is what the scan must report."""
    marker = tmp_path / "ran"
    (tmp_path / "pkgmod_evil.py").write_text("class Thing:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import pkgmod_evil  # type: ignore[import-not-found]

    path = tmp_path / "evil.package"
    _package(torch, path, pkgmod_evil.Thing(), intern="pkgmod_evil")
    _rewrite(path, "pkgmod_evil.py", f"import os\nos.system('touch {marker}')\n"
             "class Thing:\n    pass\n".encode())
    with zipfile.ZipFile(path) as z:
        externs = z.read("evil/.data/extern_modules")
    _rewrite(path, ".data/extern_modules", externs + b"os\n")
    assert _runs("from torch.package import PackageImporter; "
                 f"PackageImporter({str(path)!r}).load_pickle('model', 'model.pkl')", marker)
    f = scan(path).files[0]
    assert f.status != "clean" and f.exit_code == 1, f
    assert [a.member for a in f.anomalies if a.kind == "code"] == ["evil/pkgmod_evil.py"]


class _Config:
    """A class of the test package (``tests``, which no one vetted): creating it runs that
    package's code."""

    def __init__(self) -> None:
        self.lr = 0.1


def test_unvetted_inside_nested_archives_is_not_clean(torch: Any, dcp_cases: Path,  # noqa: F811
                                                       pt2_file: Path, tmp_path: Path) -> None:
    """An unvetted class in a DCP value item or in a PT2 archive's sample inputs makes the
    whole item unvetted, as the same pickle does in a file of its own: the nested scan's
    actions count toward the verdict, not only its dangerous names."""
    blob = _torch_save(torch, {"cfg": _Config()})
    alone = tmp_path / "alone.pt"
    alone.write_bytes(blob)
    assert scan(alone).files[0].status == "unvetted"
    d = tmp_path / "ckpt"
    shutil.copytree(dcp_cases / "single", d)
    meta, index = _value_item(d)
    info = meta.storage_data[index]
    shard = d / info.relative_path
    offset = shard.stat().st_size
    with open(shard, "ab") as fh:
        fh.write(blob)
    meta.storage_data[index] = type(info)(info.relative_path, offset, len(blob),
                                          info.transform_descriptors)
    meta.storage_data[type(index)(index.fqn + "_old", None, None)] = info
    meta.state_dict_metadata[index.fqn + "_old"] = meta.state_dict_metadata[index.fqn]
    with open(d / ".metadata", "wb") as fh:
        pickle.dump(meta, fh)
    f = scan(d).files[0]
    assert (f.status, f.anomalies) == ("unvetted", ()), f
    assert any(a.severity == "unvetted" and (a.member or "").startswith(info.relative_path)
               for a in f.actions)
    path = tmp_path / "cfg.pt2"
    shutil.copy(pt2_file, path)
    _rewrite(path, "data/sample_inputs/model.pt", blob)
    f = scan(path).files[0]
    assert f.status == "unvetted", f
    assert any(a.severity == "unvetted" and "sample_inputs" in (a.member or "")
               for a in f.actions)
