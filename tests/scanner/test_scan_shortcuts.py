"""The scanner's shortcuts give the general path's answer, byte for byte, on every file.

Each shortcut saves work that a slower path also does; switched off here, the slower path is
the reference (what the scanner did before the shortcut existed):

* the static walk first follows neither strings nor the memo (only a STACK_GLOBAL needs
  them) and steps over runs of fixed-width opcodes with one regular expression; the
  reference follows both from the first byte (:func:`torchless.scanner.walk._walk` with
  ``follow=True``);
* whether the reader has a rule for a name is kept for the process; the reference asks a
  new :class:`~torchless.rules.resolver.TorchResolver` each time;
* small files are read into memory; the reference maps every file;
* the ZIP end-record search is kept on the source; the reference searches each time;
* ``code/`` members are read once for the pickle sniff and the code scan; the reference
  reads them again;
* bytes that need not be a pickle and read as a GLOBAL or INST of something that is no
  dotted name are dropped without the inert run; the reference runs them;
* the TorchScript call pattern tests the character before the word after matching it, and
  the bare RPC names are looked for only in code that spells ``remote`` or ``rpc_``; the
  reference is the pattern with a leading look-behind, run on all code; string literals and
  calls are tried only where ``str.find`` finds a quote or the word (the reference: the
  patterns' own search);
* short plain-data pickles (a legacy stream's header) are answered from the streams of the
  same bytes already run (:mod:`torchless.scanner.plain`); the reference runs each.

The files: the repo's fixtures and corpus, the labelled scan set, the shared hostile corpus
and the generated hostile set (every trick the scanner knows of), each scanned with the
default options, ``strict``, ``allow_globals`` and ``verify_crc``; the full JSON report must
be equal. A second test compares the two walks on every pickle stream the scanner walks.
"""

from __future__ import annotations

import re
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
from torchless.scanner import files, pickles, script, walk
from torchless.scanner.files import scan, scan_paths
from torchless.scanner.plain import PlainStreams

TESTS = Path(__file__).resolve().parents[1]
#: The TorchScript call pattern as first written (a leading look-behind).
_CALL_REFERENCE = re.compile(r"(?<![\w.])((?:torch|ops)(?:\s*\.\s*\w+)+)\s*\(")
#: Pieces of text around string literals: quotes, escapes, line ends, calls inside them.
QUOTES = ["'", '"', "\\", "\n", "x", " ", "torch.f(", "ops", "'''", "é", "\\'"]
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
        m.setattr(pickles, "static_walk", _follow_walk)
        m.setattr(pickles, "_not_a_pickle", lambda static: False)
        m.setattr(files, "_KNOWN", {})
        m.setattr(files, "_KNOWN_MAX", 0)
        m.setattr(files, "_COPY_BELOW", 0)
        m.setattr(Source, "zip_ends", property(lambda self: None, lambda self, v: None))
        m.setattr(script, "_CALL", _CALL_REFERENCE)
        m.setattr(script, "_BARE_WORDS", ("",))
        m.setattr(script, "QUOTES_BY_FIND", False)
        m.setattr(pickles, "PLAIN", PlainStreams())
        m.setattr(PlainStreams, "find", lambda *args: None)
        m.setattr(zipregions, "_remember", _Forgets)
        yield


def _follow_walk(data: Any, start: int, end: int, scan: walk.StreamScan,
                 max_bytes: int) -> dict[int, walk.FoundGlobal]:
    found = walk._walk(data, start, end, scan, max_bytes, follow=True)
    assert found is not None
    return found


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


def test_walk_without_following_finds_what_following_finds(
        roots: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stream the scanner walks: walked without following strings and the memo (where
    no STACK_GLOBAL stops it), the same globals, end, problems and limit as following them."""
    streams: list[tuple[bytes, int, int, int]] = []
    real = pickles.static_walk

    def record(data: Any, start: int, end: int, scan: walk.StreamScan,
               max_bytes: int) -> dict[int, walk.FoundGlobal]:
        streams.append((bytes(data[:end]), start, end, max_bytes))
        return real(data, start, end, scan, max_bytes)

    monkeypatch.setattr(pickles, "static_walk", record)
    for p in _files(roots):
        scan(p)
    monkeypatch.undo()
    streams += [(data, start, end, 40) for data, start, end, _ in streams[:200]]  # limits
    skipped = 0
    for data, start, end, max_bytes in streams:
        quick = walk.StreamScan(start, end, False)
        found = walk._walk(data, start, end, quick, max_bytes, follow=False)
        full = walk.StreamScan(start, end, False)
        expected = walk._walk(data, start, end, full, max_bytes, follow=True)
        if found is None:  # a STACK_GLOBAL: static_walk walks again, following
            skipped += 1
            continue
        assert (found, quick.end, quick.stopped, quick.problems, quick.limited) == \
            (expected, full.end, full.stopped, full.problems, full.limited)
    assert len(streams) > 500 and 0 < skipped < len(streams) / 2


def test_script_calls_pattern_matches_the_reference(roots: list[Path],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The call pattern finds what the look-behind pattern finds, in every file's text and in
    strings made of the pieces that matter (dots, spaces, word characters around the words)."""
    texts = [p.read_bytes().decode("utf-8", "replace") for p in map(Path, _files(roots))
             if "code" in str(p) or p.suffix == ".py"]
    pieces = ["torch", "ops", ".", " ", "(", "x", "_", "\n", "é", "torch.ops", "ops.", "1"]
    texts += ["".join(pieces[(i * 7 + j * 5) % len(pieces)] for j in range(i % 11))
              for i in range(5000)]

    texts += ["".join(QUOTES[(i * 3 + j * 7) % len(QUOTES)] for j in range(i % 13))
              for i in range(5000)]

    def spans(pattern: re.Pattern[str], text: str) -> list[tuple[int, str]]:
        return [(m.start(), m.group(1)) for m in pattern.finditer(text)]

    def found(text: str) -> list[tuple[int, str]]:
        return [(m.start(), m.group(1)) for m in
                script._matches(text, ("torch", "ops"), script._CALL.match)]

    assert any(spans(_CALL_REFERENCE, t) for t in texts)
    assert [spans(script._CALL, t) for t in texts] == [spans(_CALL_REFERENCE, t) for t in texts]
    assert [found(t) for t in texts] == [spans(_CALL_REFERENCE, t) for t in texts]
    # string literals: found where a quote is, blanked as the pattern's own substitution does
    strings = [[m.span() for m in script._STRING.finditer(t)] for t in texts]
    assert any(strings)
    assert [[m.span() for m in script._matches(t, ("'", '"'), script._STRING.match)]
            for t in texts] == strings
    blanked = [script._blank_strings(t) for t in texts]
    monkeypatch.setattr(script, "QUOTES_BY_FIND", False)
    assert blanked == [script._blank_strings(t) for t in texts]
