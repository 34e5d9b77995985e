"""Messages that blame the right thing (issue 17, item 6).

Each input is written by the test: a ZIP archive that is no torch checkpoint, a zipped model
folder, random bytes, checkpoints cut short, an empty directory. Where torch is the judge of
"not a checkpoint" or "cut short", torch.load is run on the same file and must fail too.
"""

from __future__ import annotations

import io
import os
import pickle
import random
import tarfile
import warnings
import zipfile
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import torchless
from torchless.cli.main import main
from torchless.scanner.files import scan


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def _docs_zip(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("readme.txt", "hello")
        z.writestr("img/logo.png", b"\x89PNG\r\n\x1a\n")
    return path


def _model_zip(path: Path, checkpoint: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("my-model/config.json", "{}")
        z.writestr("my-model/pytorch_model.bin", checkpoint)
    return path


def _saved(torch: ModuleType, **kw: object) -> bytes:
    buf = io.BytesIO()
    torch.save({"w": torch.arange(1000, dtype=torch.float32)}, buf, **kw)  # type: ignore[arg-type]
    return buf.getvalue()


# ---- a ZIP that is not a torch checkpoint --------------------------------------------------

@pytest.mark.torch
def test_a_zip_of_other_files_is_not_a_torch_checkpoint(
        torch: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _docs_zip(tmp_path / "docs.zip")
    with pytest.raises(Exception):  # the oracle: torch cannot load it either
        torch.load(path, weights_only=False)
    with pytest.raises(torchless.NotACheckpointError) as info:
        torchless.open(path)
    assert "not a torch checkpoint (a ZIP with 2 files: 'readme.txt'" in info.value.message
    code, out, err = _cli(capsys, "inspect", str(path))
    assert code == 1 and out == ""
    assert "not a torch checkpoint (a ZIP with" in err and "damaged" not in err
    (got,) = scan(path).files
    assert got.status == "unreadable" and got.error is not None
    assert got.error.startswith("not a torch checkpoint (a ZIP with")


@pytest.mark.torch
def test_a_zipped_model_folder_is_an_archive_of_files(
        torch: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _model_zip(tmp_path / "model.zip", _saved(torch))
    with pytest.raises(torchless.NotACheckpointError) as info:
        torchless.open(path)
    assert "an archive of files" in info.value.message and "unzip it" in info.value.message
    assert "'my-model/pytorch_model.bin'" in info.value.message
    code, out, _ = _cli(capsys, "scan", str(path))
    assert code == 2 and "an archive of files" in out and "unzip it" in out
    # walked in a directory it is not skipped: it may hide a checkpoint
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    report = scan(tmp_path).files
    status = {Path(f.path).name: f.status for f in report}
    assert status == {"model.zip": "unreadable", "notes.txt": "skipped"}
    assert report[0].error is not None and "unzip it" in report[0].error


def _tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_tar_of_other_files_is_not_a_torch_checkpoint(tmp_path: Path) -> None:
    path = _tar(tmp_path / "docs.tar", {"readme.txt": b"hello", "notes.md": b"# notes"})
    with pytest.raises(torchless.NotACheckpointError) as info:
        torchless.open(path)
    assert info.value.message.startswith("not a torch checkpoint (a TAR archive with 2 files")
    (got,) = scan(path).files
    assert got.status == "unreadable" and got.error == info.value.message
    packed = _tar(tmp_path / "model.tar", {"m/pytorch_model.bin": b"PK\x03\x04"})
    with pytest.raises(torchless.NotACheckpointError, match="an archive of files"):
        torchless.open(packed)
    # a pickle among the files is still scanned
    evil = _tar(tmp_path / "evil.tar", {"readme.txt": b"hi",
                                        "x.pkl": b"\x80\x02cposix\nsystem\nX\x04\x00"
                                                 b"\x00\x00true\x85R."})
    (got,) = scan(evil).files
    assert got.status == "dangerous"


# ---- random bytes ----------------------------------------------------------------------------

@pytest.mark.parametrize("first", [b"", b"}", b"\x80\x02", b"K\x01"])
def test_random_bytes_are_not_a_checkpoint(tmp_path: Path, first: bytes,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Random bytes, some of them starting with a byte a pickle may start with."""
    rng = random.Random(17 + len(first))
    body = bytes(rng.randrange(256) for _ in range(4096))
    # a byte no pickle protocol uses, early: the walk breaks there, before any global
    path = tmp_path / "random.bin"
    path.write_bytes(first + b"\xb8" + body)
    with pytest.raises(torchless.NotACheckpointError) as info:
        torchless.open(path)
    assert "not a checkpoint" in info.value.message
    (got,) = scan(path).files
    assert got.status == "unreadable", got
    assert got.error is not None and "not a checkpoint" in got.error
    code, _, _ = _cli(capsys, "scan", str(path))
    assert code == 2


def test_a_broken_pickle_that_names_a_global_stays_dangerous(tmp_path: Path) -> None:
    """What torch would run before the break is not 'not a checkpoint'."""
    path = tmp_path / "broken.pkl"
    path.write_bytes(b"\x80\x02cposix\nsystem\nX\x04\x00\x00\x00true\x85R\xb8garbage")
    (got,) = scan(path).files
    assert got.status == "dangerous"


# ---- files cut short -------------------------------------------------------------------------

@pytest.mark.torch
@pytest.mark.parametrize("kind", ["zip", "legacy", "pickle"])
def test_scan_of_a_truncated_file_is_unreadable(torch: ModuleType, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                kind: str) -> None:
    if kind == "pickle":
        whole = pickle.dumps({"config": list(range(100))}, protocol=4)
    else:
        whole = _saved(torch, _use_new_zipfile_serialization=kind == "zip")
    path = tmp_path / f"cut.{kind}"
    path.write_bytes(whole[:len(whole) // 2])
    if kind != "pickle":
        with pytest.raises(Exception):  # the oracle: torch cannot read it
            torch.load(path, weights_only=False)
    (got,) = scan(path).files
    assert got.status == "unreadable", got
    assert got.hint is not None and "cut short" in got.hint
    code, _, _ = _cli(capsys, "scan", str(path))
    assert code == 2


def test_a_truncated_file_with_a_payload_is_dangerous(tmp_path: Path) -> None:
    path = tmp_path / "cut.pkl"
    path.write_bytes(b"\x80\x02cposix\nsystem\nX\x04\x00\x00\x00true\x85R}q\x00(X\x05\x00")
    (got,) = scan(path).files
    assert got.status == "dangerous"


# ---- empty directories -----------------------------------------------------------------------

@pytest.mark.parametrize("command", ["convert", "inspect", "scan"])
@pytest.mark.parametrize("content", [False, True])
def test_a_directory_without_checkpoints(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         command: str, content: bool) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    if content:
        (folder / "notes.txt").write_text("no checkpoint here")
    code, out, err = _cli(capsys, command, str(folder))
    assert code == 3 and out == ""  # nothing to do: not 1 (refused, or scan's dangerous)
    assert err.startswith(f"torchless: error: no checkpoint files in {folder}")
    assert os.listdir(folder) == (["notes.txt"] if content else [])


# ---- verify --quiet --------------------------------------------------------------------------

@pytest.mark.torch
def test_verify_quiet(torch: ModuleType, tmp_path: Path,
                      capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "m.pt"
    torch.save({"w": torch.arange(6, dtype=torch.float32)}, src)
    dst = tmp_path / "m.safetensors"
    torchless.convert(src, dst)
    assert _cli(capsys, "verify", "--quiet", str(src), str(dst)) == (0, "", "")
    other = tmp_path / "other.safetensors"
    torch.save({"w": torch.zeros(6)}, tmp_path / "o.pt")
    torchless.convert(tmp_path / "o.pt", other)
    assert _cli(capsys, "verify", "-q", str(src), str(other)) == (1, "", "")
    code, out, _ = _cli(capsys, "verify", str(src), str(other))
    assert code == 1 and out  # without --quiet the difference is printed


# ---- torchless.save of an object it does not know -------------------------------------------

class _Unknown:
    def __init__(self) -> None:
        self.a = 1


def test_save_warns_when_it_keeps_an_inert_record(tmp_path: Path) -> None:
    path = tmp_path / "obj.safetensors"
    with pytest.warns(torchless.OpaqueObjectWarning, match=r"_Unknown") as caught:
        torchless.save({"thing": _Unknown(), "x": np.ones(2)}, path)
    assert len(caught) == 1 and "1 object(s) kept as inert records" in str(caught[0].message)
    back = torchless.load(path)
    assert isinstance(back["thing"], torchless.Opaque)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torchless.save({"x": np.ones(2), "n": [1, "a", None]}, tmp_path / "plain.safetensors")
