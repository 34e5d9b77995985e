"""A memo numbering trick: torch.load runs ``os.system``; the scan must say so.

``MEMOIZE`` stores into slot ``memo_len``, which CPython's C unpickler counts as the number of
*filled* slots (``_Unpickler_MemoPut`` increments it only when the slot was empty). A ``PUT``
that overwrites a filled slot therefore does not move the next ``MEMOIZE``. The static walk the
scanner once had counted that overwrite as a new slot, numbered every later ``MEMOIZE`` one
higher, and so read the ``STACK_GLOBAL`` below as ``collections.OrderedDict`` (vetted: the
file scanned clean). The scanner now runs the interpreter, whose memo is the reader's.

The pickle is spelled out by hand, the slots C fills in the comments; ``pickletools.genops``
checks the opcodes, the C unpickler the slots.
"""

from __future__ import annotations

import io
import pickle
import pickletools
import subprocess
import sys
from pathlib import Path

import pytest

import torchless
from torchless.errors import CheckpointError
from torchless.scanner.files import scan


def _su(text: str) -> bytes:
    """SHORT_BINUNICODE of ``text``."""
    return b"\x8c" + bytes([len(text)]) + text.encode()


def payload(command: str) -> bytes:
    return (
        b"\x80\x04"                      # PROTO 4
        b"N\x94"                         # None; MEMOIZE -> slot 0 (memo_len 1)
        + _su("x") + b"q\x000"           # 'x'; BINPUT 0 overwrites slot 0 (memo_len stays 1); POP
        + _su("collections") + b"\x940"  # MEMOIZE -> slot 1; POP
        + _su("os") + b"\x940"           # MEMOIZE -> slot 2; POP
        + _su("OrderedDict") + b"\x940"  # MEMOIZE -> slot 3; POP
        + _su("system") + b"\x940"       # MEMOIZE -> slot 4; POP
        + b"h\x02h\x04\x93"              # BINGET 2, BINGET 4 ('os', 'system'); STACK_GLOBAL
        + _su(command) + b"\x85R"        # (command,); REDUCE: os.system(command)
        + b".")                          # STOP
    # (numbered one higher after the overwrite, slots 2 and 4 are 'collections' and
    # 'OrderedDict')


_TORCH_LOAD = r'''
import sys, warnings
warnings.simplefilter("ignore")
import torch
try:
    torch.load(sys.argv[1], weights_only=False)
except Exception:
    pass  # the pickle ran; torch then finds no legacy magic number
'''


def test_the_c_unpickler_resolves_os_system() -> None:
    """The oracle for the comments above: C's find_class is asked for os.system."""
    data = payload("true")
    asked: list[tuple[str, str]] = []

    class Recording(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> object:
            asked.append((module, name))
            return lambda *args: 0

    assert Recording(io.BytesIO(data)).load() == 0
    assert asked == [("os", "system")]
    pushes = ["SHORT_BINUNICODE", "MEMOIZE", "POP"]
    assert [op.name for op, _, _ in pickletools.genops(data)] == [
        "PROTO", "NONE", "MEMOIZE", "SHORT_BINUNICODE", "BINPUT", "POP", *pushes * 4,
        "BINGET", "BINGET", "STACK_GLOBAL", "SHORT_BINUNICODE", "TUPLE1", "REDUCE", "STOP"]


@pytest.mark.usefixtures("torch")
def test_torch_load_runs_it_and_the_scan_says_dangerous(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    path = tmp_path / "memo.pkl"
    path.write_bytes(payload(f"touch {marker}"))
    subprocess.run([sys.executable, "-c", _TORCH_LOAD, str(path)], check=True, timeout=120,
                   capture_output=True)
    assert marker.exists()  # torch.load ran os.system
    marker.unlink()

    f = scan(path).files[0]
    assert f.status == "dangerous"
    assert any(a.target == "os.system" and a.kind == "call" and a.severity == "dangerous"
               for a in f.actions)
    assert [(g.module, g.name) for g in f.globals] == [("os", "system")]
    with pytest.raises(CheckpointError):
        torchless.load(path)
    assert not marker.exists()
