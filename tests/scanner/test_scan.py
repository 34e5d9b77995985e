"""``torchless scan``: every payload and bypass flagged, no false alarm on real checkpoints.

Expectations come from outside the scanner: the hostile manifest (category, expected outcome,
marker, error hint) grades the generated cases, REFERENCE.json lists the real fixtures,
the corpus provenance tables say what each third-party sample is, and the unit tests build
their own bytes and compute the offsets they expect from those bytes.

Grading of a hostile case (:func:`expectation`):

* **payload** (category ``code-exec`` / ``gadget``, or error hint ``UnsafeGlobalError``): the
  file must be ``dangerous`` - a global is found and judged, an anomaly is not enough;
* **bypass** (category ``scanner-bypass``, or a marker payload in a case to reject): exit
  code 1 (dangerous or anomalous); a container that is not a checkpoint format at all (7z)
  may be ``unreadable`` (exit 2) but never clean;
* **benign** (``read-safely`` and neither of the above): ``clean``, exit 0;
* everything else (malformed pickles, storage and geometry lies …) is the reader's business:
  the scan must only not crash.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.project.test_hostile import SHARED_CASES, Hostile, hostile  # noqa: F401  (fixture)
from torchless import Limits
from torchless.cli.main import main
from torchless.scanner.files import FileScan, ScanReport, scan, scan_paths

TESTS = Path(__file__).resolve().parents[1]
FIXTURES = TESTS / "data" / "fixtures"
CORPUS = TESTS / "data" / "corpus"
REFERENCE: dict[str, dict[str, Any]] = json.loads((FIXTURES / "REFERENCE.json").read_text())
#: REFERENCE.json magics of torch checkpoint layouts (the others are not checkpoints).
CHECKPOINT_MAGICS = {"zip", "pickle", "tar", "4c31313935343730"}


def expectation(case: dict[str, Any]) -> str:
    """'payload', 'bypass', 'benign' or 'other', from the manifest entry only."""
    if case["category"] in ("code-exec", "gadget") or \
            case.get("error_class_hint") == "UnsafeGlobalError":
        return "payload"
    if case["category"] == "scanner-bypass" or (case.get("marker") and
                                                 case["expected"] == "reject"):
        return "bypass"
    if case["expected"] == "read-safely":
        return "benign"
    return "other"


def _markers() -> set[str]:
    return {n for n in os.listdir("/tmp") if n.startswith("PWNED_")}


@pytest.fixture(scope="session")
def hostile_scan(hostile: Hostile) -> dict[str, FileScan]:  # noqa: F811
    before = _markers()
    cases = hostile.cases
    report = scan_paths([hostile.path(cid) for cid in cases])
    assert _markers() == before, "scanning created a marker file"
    assert len(report.files) == len(cases)
    return dict(zip(cases, report.files, strict=True))


@pytest.mark.parametrize("cid", sorted(SHARED_CASES))
def test_hostile_case(hostile_scan: dict[str, FileScan], hostile: Hostile,  # noqa: F811
                      cid: str) -> None:
    if cid not in hostile.cases:
        pytest.skip("case not generated here (needs torch)")
    case = hostile.cases[cid]
    got = hostile_scan[cid]
    kind = expectation(case)
    detail = (got.status, [(g.module, g.name) for g in got.dangerous],
              [(a.kind, a.message) for a in got.anomalies], got.error)
    if kind == "payload" and (case["category"] in ("code-exec", "gadget") or case["marker"]):
        assert got.status == "dangerous", detail
        assert all(g.reason for g in got.dangerous)
    elif kind == "payload":  # refused by policy, runs nothing: not vetted is enough
        assert got.status in ("dangerous", "unvetted"), detail
    elif kind == "bypass":
        if case.get("error_class_hint") == "UnsupportedFormatError":
            assert got.exit_code != 0, detail
        else:
            assert got.exit_code == 1, detail
    elif kind == "benign":
        assert got.status == "clean", detail
    else:
        assert got.status in ("clean", "dangerous", "anomalous", "unreadable"), detail


def test_hostile_zero_misses_summary(hostile_scan: dict[str, FileScan],
                                     hostile: Hostile) -> None:  # noqa: F811
    """The figures docs/scan.md quotes: every payload/bypass flagged, no benign flagged."""
    kinds = {cid: expectation(c) for cid, c in hostile.cases.items()}
    flagged = [cid for cid, k in kinds.items() if k in ("payload", "bypass")]
    benign = [cid for cid, k in kinds.items() if k == "benign"]
    assert len(flagged) >= 80 and len(benign) >= 30
    assert [c for c in flagged if hostile_scan[c].exit_code == 0] == []
    assert [c for c in benign if hostile_scan[c].exit_code != 0] == []


# ---- third-party samples ------------------------------------------------------------------

#: Samples that are not payloads: controls (clean) and others with the status they must get.
_CORPUS_NOT_PAYLOAD = {
    "picklescan/data/benign0_v0.pkl": "clean",
    "picklescan/data/benign0_v3.pkl": "clean",
    "picklescan/data/benign0_v4.pkl": "clean",
    "picklescan/data/new_pytorch_model.bin": "clean",
    "picklescan/data/pytorch_model.bin": "clean",
    "picklescan/data/benign_password_protected.zip": "anomalous",  # encrypted member
    "picklescan/data/bad_pytorch.pt": "skipped",  # a PNG
    "picklescan/data/malicious1.7z": "unreadable",  # a 7z container
    "modelscan/password_protected.zip": "anomalous",
    "ziplinter/test.zip": "skipped",  # a ZIP of a text file and an image: no checkpoint
    "ziplinter/absolute-name.zip": "anomalous",
    "ziplinter/relative.zip": "anomalous",
    "ziplinter/same-names.zip": "anomalous",
    "ziplinter/symlink.zip": "anomalous",
    "ziplinter/test-mismatched-names.zip": "anomalous",
    "ziplinter/test-trailing-junk.zip": "anomalous",
    "ziplinter/concatenated.zip": "anomalous",
}


def _corpus_expectation(rel: str) -> str | None:
    if rel in _CORPUS_NOT_PAYLOAD:
        return _CORPUS_NOT_PAYLOAD[rel]
    if rel.startswith(("picklescan/", "modelscan/")) and not rel.endswith("PROVENANCE.md"):
        return "dangerous"  # every other picklescan/modelscan sample is a payload
    return None  # billion laughs (a resource attack, not a global), other ZIP oddities


def test_corpus(shared_dir: Path) -> None:
    root = shared_dir / "hostile" / "corpus"
    report = scan(root)
    seen = 0
    for f in report.files:
        rel = Path(f.path).relative_to(root).as_posix()
        want = _corpus_expectation(rel)
        if want is not None:
            seen += 1
            assert f.status == want, (rel, f.status, f.dangerous, f.anomalies, f.error)
    assert seen >= 100


# ---- real checkpoints: no false alarm -----------------------------------------------------

def test_fixtures_no_false_alarm() -> None:
    report = scan(FIXTURES)
    by_rel = {Path(f.path).relative_to(FIXTURES).as_posix(): f for f in report.files}
    for rel, ref in REFERENCE.items():
        got = by_rel[rel]
        if ref["magic"] in CHECKPOINT_MAGICS:
            assert got.status == "clean", (rel, got.dangerous, got.anomalies, got.error)
            assert got.pickles >= 1
        elif rel.endswith(".safetensors"):  # no pickle: scanned, clean (its header checked)
            assert (got.status, got.layout, got.pickles) == ("clean", "safetensors", 0), rel
        else:
            assert got.status == "skipped", (rel, got.status)
    assert report.exit_code == 0


def test_repo_corpus_clean() -> None:
    report = scan(CORPUS)
    checkpoints = [f for f in report.files if f.status != "skipped"]
    assert checkpoints and all(f.status == "clean" for f in checkpoints), \
        [(f.path, f.status, f.anomalies) for f in checkpoints if f.status != "clean"]


# ---- the pickle walk ----------------------------------------------------------------------

def _write(tmp_path: Path, name: str, data: bytes) -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def _one(path: str, **kw: Any) -> FileScan:
    report = scan(path, **kw)
    assert len(report.files) == 1
    return report.files[0]


def _su(s: str) -> bytes:
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b


def test_memo_decoys_resolved_exactly(tmp_path: Path) -> None:
    """Module/name memoised beside decoys and fetched back: the real name is reported."""
    body = b"".join(_su(s) + b"\x94" + b"0" for s in ("os", "system", "torch", "FloatStorage"))
    stack_global = b"h\x00h\x01\x93"
    data = b"\x80\x04" + body + stack_global + _su("id") + b"\x85R."
    path = _write(tmp_path, "x.bin", data)
    f = _one(path)
    assert f.status == "dangerous"
    (g,) = f.dangerous
    assert (g.module, g.name, g.opcode) == ("os", "system", "STACK_GLOBAL")
    assert g.offset == data.index(b"\x93")


def test_unresolvable_stack_global_is_dangerous(tmp_path: Path) -> None:
    """STACK_GLOBAL on values that are not strings (a name built at load time)."""
    data = b"\x80\x04K\x2a" + _su("x") + b"\x93."
    f = _one(_write(tmp_path, "x.pkl", data))
    assert f.status == "dangerous"
    assert f.dangerous[0].offset == data.index(b"\x93")


def test_payload_before_broken_stream(tmp_path: Path) -> None:
    """nullifAI: the payload runs before the unpickler meets the broken bytes."""
    payload = b"\x80\x02cbuiltins\nexec\nX\x01\x00\x00\x00x\x85R"  # exec(('x',))
    data = payload + b"\xff\xfe garbage"
    f = _one(_write(tmp_path, "m.pt", data))
    assert f.status == "dangerous"
    assert f.dangerous[0].offset == 2
    assert any(a.kind == "pickle" and a.offset == len(payload) for a in f.anomalies)


def test_second_pickle_after_stop(tmp_path: Path) -> None:
    first = pickle.dumps(["a", "b"], protocol=2)
    second = b"\x80\x02cposix\nsystem\nX\x02\x00\x00\x00idq\x85R."
    f = _one(_write(tmp_path, "two.pkl", first + second))
    assert f.status == "dangerous"
    assert f.dangerous[0].offset == len(first) + 2
    assert any(a.kind == "trailing" and a.offset == len(first) for a in f.anomalies)


def test_verdicts_come_from_the_model(tmp_path: Path) -> None:
    data = (b"\x80\x02ccollections\nOrderedDict\n)R"  # vetted, and a rebuild rule
            b"cmylib.config\nTrainConfig\n)R"  # a class of a package nobody vetted
            b"\x86.")
    path = _write(tmp_path, "c.pkl", data)
    f = _one(path)
    assert (f.status, f.exit_code) == ("unvetted", 1)
    assert [(g.name, g.verdict) for g in f.globals] == [("OrderedDict", "rebuilt"),
                                                        ("TrainConfig", "unvetted")]
    assert "mylib" in f.unvetted[0].reason
    calls = [(a.target, a.severity, a.args) for a in f.actions if a.kind == "call"]
    assert calls == [("collections.OrderedDict", "vetted", "()"),
                     ("mylib.config.TrainConfig", "unvetted", "()")]
    strict = _one(path, strict=True)
    assert strict.status == "dangerous"
    assert [g.name for g in strict.dangerous] == ["TrainConfig"]
    allowed = _one(path, allow_globals=["mylib.config.TrainConfig"])  # its import and call
    assert allowed.status == "clean"


def test_allowing_a_dangerous_name_does_not_make_it_clean(tmp_path: Path) -> None:
    """--allow-global lets the reader read a file; it does not change what torch.load of it
    would run: an allowed os.system call stays dangerous, and says it was allowed."""
    path = _write(tmp_path, "s.pkl", b"cposix\nsystem\n(S'true'\ntR.")
    f = _one(path, allow_globals=["posix.system"])
    assert f.status == "dangerous"
    calls = [a for a in f.actions if a.kind == "call"]
    assert calls and all(a.severity == "dangerous" for a in calls)
    assert all("allowed by the caller" in a.reason for a in calls)


def test_extension_opcode_is_dangerous(tmp_path: Path) -> None:
    f = _one(_write(tmp_path, "e.pkl", b"\x80\x02\x82\x01."))
    assert [g.opcode for g in f.dangerous] == ["EXT1"]


def test_limits_are_respected(tmp_path: Path) -> None:
    data = b"\x80\x02" + b"N0" * 600 + b"N."
    f = _one(_write(tmp_path, "big.pkl", data), limits=Limits(max_pickle_bytes=1000))
    assert f.status == "anomalous"
    assert [a.kind for a in f.anomalies] == ["limit"]


# ---- ZIP anomalies ------------------------------------------------------------------------

def _torch_like_zip(extra: list[tuple[str, bytes]] = ()) -> bytes:  # type: ignore[assignment]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle.dumps({"a": 1}, protocol=2))
        z.writestr("archive/version", b"3\n")
        for name, data in extra:
            z.writestr(name, data)
    return buf.getvalue()


def test_clean_zip(tmp_path: Path) -> None:
    f = _one(_write(tmp_path, "ok.pt", _torch_like_zip()))
    assert (f.status, f.layout, f.anomalies) == ("clean", "zip", ())


def test_payload_in_every_member(tmp_path: Path) -> None:
    evil = b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00idq\x85R."
    f = _one(_write(tmp_path, "m.pt", _torch_like_zip([("archive/notes.txt", evil)])))
    assert f.status == "dangerous"
    assert [(g.member, g.offset) for g in f.dangerous] == [("archive/notes.txt", 2)]


def test_crc_and_trailing_data(tmp_path: Path) -> None:
    data = bytearray(_torch_like_zip())
    pkl = pickle.dumps({"a": 1}, protocol=2)
    at = bytes(data).index(pkl)
    data[at + len(pkl) - 2] ^= 0x01  # change the int, keep a valid pickle
    f = _one(_write(tmp_path, "crc.pt", bytes(data) + b"junk"))
    kinds = {a.kind for a in f.anomalies}
    assert {"crc", "trailing"} <= kinds, f.anomalies


def test_duplicate_member(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with pytest.warns(UserWarning), zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps(1))
        z.writestr("archive/data.pkl", pickle.dumps(2))
    f = _one(_write(tmp_path, "dup.pt", buf.getvalue()))
    assert "duplicate" in {a.kind for a in f.anomalies}


def test_local_name_differs_from_central(tmp_path: Path) -> None:
    data = bytearray(_torch_like_zip())
    local = bytes(data).index(b"PK\x03\x04")
    name_at = local + 30
    assert bytes(data[name_at:name_at + 16]) == b"archive/data.pkl"
    data[name_at + 8:name_at + 16] = b"datap.kl"
    f = _one(_write(tmp_path, "names.pt", bytes(data)))
    assert any(a.kind == "header" and a.member == "archive/data.pkl" for a in f.anomalies)


def test_flag_bits(tmp_path: Path) -> None:
    data = bytearray(_torch_like_zip())
    for sig, off in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = bytes(data).index(sig)
        flags = struct.unpack_from("<H", data, at + off)[0]
        struct.pack_into("<H", data, at + off, flags | 0x1)
    f = _one(_write(tmp_path, "enc.pt", bytes(data)))
    assert "flags" in {a.kind for a in f.anomalies}


def test_members_of_an_archive_without_directory(tmp_path: Path) -> None:
    """Cut before its central directory, an archive's local entries are still scanned."""
    evil = b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00idq\x85R."
    data = _torch_like_zip([("archive/extra.pkl", evil)])
    f = _one(_write(tmp_path, "cut.pt", data[:data.index(b"PK\x01\x02")]))
    assert f.status == "dangerous"
    assert [g.member for g in f.dangerous] == ["archive/extra.pkl"]
    assert {"eocd", "hidden"} <= {a.kind for a in f.anomalies}


# ---- report, directories, CLI ---------------------------------------------------------------

def _tree(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "model.pt").write_bytes(_torch_like_zip())
    (tmp_path / "README.md").write_text("# notes\n")
    yield tmp_path


def test_directory_walk_and_json(tmp_path: Path) -> None:
    root = next(_tree(tmp_path))
    report = scan(root)
    assert {Path(f.path).name: f.status for f in report.files} == {
        "README.md": "skipped", "model.pt": "clean"}
    assert report.exit_code == 0
    doc = json.loads(report.to_json())
    assert doc["summary"]["clean"] == 1 and doc["exit_code"] == 0
    assert isinstance(report, ScanReport)


def test_unreadable_and_compressed(tmp_path: Path) -> None:
    (tmp_path / "m.pt.gz").write_bytes(b"\x1f\x8b\x08\x00" + bytes(20))
    assert scan(tmp_path).files[0].status == "unreadable"
    assert scan(tmp_path / "missing.pt").exit_code == 2
    text = _write(tmp_path, "notes.txt", b"hello")
    assert _one(text).status == "unreadable"  # named explicitly: not skipped


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _write(tmp_path, "ok.pt", _torch_like_zip())
    bad = _write(tmp_path, "bad.pkl", b"\x80\x02cos\nsystem\n)R.")
    assert main(["scan", good]) == 0
    assert main(["scan", good, bad]) == 1
    out = capsys.readouterr().out
    assert "os.system" in out and "DANGER" in out
    assert main(["scan", "--json", bad]) == 1
    doc = json.loads(capsys.readouterr().out)
    (g,) = [g for g in doc["files"][0]["globals"] if g["verdict"] == "dangerous"]
    assert (g["module"], g["name"], g["offset"]) == ("os", "system", 2)
    assert main(["scan", str(tmp_path / "nope.pt")]) == 2
