"""Nothing escapes as a raw Python exception, and a bug is never reported as a refusal.

* JSON nested past ``Limits.max_depth`` (a safetensors header, a Hugging Face index) is a
  ``LimitError``, found in linear time before ``json`` recurses;
* a legacy storage key that is bytes (not UTF-8) is scanned as torch.load reads it, and
  reported; the reader refuses it;
* an unexpected exception inside ``open``, ``load``, ``convert``, ``verify``, ``scan``,
  ``batch`` or the command line is an :class:`InternalError` ("internal error while …", a
  hint asking for a report), not a refusal: ``batch`` says ``failed``, ``scan`` says
  ``error``.
"""

from __future__ import annotations

import collections
import io
import json
import pickle
import struct
import time
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import torchless
from torchless import (
    CheckpointError,
    FormatError,
    InternalError,
    LimitError,
    StorageError,
    UnsafePathError,
)
from torchless.cli.main import main

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "tiny.pt"
#: Words a hint that blames the file would use.
BLAME = ("damaged", "download", "get the file again", "do not torch.load")


# ---- JSON nesting ---------------------------------------------------------------------------


def _safetensors(path: Path, header: bytes, data: bytes = b"") -> Path:
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def _deep(n: int) -> bytes:
    return b'{"a":' + b"[" * n + b"]" * n + b"}"


@pytest.mark.parametrize("depth", [300, 100_000])
def test_deep_safetensors_header_is_a_limit_error(tmp_path: Path, depth: int) -> None:
    """300 is past max_depth=256 but within Python's recursion limit (the limit is ours);
    100,000 would make json.loads raise RecursionError."""
    deep = _safetensors(tmp_path / "deep.safetensors", _deep(depth))
    with pytest.raises(LimitError) as info:
        torchless.load(deep)
    assert info.value.limit_name == "max_depth" and info.value.actual == depth + 1
    assert info.value.path == str(deep)
    with pytest.raises(LimitError):
        torchless.verify(TINY, deep)
    lifted = torchless.Limits(max_depth=depth + 1)
    if depth < 500:  # the limit lifted, json parses it: then the entry is malformed
        with pytest.raises(FormatError, match="malformed"):
            torchless.load(deep, limits=lifted)
    else:  # deeper than Python's parser can go: still a LimitError, never RecursionError
        with pytest.raises(LimitError, match="Python's JSON parser"):
            torchless.load(deep, limits=lifted)


def test_deep_header_is_refused_in_linear_time(tmp_path: Path) -> None:
    timings = []
    for n in (1 << 20, 4 << 20):
        deep = _safetensors(tmp_path / f"deep{n}.safetensors", _deep(n))
        started = time.perf_counter()
        with pytest.raises(LimitError):
            torchless.load(deep)
        timings.append(time.perf_counter() - started)
    assert timings[1] < 12 * max(timings[0], 0.01), timings


def test_brackets_inside_strings_are_not_nesting(tmp_path: Path) -> None:
    """A valid file whose metadata and names hold brackets, quotes and backslashes reads
    (the safetensors package is the oracle for its validity)."""
    np = pytest.importorskip("numpy")
    st = pytest.importorskip("safetensors.numpy")
    path = tmp_path / "brackets.safetensors"
    tricky = '[' * 5000 + '\\"' + '{' * 5000
    st.save_file({'w[[{"': np.arange(3, dtype=np.float32)}, str(path),
                 metadata={"note": tricky, "[": "]"})
    assert st.load_file(str(path))['w[[{"'].tolist() == [0.0, 1.0, 2.0]
    got = torchless.load(path)
    assert got['w[[{"'].tolist() == [0.0, 1.0, 2.0]


def _hf_dir(torch: ModuleType, root: Path, index: bytes) -> Path:
    root.mkdir()
    torch.save({"a": torch.zeros(2)}, root / "pytorch_model-00001-of-00001.bin")
    (root / "pytorch_model.bin.index.json").write_bytes(index)
    return root


def test_deep_index_is_a_limit_error(torch: ModuleType, tmp_path: Path) -> None:
    deep = b'{"weight_map": {"a": "pytorch_model-00001-of-00001.bin"}, "x": ' + \
        b"[" * 100_000 + b"]" * 100_000 + b"}"
    root = _hf_dir(torch, tmp_path / "m", deep)
    with pytest.raises(LimitError) as info:
        torchless.convert(root, tmp_path / "out")
    assert info.value.path == str(root / "pytorch_model.bin.index.json")
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())
    good = _hf_dir(torch, tmp_path / "g", json.dumps(
        {"weight_map": {"a": "pytorch_model-00001-of-00001.bin"}}).encode())
    torchless.convert(good, tmp_path / "out")
    (tmp_path / "out" / "model.safetensors.index.json").write_bytes(
        deep.replace(b"pytorch_model-00001-of-00001.bin", b"model-00001-of-00001.safetensors"))
    with pytest.raises(LimitError):
        torchless.verify(good, tmp_path / "out")


# ---- storage keys that are bytes --------------------------------------------------------------

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def _rebuild_pickler(torch: ModuleType, pid: tuple[Any, ...], protocol: int) -> Any:
    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            return pid if isinstance(obj, torch.UntypedStorage) else None

        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, torch.Tensor):
                return (torch._utils._rebuild_tensor_v2, (
                    obj.untyped_storage(), 0, tuple(obj.shape), obj.stride(), False,
                    collections.OrderedDict()))
            return NotImplemented

    return Pickler


def _legacy_bytes_key(torch: ModuleType, path: Path, key: bytes) -> Any:
    """A legacy stream (torch.serialization._legacy_save's layout) whose one storage key is
    ``key``, pickled with protocol 3 so it stays bytes."""
    t = torch.arange(3, dtype=torch.float32)
    f = io.BytesIO()
    for value in (LEGACY_MAGIC, 1001, {"protocol_version": 1001, "little_endian": True,
                                       "type_sizes": {"short": 2, "int": 4, "long": 4}}):
        pickle.dump(value, f, protocol=3)
    pid = ("storage", torch.FloatStorage, key, "cpu", 3, None)
    _rebuild_pickler(torch, pid, 3)(f, protocol=3).dump({"w": t})
    pickle.dump([key], f, protocol=3)
    f.write(struct.pack("<q", 3) + t.numpy().tobytes())
    path.write_bytes(f.getvalue())
    return t


def test_legacy_bytes_storage_key(torch: ModuleType, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "legacy.pt"
    t = _legacy_bytes_key(torch, path, b"\xff\xfe")
    # torch (the full unpickler) matches the key byte for byte and reads the tensor
    assert torch.equal(torch.load(path, weights_only=False)["w"], t)
    with pytest.raises(StorageError, match="storage key is a bytes"):
        torchless.open(path)
    report = torchless.scan(path)
    (f,) = report.files
    assert f.status == "anomalous" and f.layout == "legacy", f
    assert [a.kind for a in f.anomalies] == ["legacy"]
    assert "b'\\xff\\xfe'" in f.anomalies[0].message and "bytes" in f.anomalies[0].message
    assert main(["scan", str(path)]) == 1
    out = capsys.readouterr()
    assert "ANOMALY" in out.out and "is bytes, not str" in out.out and not out.err


def test_zip_bytes_storage_key(torch: ModuleType, tmp_path: Path) -> None:
    """torch names the record f"data/{key}": for bytes, their repr. The reader refuses the
    key; the scanner reports the record name that makes torch read it."""
    t = torch.arange(2, dtype=torch.float32)
    pid = ("storage", torch.FloatStorage, b"\xff\xfe", "cpu", 2)
    buf = io.BytesIO()
    _rebuild_pickler(torch, pid, 2)(buf, protocol=2).dump({"w": t})
    path = tmp_path / "zip.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/data/" + repr(b"\xff\xfe"), t.numpy().tobytes())
        z.writestr("archive/version", "3\n")
    assert torch.equal(torch.load(path)["w"], t)
    with pytest.raises(UnsafePathError):
        torchless.open(path)
    (f,) = torchless.scan(path).files
    assert f.status == "anomalous" and any(a.kind == "name" for a in f.anomalies), f


# ---- a bug is an InternalError --------------------------------------------------------------


def _boom(*args: Any, **kwargs: Any) -> Any:
    return 1 // 0


def _assert_bug(e: BaseException, doing: str, path: Path | str | None = None) -> None:
    assert isinstance(e, InternalError) and isinstance(e, CheckpointError), repr(e)
    assert not isinstance(e, (FormatError, ValueError)), "a bug is not a bad file"
    assert f"internal error while {doing}" in e.message and "ZeroDivisionError" in e.message
    assert isinstance(e.__cause__, ZeroDivisionError) and e.cause == "ZeroDivisionError"
    assert e.hint == InternalError.hint and "bug in torchless" in e.hint
    assert "github.com/torchless/torchless/issues" in e.hint
    assert not any(word in e.hint for word in BLAME), e.hint
    if path is not None:
        assert e.path == str(path)


@pytest.fixture
def broken_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchless.containers import torchzip as _torchzip

    monkeypatch.setattr(_torchzip.TorchZip, "load", _boom)


@pytest.mark.usefixtures("broken_reader")
def test_open_and_load_report_a_bug() -> None:
    with pytest.raises(InternalError) as info:
        torchless.open(TINY)
    _assert_bug(info.value, "reading", TINY)
    with pytest.raises(InternalError) as info:
        torchless.load(TINY)
    _assert_bug(info.value, "reading", TINY)


def test_load_reports_a_bug_after_open(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchless.model import tensor as _tensor

    monkeypatch.setattr(_tensor.Tensor, "numpy", _boom)
    with pytest.raises(InternalError) as info:
        torchless.load(TINY)
    _assert_bug(info.value, "loading", TINY)


def test_usage_errors_and_os_errors_are_not_bugs(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="framework 'jax' is invalid") as info:
        torchless.load(TINY, framework="jax")
    assert not isinstance(info.value, CheckpointError)
    with pytest.raises(TypeError) as type_info:
        torchless.load(TINY, no_such_option=1)  # type: ignore[call-arg]
    assert not isinstance(type_info.value, CheckpointError)
    from torchless.containers import torchzip as _torchzip

    def io_error(*args: Any, **kwargs: Any) -> Any:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(_torchzip.TorchZip, "load", io_error)
    with pytest.raises(CheckpointError, match="cannot read: Input/output error") as err:
        torchless.open(TINY)
    assert not isinstance(err.value, InternalError)


@pytest.mark.usefixtures("broken_reader")
def test_convert_reports_a_bug_and_writes_nothing(tmp_path: Path) -> None:
    dst = tmp_path / "out.safetensors"
    with pytest.raises(InternalError) as info:
        torchless.convert(TINY, dst)
    _assert_bug(info.value, "reading", TINY)
    assert list(tmp_path.iterdir()) == []


def test_convert_bug_while_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchless.write import safetensors as _safetensors

    monkeypatch.setattr(_safetensors, "_write_tensor", _boom)
    dst = tmp_path / "out.safetensors"
    with pytest.raises(InternalError) as info:
        torchless.convert(TINY, dst)
    _assert_bug(info.value, "converting", TINY)
    assert list(tmp_path.iterdir()) == []


def test_verify_reports_a_bug(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchless.conversion import api as _convert

    dst = tmp_path / "out.safetensors"
    torchless.convert(TINY, dst)
    monkeypatch.setattr(_convert, "compare", _boom)
    with pytest.raises(InternalError) as info:
        torchless.verify(TINY, dst)
    _assert_bug(info.value, "verifying", TINY)


def test_scan_reports_a_bug_as_error_never_clean(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from torchless.scanner import files as _scan

    monkeypatch.setattr(_scan._File, "run", _boom)
    report = torchless.scan(TINY)
    (f,) = report.files
    assert f.status == "error" and report.exit_code == 2 and not report.ok
    assert f.error is not None and "internal error while scanning" in f.error
    assert "ZeroDivisionError" in f.error and f.hint == InternalError.hint
    assert json.loads(report.to_json())["summary"]["error"] == 1
    assert main(["scan", str(TINY)]) == 2
    out = capsys.readouterr().out
    assert out.splitlines()[1].startswith("BUG ") and "internal error while scanning" in out
    assert "1 internal errors (torchless bugs)" in out


def test_batch_reports_a_bug_as_failed_not_refused(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from torchless.containers import torchzip as _torchzip
    from torchless.scanner import files as _scan

    tiny = tmp_path / "tiny.pt"
    tiny.write_bytes(TINY.read_bytes())
    bad = tmp_path / "not-a-checkpoint.pt"
    bad.write_bytes(b"hello, world")
    monkeypatch.setattr(_torchzip.TorchZip, "load", _boom)
    for op in ("inspect", "convert"):
        results = torchless.batch([tiny, bad], op)  # type: ignore[arg-type]
        statuses = {Path(r.path).name: r for r in results}
        bug, refusal = statuses["tiny.pt"], statuses["not-a-checkpoint.pt"]
        assert bug.status == "failed" and refusal.status == "refused", (op, results)
        assert bug.error is not None and "internal error while reading" in bug.error
        assert bug.hint == InternalError.hint and refusal.hint != InternalError.hint
    assert not list(tmp_path.glob("*.safetensors"))
    monkeypatch.setattr(_scan._File, "run", _boom)
    (result,) = torchless.batch([tiny], "scan")
    assert result.status == "failed" and result.error is not None
    assert "internal error while scanning" in result.error and result.hint == InternalError.hint


def _cli_bug(argv: list[str], capsys: pytest.CaptureFixture[str], doing: str) -> None:
    assert main(argv) == 1
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[-2].startswith("torchless: error: ") and f"internal error while {doing}" in \
        lines[-2], err
    assert lines[-1] == f"torchless: hint: {InternalError.hint}"
    assert "Traceback (most recent call last)" in err and "ZeroDivisionError" in err


@pytest.mark.usefixtures("broken_reader")
def test_cli_reports_a_bug(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _cli_bug(["inspect", str(TINY)], capsys, "reading")
    _cli_bug(["convert", str(TINY), "-o", str(tmp_path / "o.safetensors")], capsys, "reading")
    copies = [tmp_path / "a.pt", tmp_path / "b.pt"]
    for copy in copies:
        copy.write_bytes(TINY.read_bytes())
    assert main(["convert", *map(str, copies)]) == 1  # several files: the batch path
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and all("internal error while reading" in line for line in err[::2])
    assert err[1::2] == [f"torchless: hint: {InternalError.hint}"] * 2
    assert not list(tmp_path.glob("*.safetensors"))


def test_cli_reports_its_own_bug(monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    from torchless.cli import show

    monkeypatch.setattr(show, "inspect_text", _boom)
    _cli_bug(["inspect", str(TINY)], capsys, "running inspect")
