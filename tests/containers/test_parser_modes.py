"""One parser per container, two modes: what the reader refuses, the scanner reports.

The ZIP and TAR archive parsers run strict (``torchless.open``) and in report mode
(``torchless.scan``); the legacy and TAR layouts are walked by the same functions in both.
The properties, over the hostile cases and over real checkpoints mutated byte by byte:

* an archive parser refuses an input in strict mode exactly when report mode lists at least
  one anomaly for it (so an input with no anomaly opens);
* when reading a whole file is refused by a container finding (an error raised where report
  mode would record one: a ``Findings`` call, spied on here), the scan of the file is not
  clean: it lists an anomaly, or a dangerous global, or the file is unreadable.

Which inputs are refused comes from the strict reader itself, whose verdicts other suites
check against torch; here only the agreement of the two modes is at stake. The PAX test
checks the scanner against ``tarfile``, which names members as torch's TAR loader does.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import torchless
from tests._fuzz_inputs import tar_checkpoint
from tests.project.test_hostile import Hostile, hostile  # noqa: F401  (fixture)
from torchless import Limits
from torchless.containers.tararchive import TarArchive
from torchless.containers.ziparchive import ZipArchive
from torchless.core.findings import Findings
from torchless.errors import CheckpointError
from torchless.io import detect
from torchless.io.source import Source
from torchless.scanner.files import FileScan, scan

Parser = Callable[..., Any]


def _parsers(data: bytes) -> list[tuple[str, Parser]]:
    head = data[:512]
    out: list[tuple[str, Parser]] = []
    if head.startswith(b"PK") or b"PK\x05\x06" in data[-(22 + 0xFFFF):]:
        out.append(("zip", ZipArchive))
    if detect.is_tar(head, len(data)):
        out.append(("tar", TarArchive))
    return out


def _archive_modes_agree(path: Path, parser: Parser) -> None:
    with Source(path) as source:
        try:
            parser(source, Limits())
            refused: CheckpointError | None = None
        except CheckpointError as e:
            refused = e
        anomalies = parser(source, Limits(), mode="report").anomalies
    if refused is not None:
        assert anomalies, f"{path.name}: strict refused ({refused}), report found nothing"
    else:
        assert not anomalies, f"{path.name}: strict read it, report found {anomalies}"


@pytest.fixture
def container_refusals(monkeypatch: pytest.MonkeyPatch) -> list[CheckpointError]:
    """Every error a strict parser raises where report mode would record an anomaly."""
    raised: list[CheckpointError] = []
    original = Findings.__call__

    def spy(self: Findings, kind: str, error: CheckpointError, *args: Any, **kw: Any) -> None:
        if self.strict:
            raised.append(error)
        original(self, kind, error, *args, **kw)

    monkeypatch.setattr(Findings, "__call__", spy)
    return raised


def _read_all(path: Path) -> None:
    with torchless.open(path) as ckpt:
        for t in ckpt.tensors.values():
            t.numpy()


def _file_modes_agree(path: Path, raised: list[CheckpointError]) -> FileScan:
    raised.clear()
    refusal: CheckpointError | None = None
    try:
        _read_all(path)
    except CheckpointError as e:
        refusal = e if any(e is r for r in raised) else None
    (got,) = scan(path).files
    if refusal is not None:
        assert got.anomalies or got.status in ("dangerous", "unreadable"), \
            f"{path.name}: the reader's container check refused it ({refusal}); scan: {got}"
    return got


# ---- hostile cases --------------------------------------------------------------------------

def test_hostile_archives_modes_agree(hostile: Hostile) -> None:  # noqa: F811
    checked = 0
    for cid in hostile.cases:
        path = Path(hostile.path(cid))
        for _, parser in _parsers(path.read_bytes()):
            _archive_modes_agree(path, parser)
            checked += 1
    assert checked >= 100


def test_hostile_files_modes_agree(hostile: Hostile,  # noqa: F811
                                   container_refusals: list[CheckpointError]) -> None:
    refused = 0
    for cid, case in hostile.cases.items():
        if not case["file"].endswith((".pt", ".pth", ".bin", ".tar", ".ckpt")):
            continue
        path = Path(hostile.path(cid))
        container_refusals.clear()
        _file_modes_agree(path, container_refusals)
        refused += bool(container_refusals)
    assert refused >= 50  # the property is exercised, not vacuous


# ---- real checkpoints, mutated --------------------------------------------------------------

def _mutants(data: bytes, step: int) -> Iterator[tuple[str, bytes]]:
    """Each byte (every ``step``-th) flipped, and the file cut short at those offsets."""
    for i in range(0, len(data), step):
        yield f"flip{i}", data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
        yield f"cut{i}", data[:i]


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory, torch: Any) -> dict[str, bytes]:
    root = tmp_path_factory.mktemp("originals")
    state = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(2)}
    torch.save(state, root / "zip.pt")
    torch.save(state, root / "legacy.pt", _use_new_zipfile_serialization=False)
    return {"zip": (root / "zip.pt").read_bytes(), "legacy": (root / "legacy.pt").read_bytes(),
            "tar": tar_checkpoint()}


@pytest.mark.parametrize("layout", ["zip", "tar"])
def test_mutated_archives_modes_agree(originals: dict[str, bytes], tmp_path: Path,
                                      layout: str) -> None:
    data = originals[layout]
    parser = ZipArchive if layout == "zip" else TarArchive
    refused = 0
    for name, mutant in _mutants(data, 1 if layout == "zip" else 3):
        path = tmp_path / f"{name}.{layout}"
        path.write_bytes(mutant)
        _archive_modes_agree(path, parser)
        try:
            with Source(path) as source:
                parser(source, Limits())
        except CheckpointError:
            refused += 1
        path.unlink()
    assert refused > len(data) // 4


@pytest.mark.parametrize("layout", ["zip", "legacy", "tar"])
def test_mutated_files_modes_agree(originals: dict[str, bytes], tmp_path: Path, layout: str,
                                   container_refusals: list[CheckpointError]) -> None:
    data = originals[layout]
    refused = 0
    for name, mutant in _mutants(data, {"zip": 3, "legacy": 1, "tar": 7}[layout]):
        path = tmp_path / f"{name}.pt"
        path.write_bytes(mutant)
        _file_modes_agree(path, container_refusals)
        refused += bool(container_refusals)
        path.unlink()
    assert refused > 20


# ---- TAR names as tarfile reads them --------------------------------------------------------

def _tar(members: list[tuple[str, bytes, dict[str, str]]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, raw, pax in members:
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            info.pax_headers = pax
            tar.addfile(info, io.BytesIO(raw))
    return out.getvalue()


def test_scanner_names_tar_members_by_their_pax_path(tmp_path: Path) -> None:
    """A PAX ``path`` renames a member: the header called ``pickle`` is a decoy, and the
    member tarfile (torch's TAR loader) calls ``pickle`` is a payload that breaks after its
    call, so that read as a mere region it does not look like a whole pickle. The scanner
    must read it as the object pickle, as torch would run it; it read the decoy. The
    renaming is a parser differential (a reader that ignores PAX records reads the decoy):
    an anomaly for the scanner, a refusal for the reader."""
    with tarfile.open(fileobj=io.BytesIO(tar_checkpoint())) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    payload = b"cposix\nsystem\n(S'echo pwned'\ntR\xff\xff garbage"
    data = _tar([("sys_info", members["sys_info"], {}),
                 ("pickle", members["pickle"], {"path": "decoy"}),
                 ("notes", payload, {"path": "pickle"}),
                 ("tensors", members["tensors"], {}), ("storages", members["storages"], {})])
    path = tmp_path / "pax.tar"
    path.write_bytes(data)
    with tarfile.open(path) as tar:  # the oracle: which bytes torch's loader calls 'pickle'
        assert tar.extractfile("pickle").read() == payload  # type: ignore[union-attr]
    (got,) = scan(path).files
    assert got.status == "dangerous", got
    assert [(g.module, g.name, g.member) for g in got.dangerous] == [
        ("posix", "system", "pickle")]
    assert "pax" in {a.kind for a in got.anomalies}
    with pytest.raises(torchless.AmbiguousArchiveError):
        torchless.load(path)
