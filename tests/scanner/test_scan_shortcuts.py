"""The scanner's shortcuts give the general path's answer, byte for byte, on every file.

Each shortcut saves work that a slower path also does; switched off here, the slower path is
the reference (what the scanner did before the shortcut existed):

* whether the reader has a rule for a name is kept for the process; the reference asks a
  new :class:`~torchless.rules.resolver.TorchResolver` each time;
* small files are read into memory; the reference maps every file;
* the ZIP end-record search is kept on the source; the reference searches each time;
* ``code/`` members are read once for the pickle sniff and the code scan; the reference
  reads them again;
* short plain-data pickles (a legacy stream's header) are answered from the streams of the
  same bytes already run (:mod:`torchless.scanner.plain`); the reference runs each.

The files: the repo's fixtures and corpus, the labelled scan set, the shared hostile corpus
and the generated hostile set (every trick the scanner knows of), each scanned with the
default options, ``strict``, ``allow_globals`` and ``verify_crc``; the full JSON report must
be equal.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.project.test_hostile import Hostile, hostile  # noqa: F401  (fixture)
from torchless.containers import zipregions
from torchless.io.source import Source
from torchless.scanner import files, pickles
from torchless.scanner.files import scan, scan_paths
from torchless.scanner.plain import PlainStreams

TESTS = Path(__file__).resolve().parents[1]
_OPTIONS: list[dict[str, Any]] = [
    {}, {"strict": True}, {"verify_crc": True},
    {"allow_globals": ["builtins.print", "collections.OrderedDict", "__main__.Foo",
                       "torch._utils._rebuild_tensor_v2", "os.system"]}]


class _Forgets(dict[int, bytes]):
    """A dict that keeps nothing."""

    def __setitem__(self, key: int, value: bytes) -> None:
        pass


@contextmanager
def _general(mp: pytest.MonkeyPatch) -> Iterator[None]:
    """Every shortcut switched off."""
    with mp.context() as m:
        m.setattr(files, "_KNOWN", {})
        m.setattr(files, "_KNOWN_MAX", 0)
        m.setattr(files, "_COPY_BELOW", 0)
        m.setattr(Source, "zip_ends", property(lambda self: None, lambda self, v: None))
        m.setattr(pickles, "PLAIN", PlainStreams())
        m.setattr(PlainStreams, "find", lambda *args: None)
        m.setattr(zipregions, "_remember", _Forgets)
        yield


@pytest.fixture(scope="module")
def roots(shared_dir: Path, hostile: Hostile,  # noqa: F811
          tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    dangerous = tmp_path_factory.mktemp("labelled")
    subprocess.run([sys.executable, str(TESTS / "scanner" / "labelled" / "make_dangerous.py"),
                    str(dangerous)], check=True, timeout=120, capture_output=True)
    return [TESTS / "data", shared_dir / "hostile" / "corpus", hostile.root, dangerous]


def _files(roots: list[Path]) -> list[str]:
    return [str(p) for root in roots for p in sorted(root.rglob("*")) if p.is_file()]


def test_shortcuts_change_no_report(roots: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    paths = _files(roots)
    assert len(paths) > 500
    fast = {(i, p): scan(p, **o).to_dict() for i, o in enumerate(_OPTIONS) for p in paths}
    fast_dirs = [scan_paths([r]).to_dict() for r in roots]
    with _general(monkeypatch):
        general = {(i, p): scan(p, **o).to_dict() for i, o in enumerate(_OPTIONS)
                   for p in paths}
        general_dirs = [scan_paths([r]).to_dict() for r in roots]
    differ = [key for key in general if fast[key] != general[key]]
    assert differ == []
    assert fast_dirs == general_dirs
    statuses = {f["status"] for r in general.values() for f in r["files"]}
    assert {"clean", "dangerous", "anomalous", "unreadable"} <= statuses  # the set has teeth
