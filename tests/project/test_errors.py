"""Every error says what was wrong, where, and what to do: ``e.hint``, the CLI's hint line,
the ``"hint"`` of JSON outputs, hints across pickling and process pools, and messages
checked by substance over malformed files built here."""

from __future__ import annotations

import copy
import json
import pickle
import re
import struct
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import NoReturn

import pytest

import torchless
from torchless import (
    AmbiguousArchiveError,
    ArchiveFormatError,
    CheckpointError,
    ChecksumError,
    ConversionError,
    FormatError,
    InternalError,
    InvalidKeyError,
    LimitError,
    MissingFileError,
    NotACheckpointError,
    PickleError,
    StorageError,
    TensorGeometryError,
    TruncatedInputError,
    UnsafeGlobalError,
    UnsafePathError,
    UnsupportedError,
    UnsupportedOpcodeError,
)
from torchless.cli.main import main

from .._fuzz_inputs import (
    ZipMember,
    _global,
    make_zip,
    small_zip_checkpoint,
    state_dict_pickle,
    tar_checkpoint,
    tensor_ops,
    zip_checkpoint,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "errors.md"

EXPORTED: list[type[CheckpointError]] = [
    obj for name in torchless.__all__
    if isinstance(obj := getattr(torchless, name), type) and issubclass(obj, CheckpointError)]

#: What each class's default hint must tell the user (written by hand, not copied).
ADVICE: dict[type[CheckpointError], tuple[str, ...]] = {
    CheckpointError: ("torchless scan",),
    FormatError: ("damaged", "again"),
    TruncatedInputError: ("cut short", "again"),
    NotACheckpointError: ("not a PyTorch checkpoint",),
    ArchiveFormatError: ("archive", "again"),
    AmbiguousArchiveError: ("do not torch.load",),
    ChecksumError: ("download the file again",),
    UnsafePathError: ("do not unpack or torch.load",),
    StorageError: ("tensor data",),
    TensorGeometryError: ("shape, stride or offset",),
    PickleError: ("pickle",),
    UnsupportedOpcodeError: ("opcode",),
    UnsafeGlobalError: ("do not torch.load", "allow_globals=", "--allow-global"),
    LimitError: ("Limits(", "--limit"),
    UnsupportedError: ("--skip-unsupported", "Checkpoint.tensors"),
    ConversionError: ("output",),
    InvalidKeyError: ("--key",),
    InternalError: ("bug in torchless", "not a verdict on the file", "report"),
    MissingFileError: ("no file at this path", "relative path"),
}


# ---- (a) hints on the classes --------------------------------------------------------

def test_every_exported_error_has_its_advice() -> None:
    assert set(EXPORTED) == set(ADVICE), "a new error class needs a hint and a row here"
    for cls, words in ADVICE.items():
        assert isinstance(cls.hint, str) and cls.hint.strip(), cls
        assert "\n" not in cls.hint, cls
        for word in words:
            assert word in cls.hint, (cls.__name__, word)


def test_subclasses_have_their_own_hint() -> None:
    """Each situation differs from its parent's, so no class inherits its parent's hint."""
    for cls in EXPORTED:
        if cls is CheckpointError:
            continue
        parent = next(b for b in cls.__mro__[1:] if issubclass(b, CheckpointError))
        assert cls.hint != parent.hint, f"{cls.__name__} repeats {parent.__name__}'s hint"


def test_hint_keyword_overrides_and_str_stays_location_and_message() -> None:
    e = FormatError("bad thing", path="f.pt", member="archive/data.pkl", offset=7)
    assert e.hint == FormatError.hint
    assert str(e) == "f.pt: archive/data.pkl at byte 7: bad thing"
    custom = FormatError("bad thing", path="f.pt", hint="do this")
    assert custom.hint == "do this" and str(custom) == "f.pt: bad thing"
    assert FormatError.hint != "do this"  # the class default is untouched


def test_limit_hint_names_the_limit_and_a_value_that_works() -> None:
    e = LimitError("max_tensors", 10, 25, "tensor names")
    assert "Limits(max_tensors=N)" in e.hint and "--limit max_tensors=N" in e.hint
    assert "N at least 25" in e.hint
    assert "max_tensors=10 exceeded: 25" in str(e)


def test_memory_is_not_presented_as_a_limits_field() -> None:
    e = LimitError("memory", 0, 0, "out of memory while unpickling", offset=3)
    assert str(e) == "at byte 3: out of memory while unpickling"
    assert "Limits(" not in str(e) and "Limits(" not in e.hint and "memory" in e.hint


# ---- (c) hints survive pickling and process pools ------------------------------------

def _instances() -> list[CheckpointError]:
    out: list[CheckpointError] = []
    for cls in EXPORTED:
        if cls is LimitError:
            out.append(LimitError("max_depth", 4, 9, "nesting", path="p", offset=1, hint="h!"))
        elif issubclass(cls, UnsafeGlobalError):
            out.append(UnsafeGlobalError("refused", names=("os.system",), path="p",
                                         member="m", offset=2, hint="h!"))
        else:
            out.append(cls("msg", path="p", member="m", offset=3, hint="h!"))
    return out


@pytest.mark.parametrize("clone", [lambda e: pickle.loads(pickle.dumps(e)), copy.copy,
                                   copy.deepcopy], ids=["pickle", "copy", "deepcopy"])
def test_hint_and_location_survive_pickle_and_copy(
        clone: Callable[[CheckpointError], CheckpointError]) -> None:
    for e in _instances():
        back = clone(e)
        assert type(back) is type(e)
        assert (str(back), back.hint, back.path, back.member, back.offset) == (
            str(e), "h!", "p", e.member, e.offset)
    limit = clone(LimitError("max_ndim", 64, 70))
    assert isinstance(limit, LimitError) and (limit.limit_name, limit.limit, limit.actual) == (
        "max_ndim", 64, 70)
    assert "--limit max_ndim=N" in limit.hint and "at least 70" in limit.hint
    names = clone(UnsafeGlobalError("x", names=("a.b",)))
    assert isinstance(names, UnsafeGlobalError) and names.names == ("a.b",)


def _raise_in_worker(kind: str) -> None:
    if kind == "limit":
        raise LimitError("max_opcodes", 5, 6, offset=11, path="w.pt")
    raise UnsafeGlobalError("refused global os.system", names=("os.system",),
                            hint="worker hint")


def test_hint_crosses_a_process_pool() -> None:
    with ProcessPoolExecutor(1) as pool:
        limit = pool.submit(_raise_in_worker, "limit").exception(timeout=60)
        unsafe = pool.submit(_raise_in_worker, "unsafe").exception(timeout=60)
    assert isinstance(limit, LimitError)
    assert str(limit) == ("w.pt at byte 11: limit max_opcodes=5 exceeded: 6; raise it with "
                          "Limits(max_opcodes=...) if the file is trusted")
    assert "--limit max_opcodes=N on the command line, N at least 6" in limit.hint
    assert isinstance(unsafe, UnsafeGlobalError) and unsafe.hint == "worker hint"


# ---- malformed inputs, built here -----------------------------------------------------

def _flip_in_member(archive: bytes, name: str) -> bytes:
    """``archive`` with one byte of member ``name``'s stored data changed."""
    at = 0  # the first local header
    while True:
        nlen, elen = struct.unpack_from("<HH", archive, at + 26)
        if archive[at + 30:at + 30 + nlen] == name.encode():
            pos = at + 30 + nlen + elen + 3
            return archive[:pos] + bytes([archive[pos] ^ 0x55]) + archive[pos + 1:]
        csize = struct.unpack_from("<I", archive, at + 18)[0]
        at += 30 + nlen + elen + csize


def _pickle_in_zip(body: bytes) -> bytes:
    return zip_checkpoint(b"\x80\x02" + body)


F32 = struct.pack("<4f", 1, 2, 3, 4)

#: name -> (file bytes, expected class, words the error line must hold)
CASES: dict[str, tuple[bytes, type[CheckpointError], tuple[str, ...]]] = {
    "html.pt": (b"<html><body>Not Found</body></html>", NotACheckpointError, ("HTML",)),
    "empty.pt": (b"", TruncatedInputError, ("empty",)),
    "cut.pt": (small_zip_checkpoint()[:-40], TruncatedInputError, ("end-of-directory",)),
    "crc.pt": (_flip_in_member(small_zip_checkpoint(), "archive/data.pkl"), ChecksumError,
               ("CRC-32", "archive/data.pkl")),
    "os_system.pt": (_pickle_in_zip(_global("os", "system") + b"X\x02\x00\x00\x00ls\x85R."),
                     UnsafeGlobalError, ("archive/data.pkl", "os.system")),
    "opcode.pt": (_pickle_in_zip(b"\xff"), UnsupportedOpcodeError,
                  ("archive/data.pkl at byte 2", "0xff")),
    "stop.pt": (_pickle_in_zip(b"K\x01K\x02."), PickleError, ("archive/data.pkl", "STOP")),
    "trailing.pkl": (pickle.dumps({"a": 1}, protocol=2) + b"junk", PickleError,
                     ("4 bytes after",)),
    "geometry.pt": (zip_checkpoint(state_dict_pickle(
        [("w", tensor_ops("0", 4, 0, (3, 3), (3, 1)))]), {"0": F32}),
        TensorGeometryError, ("archive/data.pkl", "needs 36 bytes")),
    "storage.pt": (zip_checkpoint(state_dict_pickle(
        [("w", tensor_ops("0", 8, 0, (4,), (1,)))]), {"0": F32}),
        StorageError, ("storage '0'",)),
    "traversal.pt": (make_zip([ZipMember("../evil/data.pkl", b"\x80\x02N.")]),
                     UnsafePathError, ("../evil/data.pkl",)),
    "tar_cut.tar": (tar_checkpoint()[:1500], FormatError, ("TAR",)),
    "key.pt": (zip_checkpoint(state_dict_pickle(
        [("__metadata__", tensor_ops("0", 4, 0, (4,), (1,)))]), {"0": F32}),
        InvalidKeyError, ("__metadata__",)),
}


def _run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def _expected_class(path: Path) -> type[CheckpointError]:
    with pytest.raises(CheckpointError) as info:
        if path.name == "key.pt":
            torchless.convert(path, path.with_suffix(".out.safetensors"), force=True)
        else:
            torchless.open(path).close()
    return type(info.value)


# ---- (b) the CLI: one error line with the path, one hint line, exit 1 -------------------

@pytest.mark.parametrize("name", sorted(CASES))
def test_cli_error_then_hint(name: str, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    data, cls, words = CASES[name]
    path = tmp_path / name
    path.write_bytes(data)
    assert issubclass(_expected_class(path), cls)
    commands = [["convert", str(path), "-o", str(tmp_path / "out.safetensors"), "--force"]]
    if cls is not InvalidKeyError:  # a name only the output cannot hold: inspect is fine
        commands.insert(0, ["inspect", str(path)])
    for argv in commands:
        code, err = _run_main(argv, capsys)
        assert code == 1, (argv, err)
        lines = err.splitlines()
        assert len(lines) == 2, err
        assert lines[0].startswith(f"torchless: error: {path}"), err
        assert lines[1].startswith("torchless: hint: ") and len(lines[1]) > 30, err
        for word in words:
            assert word in lines[0], (word, err)
        if issubclass(cls, PickleError):
            assert re.search(r" at byte \d+: ", lines[0]), err
        assert "Traceback" not in err


def test_cli_subprocess_has_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "opcode.pt"
    path.write_bytes(CASES["opcode.pt"][0])
    out = subprocess.run([sys.executable, "-m", "torchless", "inspect", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        f"torchless: error: {path}: archive/data.pkl at byte 2: unknown opcode byte 0xff",
        f"torchless: hint: {UnsupportedOpcodeError.hint}"]


def test_unsafe_global_hint_names_the_global(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.pt"
    path.write_bytes(CASES["os_system.pt"][0])
    code, err = _run_main(["inspect", str(path)], capsys)
    assert code == 1
    hint = err.splitlines()[1]
    assert "--allow-global os.system" in hint and "do not torch.load" in hint


def test_named_tensor_errors_name_the_tensor(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.pt"
    path.write_bytes(zip_checkpoint(state_dict_pickle([
        ("ok", tensor_ops("0", 4, 0, (4,), (1,))),
        ("enc.z", tensor_ops("1", 1, 0, (1,), (1,), "ComplexDoubleStorage"))]),
        {"0": F32, "1": bytes(16)}))
    code, err = _run_main(["convert", str(path), "-o", str(tmp_path / "o.safetensors")],
                          capsys)
    assert code == 1
    error, hint = err.splitlines()
    assert "enc.z (torch.complex128)" in error and "--skip-unsupported" in hint
    assert main(["convert", str(path), "-o", str(tmp_path / "o.safetensors"),
                 "--skip-unsupported"]) == 0


def test_limit_flag_is_the_advice_that_works(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "three.pt"
    path.write_bytes(small_zip_checkpoint())
    code, err = _run_main(["inspect", str(path), "--limit", "max_tensors=2"], capsys)
    assert code == 1
    assert "limit max_tensors=2 exceeded: 3" in err.splitlines()[0]
    assert "--limit max_tensors=N on the command line, N at least 3" in err.splitlines()[1]
    assert main(["inspect", str(path), "--limit", "max_tensors=3"]) == 0
    with pytest.raises(SystemExit) as info:
        main(["inspect", str(path), "--limit", "max_bogus=3"])
    assert info.value.code == 4
    assert "max_tensors" in capsys.readouterr().err  # the valid names are listed


# ---- (c) JSON outputs carry the hint ----------------------------------------------------

def test_batch_json_and_report_carry_the_hint(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.pt"
    bad.write_bytes(CASES["os_system.pt"][0])
    cut = tmp_path / "cut.pt"
    cut.write_bytes(CASES["cut.pt"][0])
    good = tmp_path / "good.pt"
    good.write_bytes(small_zip_checkpoint())
    report = tmp_path / "run.jsonl"
    code = main(["convert", str(bad), str(cut), str(good), "-j", "2", "--json",
                 "--report", str(report)])
    captured = capsys.readouterr()
    assert code == 1
    docs = {Path(d["src"]).name: d for d in json.loads(captured.out)}
    assert "--allow-global os.system" in docs["bad.pt"]["hint"]
    assert docs["cut.pt"]["hint"] == TruncatedInputError.hint
    assert docs["good.pt"]["ok"] and "hint" not in docs["good.pt"]
    assert captured.err.count("torchless: hint: ") == 2
    lines = {Path(d["path"]).name: d
             for d in map(json.loads, report.read_text().splitlines())}
    assert lines["bad.pt"]["hint"] == docs["bad.pt"]["hint"]
    assert lines["good.pt"]["hint"] is None


def test_inspect_many_and_scan_json_carry_the_hint(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "html.pt").write_bytes(CASES["html.pt"][0])
    (tmp_path / "good.pt").write_bytes(small_zip_checkpoint())
    assert main(["inspect", str(tmp_path), "--jsonl"]) == 1
    rows = {Path(d["path"]).name: d for d in map(json.loads, capsys.readouterr().out.split(
        "\n")[:-1])}
    assert rows["html.pt"]["hint"] == NotACheckpointError.hint
    assert main(["scan", str(tmp_path / "html.pt"), "--json"]) == 2
    (entry,) = json.loads(capsys.readouterr().out)["files"]
    assert entry["status"] == "unreadable" and entry["hint"] == NotACheckpointError.hint


# ---- (d) specific messages, by substance ------------------------------------------------

def test_damaged_source_member_is_blamed_on_the_source_not_the_output(tmp_path: Path) -> None:
    src = tmp_path / "deflate.pt"
    data = state_dict_pickle([("w", tensor_ops("0", 6, 0, (6,), (1,)))])
    src.write_bytes(make_zip([
        ZipMember("archive/data.pkl", data), ZipMember("archive/byteorder", b"little"),
        ZipMember("archive/data/0", b"\x07\x00not deflate", deflated=True, size=24, crc=0),
        ZipMember("archive/version", b"3\n")]))
    dst = tmp_path / "out.safetensors"
    with pytest.raises(FormatError) as info:
        torchless.convert(src, dst)
    assert info.value.path == str(src)
    assert "archive/data/0" in str(info.value) and str(dst) not in str(info.value)
    assert not dst.exists()


def test_output_directory_and_checkpoint_as_dst(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "m.pt"
    src.write_bytes(small_zip_checkpoint())
    code, err = _run_main(["convert", str(src), "-o", str(tmp_path)], capsys)
    assert code == 1 and "the output path is a directory" in err and "-o DIR/" in err
    code, err = _run_main(["verify", str(src), str(src)], capsys)
    assert code == 1
    assert "not a safetensors file" in err and "source, not the output" in err


def test_existing_output_hint_says_force(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "m.pt"
    src.write_bytes(small_zip_checkpoint())
    dst = tmp_path / "m.safetensors"
    dst.write_bytes(b"x")
    code, err = _run_main(["convert", str(src), "-o", str(dst)], capsys)
    assert code == 1
    assert err.splitlines()[0] == (f"torchless: error: {dst}: the output file exists (use "
                                   "force=True / --force to replace it)")
    assert "--force" in err.splitlines()[1]


def test_missing_file_and_report_path(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.pt"
    code, err = _run_main(["inspect", str(missing)], capsys)
    assert code == 1 and f"{missing}: cannot open: No such file" in err
    assert "check the path" in err
    good = tmp_path / "good.pt"
    good.write_bytes(small_zip_checkpoint())
    report = tmp_path / "no" / "such" / "dir" / "r.jsonl"
    code, err = _run_main(["convert", str(good), str(good), "--report", str(report)], capsys)
    assert code == 1 and str(report) in err and "torchless: hint: " in err
    assert "Traceback" not in err


def test_type_names_take_the_right_article(tmp_path: Path) -> None:
    path = tmp_path / "pid.pt"
    path.write_bytes(_pickle_in_zip(b"K\x05Q."))  # a persistent id that is an int
    with pytest.raises(StorageError, match=r"persistent id is an int, not a tuple"):
        torchless.open(path)


def test_python2_binary_str_is_explained(tmp_path: Path) -> None:
    path = tmp_path / "py2.pkl"
    path.write_bytes(b"\x80\x02U\x03\xff\xfe\x00.")  # SHORT_BINSTRING of non-UTF-8 bytes
    with pytest.raises(PickleError) as info:
        torchless.open(path)
    assert str(info.value) == (f"{path} at byte 2: a Python 2 str of 3 bytes is not utf-8 "
                               "text (invalid start byte at its byte 0)")
    assert "Python 2" in info.value.hint


def test_inert_tree_errors_point_at_the_tree(tmp_path: Path) -> None:
    import numpy as np

    path = tmp_path / "obj.safetensors"
    torchless.save({"w": np.arange(3, dtype=np.float32), "t": (1, 2)}, path)
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = raw[8:8 + n].replace(b'\\"$tuple\\"', b'\\"$tupel\\"')
    assert header != raw[8:8 + n]
    path.write_bytes(raw[:8] + header + raw[8 + n:])
    with pytest.raises(FormatError) as info:
        torchless.load(path)
    assert str(info.value).startswith(f"{path}: __metadata__['torchless.tree']: unknown tag")
    assert "convert the source checkpoint again" in info.value.hint


# ---- docs --------------------------------------------------------------------------------

def test_errors_page_lists_every_class() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for cls in EXPORTED:
        assert f"`{cls.__name__}`" in text, f"docs/errors.md does not describe {cls.__name__}"
    assert "torchless: hint:" in text and '"hint"' in text


def test_reading_after_close_is_an_error_not_garbage() -> None:
    """Was: Tensor.numpy() after the with block viewed an emptied map and returned whatever
    memory lay there. Arrays taken inside the block stay valid (they keep the map)."""
    example = Path(__file__).resolve().parents[2] / "examples" / "tiny.pt"
    with torchless.open(example) as ckpt:
        weight = ckpt.tensors["state_dict.0.weight"]
        bias = ckpt.tensors["state_dict.0.bias"].numpy()
        expected = bias.tobytes()
    with pytest.raises(CheckpointError, match="closed") as info:
        weight.numpy()
    assert info.value.path == str(example) and "with" in info.value.hint
    assert bias.tobytes() == expected  # taken before close: still the file's bytes


def test_storage_shorter_than_declared_is_refused() -> None:
    """A loader that hands back fewer bytes than the storage declares is refused before any
    array views past them."""
    from torchless.core.dtypes import DTYPES
    from torchless.model.tensor import Storage

    float32 = next(d for d in DTYPES if d.name == "float32")
    storage = Storage("0", float32, 16, lambda: b"\x00" * 8)
    with pytest.raises(torchless.StorageError, match="holds 8 bytes, 16 declared"):
        storage.buffer()


# ---- one error boundary -----------------------------------------------------------------

_INJECTED = [
    (MemoryError(), "LimitError", "out of memory while"),
    (RecursionError("deep"), "LimitError", "recursion while"),
    (OSError(5, "Input/output error"), "CheckpointError", "Input/output error"),
    (KeyError("x"), "InternalError", "internal error while"),
]


@pytest.mark.parametrize(("error", "kind", "text"), _INJECTED,
                         ids=[type(e).__name__ for e, _, _ in _INJECTED])
def test_entry_points_translate_alike(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                      error: BaseException, kind: str, text: str) -> None:
    """open, convert and scan meet the same failure below them the same way (errors'
    error_boundary): a MemoryError or RecursionError is a LimitError, an OSError the system's
    failure (a CheckpointError, no bug), anything else an InternalError with its cause."""
    import torchless.conversion.api as conversion_api
    import torchless.reader.checkpoint as checkpoint
    import torchless.scanner.files as scan_files

    def boom(*args: object, **kwargs: object) -> NoReturn:
        raise error

    src = Path(__file__).parents[2] / "examples" / "tiny.pt"
    monkeypatch.setattr(checkpoint, "_open", boom)
    monkeypatch.setattr(conversion_api, "_convert_any", boom)
    monkeypatch.setattr(scan_files, "_scan_one", boom)
    for call in (lambda: torchless.open(src), lambda: torchless.convert(src, tmp_path / "o.st")):
        with pytest.raises(CheckpointError) as info:
            call()
        assert type(info.value).__name__ == kind, repr(info.value)
        assert text in info.value.message
        assert info.value.path == str(src)
        assert info.value.__cause__ is error
    assert not (tmp_path / "o.st").exists()
    (f,) = torchless.scan(src).files
    assert f.status == ("error" if kind == "InternalError" else "unreadable")
    assert f.error is not None and text in f.error
