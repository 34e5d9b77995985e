"""The labelled scan set: every bypass technique flagged dangerous, every real library file clean.

Labels come from outside the scanner: each dangerous file is confirmed by ``torch.load`` itself
(in a subprocess, it creates the file's marker or ends the process), and each benign file is
real output of the library its manifest names (``tests/data/labelled/PROVENANCE.md``). The
reader agrees with the scan: it refuses every dangerous file or keeps what it would call as
an inert record, never calling it (no marker appears).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import torchless
from torchless.errors import CheckpointError, UnsafeGlobalError
from torchless.scanner.files import FileScan, scan

HERE = Path(__file__).resolve().parent
BENIGN = HERE.parent / "data" / "labelled" / "benign"
BENIGN_CASES: list[dict[str, str]] = json.loads((BENIGN / "manifest.json").read_text())["cases"]

_CONFIRM = r'''
import json, os, sys, warnings
warnings.simplefilter("ignore")
import torch
root = sys.argv[1]
out = {}
for case in json.load(open(os.path.join(root, "manifest.json")))["cases"]:
    try:
        torch.load(os.path.join(root, case["file"]), weights_only=False)
        outcome = "loaded"
    except SystemExit:
        outcome = "exit"
    except BaseException as e:
        outcome = type(e).__name__
    out[case["id"]] = outcome
sys.stderr.flush()
print("RESULT" + json.dumps(out))
'''


def _generate(out: Path) -> tuple[Path, list[dict[str, Any]]]:
    subprocess.run([sys.executable, str(HERE / "labelled" / "make_dangerous.py"), str(out)],
                   check=True, timeout=120)
    cases: list[dict[str, Any]] = json.loads((out / "manifest.json").read_text())["cases"]
    return out, cases


@pytest.fixture(scope="module")
def dangerous(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    return _generate(tmp_path_factory.mktemp("labelled"))


def _markers(root: Path) -> set[str]:
    return set(os.listdir(root / "markers"))


def _made(marker: str) -> bool:
    """A marker, or a file named from it (NamedTemporaryFile adds random letters)."""
    path = Path(marker)
    return any(n.startswith(path.name) for n in os.listdir(path.parent))


def test_dangerous_set_is_dangerous(dangerous: tuple[Path, list[dict[str, Any]]]) -> None:
    root, cases = dangerous
    assert len(cases) >= 24
    for case in cases:
        f: FileScan = scan(root / case["file"]).files[0]
        assert f.status == "dangerous", (case["id"], f.status, f.actions)
        bad = [a for a in f.actions if a.severity == "dangerous"]
        assert bad and all(a.reason for a in bad), case["id"]
    assert _markers(root) == set()


@pytest.mark.parametrize("case", BENIGN_CASES, ids=[c["file"] for c in BENIGN_CASES])
def test_benign_set_is_clean(case: dict[str, str]) -> None:
    f = scan(BENIGN / case["file"]).files[0]
    assert f.status == "clean", (case["file"], [a for a in f.actions
                                                if a.severity != "vetted"], f.anomalies)
    assert f.actions and all(a.severity == "vetted" for a in f.actions)


@pytest.mark.parametrize("case", BENIGN_CASES, ids=[c["file"] for c in BENIGN_CASES])
def test_reader_reads_every_benign_file(case: dict[str, str]) -> None:
    """What the scan calls clean the reader reads (an ordinary object is never a refusal)."""
    assert torchless.load(BENIGN / case["file"]) is not None


def test_benign_set_covers_the_libraries() -> None:
    names = " ".join(c["file"] for c in BENIGN_CASES)
    for part in ("omegaconf", "lightning", "transformers_training_args", "numpy2_rng",
                 "zoneinfo_datetime_p2", "hydra_style_partial", "plain_function_ref",
                 "numpy_dtype_class_ref"):
        assert part in names


def test_reader_never_calls_and_agrees(dangerous: tuple[Path, list[dict[str, Any]]]) -> None:
    """torchless.load of each dangerous file: refused as unsafe (or unreadable), never a
    marker; a file the scan calls dangerous is never returned as plain data."""
    root, cases = dangerous
    refused = 0
    for case in cases:
        try:
            torchless.load(root / case["file"])
        except UnsafeGlobalError:
            refused += 1
        except CheckpointError:
            pass
    assert _markers(root) == set()
    assert refused == len(cases)


def test_torch_runs_every_dangerous_file(tmp_path: Path, torch: Any) -> None:
    """The labels: torch.load(weights_only=False) creates each marker (one subprocess, on a
    copy of the set of its own)."""
    root, cases = _generate(tmp_path)
    cp = subprocess.run([sys.executable, "-c", _CONFIRM, str(root)], capture_output=True,
                        text=True, timeout=600, cwd=root, check=False,
                        stdin=subprocess.DEVNULL)
    line = [x for x in cp.stdout.splitlines() if x.startswith("RESULT")]
    assert line, cp.stderr[-2000:]
    outcome = json.loads(line[-1][len("RESULT"):])
    for case in cases:
        if case["marker"] is None:
            assert outcome[case["id"]] == "exit", case["id"]
        else:
            assert _made(case["marker"]), (case["id"], outcome[case["id"]])


def test_reader_refuses_a_partial_whose_keywords_forward(tmp_path: Path) -> None:
    """partial(__generator_ctor) whose BUILD sets bit_generator_ctor to a class nobody vetted,
    then called: NumPy would call that class; the reader refuses, the scan says dangerous."""
    def g(module: str, name: str) -> bytes:
        return b"c" + module.encode() + b"\n" + name.encode() + b"\n"

    ctor = g("numpy.random._pickle", "__generator_ctor")
    body = (b"\x80\x02" + g("functools", "partial") + b"(" + ctor + b"tR(" + ctor + b")}"
            + b"X\x12\x00\x00\x00bit_generator_ctor" + g("mylib", "Maker")
            + b"sNtb(X\x01\x00\x00\x00xtR.")
    p = tmp_path / "pk.pkl"
    p.write_bytes(body)
    with pytest.raises(UnsafeGlobalError, match=r"mylib\.Maker"):
        torchless.load(p)
    assert scan(p).files[0].status == "dangerous"
