"""A ``functools.partial``'s BUILD state, as ``partial.__setstate__`` reads it.

``partial.__setstate__`` takes any tuple of four (``PyTuple_Check``), so a state a call made
(``builtins.tuple([func, args, kw, dict])``) swaps the partial's function as a plain tuple
does; torch (in a subprocess, a marker file as the oracle) runs the function the state
names when the partial is called. The model cannot read such a state: the partial's
function is unknown, and the file is dangerous.
"""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from torchless.scanner.files import scan


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _uni(s: str) -> bytes:
    return b"X" + struct.pack("<I", len(s)) + s.encode()


def _partial_swapped(marker: str, *, made_state: bool) -> bytes:
    """``partial(int)``, BUILD ``(torch.serialization.save, ({}, marker), {}, {})`` (as a
    tuple the file spells, or one ``builtins.tuple`` makes of a list), then a call of it."""
    fields = _global("torch.serialization", "save") + b"(}" + _uni(marker) + b"t}}"
    state = (_global("builtins", "tuple") + b"(" + fields + b"l\x85R" if made_state
             else b"(" + fields + b"t")
    return (b"\x80\x02" + _global("functools", "partial") + _global("builtins", "int") +
            b"\x85R" + state + b"b)R.")


@pytest.mark.parametrize("made_state", [False, True], ids=["spelled", "made"])
def test_a_swapped_partial_torch_runs_is_dangerous(tmp_path: Path, made_state: bool) -> None:
    pytest.importorskip("torch")
    marker = tmp_path / "ran"
    path = tmp_path / "a.pkl"
    path.write_bytes(_partial_swapped(str(marker), made_state=made_state))
    subprocess.run([sys.executable, "-c", "import sys, torch\ntry:\n torch.load(sys.argv[1], "
                    "weights_only=False)\nexcept Exception:\n pass", str(path)],
                   capture_output=True, timeout=300, check=False)
    assert marker.exists()  # torch called torch.serialization.save
    assert scan(str(path)).files[0].status == "dangerous"


def test_a_state_partial_refuses_runs_nothing(tmp_path: Path) -> None:
    """A list state: ``partial.__setstate__`` raises TypeError, the function stays ``int``."""
    path = tmp_path / "a.pkl"
    path.write_bytes(b"\x80\x02" + _global("functools", "partial") + _global("builtins", "int")
                     + b"\x85R(" + _global("builtins", "int") + b")}Nlb)R.")
    assert scan(str(path)).files[0].status == "clean"
