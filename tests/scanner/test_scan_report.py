"""How a scan report reads: unvetted actions grouped by package and kind, the running
program (``__main__``) named as such. Expected counts are worked out by hand from the objects
each test pickles."""

from __future__ import annotations

import json
import pickle
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchless.scanner.files import format_table, scan
from torchless.scanner.report import action_groups

_MODULES = ("fakepkg", "fakepkg.nn", "fakepkg.nn.tasks", "fakepkg.nn.modules",
            "fakepkg.nn.modules.conv", "fakepkg.nn.modules.block")


@pytest.fixture
def fake_package() -> Iterator[dict[str, type]]:
    """Classes of a package spread over submodules (as ultralytics' are), importable only
    while the test writes its pickle."""
    for name in _MODULES:
        sys.modules[name] = types.ModuleType(name)
    classes = {}
    for module, name in (("fakepkg.nn.tasks", "DetectionModel"),
                         ("fakepkg.nn.modules.conv", "Conv"),
                         ("fakepkg.nn.modules.block", "C2f")):
        cls = type(name, (), {"__module__": module})
        setattr(sys.modules[module], name, cls)
        classes[name] = cls
    try:
        yield classes
    finally:
        for name in _MODULES:
            del sys.modules[name]


def _model(classes: dict[str, type]) -> object:
    """A DetectionModel holding two Convs and a C2f that holds a third Conv: 5 objects of 3
    classes, each with a __dict__ (so each is created with NEWOBJ and filled with BUILD)."""
    conv, c2f, model = classes["Conv"], classes["C2f"], classes["DetectionModel"]
    m = model()
    m.a, m.b = conv(), conv()
    m.c = c2f()
    m.c.inner = conv()
    for o in (m, m.a, m.b, m.c, m.c.inner):
        o.weight = 1.5
    return m


def test_unvetted_actions_grouped_by_package(tmp_path: Path,
                                             fake_package: dict[str, type]) -> None:
    path = tmp_path / "model.pkl"
    path.write_bytes(pickle.dumps({"model": _model(fake_package)}, protocol=2))
    f = scan(path).files[0]
    assert f.status == "unvetted"
    groups = {(g.kind, g.new): g for g in action_groups(f)}
    assert set(groups) == {("import", False), ("call", True), ("build", False)}
    imports = groups["import", False]
    assert imports.module == "fakepkg.nn"  # the prefix the three modules share
    assert sorted(imports.names) == ["modules.block.C2f", "modules.conv.Conv",
                                     "tasks.DetectionModel"]
    assert groups["call", True].count == 5  # five objects created with __new__
    assert len(groups["call", True].names) == 3
    assert groups["build", False].count == 5
    table = format_table(scan(path))
    assert "imports 3 names of fakepkg.nn: tasks.DetectionModel" in table
    assert "creates 5 objects of 3 classes of fakepkg.nn with __new__" in table
    assert "builds 5 objects of 3 classes of fakepkg.nn" in table
    # one line per group, not one per action (15 unvetted actions)
    assert sum(1 for line in table.splitlines() if line.lstrip().startswith("unvetted")) == 3
    verbose = format_table(scan(path), verbose=True)
    assert sum(1 for line in verbose.splitlines()
               if line.lstrip().startswith("unvetted")) > 3
    doc = json.loads(scan(path).to_json())
    texts = [g["text"] for g in doc["files"][0]["groups"]]
    assert "creates 5 objects of 3 classes of fakepkg.nn with __new__: " \
           "tasks.DetectionModel, modules.conv.Conv, modules.block.C2f" in texts


def test_group_names_are_bounded(tmp_path: Path) -> None:
    """Twenty classes of one module: the line names eight and says how many more."""
    sys.modules["manypkg"] = mod = types.ModuleType("manypkg")
    try:
        objs = []
        for i in range(20):
            cls = type(f"K{i:02d}", (), {"__module__": "manypkg"})
            setattr(mod, cls.__name__, cls)
            o = cls()
            o.x = i
            objs.append(o)
        path = tmp_path / "many.pkl"
        path.write_bytes(pickle.dumps(objs, protocol=2))
    finally:
        del sys.modules["manypkg"]
    table = format_table(scan(path))
    assert "imports 20 names of manypkg: K00, K01, K02, K03, K04, K05, K06, K07, … " \
           "(12 more)" in table


def test_dangerous_actions_still_listed_one_by_one(tmp_path: Path) -> None:
    # GLOBAL os.system, then REDUCE with ("echo",): one dangerous call, listed with its args
    path = tmp_path / "p.pkl"
    path.write_bytes(b"cos\nsystem\n(S'echo'\ntR.")
    table = format_table(scan(path))
    assert "dangerous call os.system('echo',) (REDUCE @21)" in table


def test_main_is_the_running_program(tmp_path: Path) -> None:
    # NEWOBJ of a class of __main__ with a BUILD: protocol 2, written by hand
    path = tmp_path / "m.pkl"
    path.write_bytes(b"\x80\x02c__main__\nCfg\n)\x81}U\x02lrK\x01sb.")
    f = scan(path).files[0]
    text = " ".join(a.reason for a in f.actions)
    assert "standard library" not in text
    assert "program that calls torch.load" in text


def test_safetensors_and_inert_files_scan_clean(tmp_path: Path) -> None:
    """torchless's own outputs hold no pickle: a safetensors file and an inert file (the
    object tree in its header) are clean, exit 0, their header checked as the reader
    checks it; a header whose byte ranges run past the data is an anomaly (issue 26, row 6)."""
    import struct

    import torchless

    repo = Path(__file__).resolve().parents[2]
    plain = tmp_path / "tiny.safetensors"
    torchless.convert(repo / "examples" / "tiny.pt", plain, tree=False)
    inert = tmp_path / "inert.safetensors"
    torchless.save({"step": 3, "cfg": {"lr": 0.1}}, inert)
    report = torchless.scan(tmp_path)
    assert [(Path(f.path).name, f.status, f.layout) for f in report.files] == [
        ("inert.safetensors", "clean", "safetensors"), ("tiny.safetensors", "clean",
                                                        "safetensors")]
    assert report.exit_code == 0
    header = b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,99]}}'
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", len(header)) + header + b"\x00" * 16)
    (f,) = torchless.scan(bad).files
    assert f.status == "anomalous" and [a.kind for a in f.anomalies] == ["safetensors"]
