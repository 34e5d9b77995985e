"""A Source left open is closed by its finalizer, even at interpreter exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchless.io import source as _source
from torchless.io.source import Source

DATA = Path(__file__).resolve().parents[1] / "data"


def _a_checkpoint() -> Path:
    return next(p for p in sorted(DATA.rglob("*.pt")) if p.stat().st_size > 1024)


def test_finalizer_closes_the_descriptor_without_the_module_globals(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """At interpreter exit a module's globals may already be None when ``__del__`` runs."""
    s = Source(str(_a_checkpoint()))
    fd = s._fd
    if fd < 0:
        pytest.skip("this Source holds no descriptor")
    monkeypatch.setattr(_source, "os", None)
    s.__del__()  # raised AttributeError: 'NoneType' object has no attribute 'close'
    monkeypatch.undo()
    with pytest.raises(OSError):
        os.fstat(fd)


def test_no_message_at_exit_for_a_source_left_open() -> None:
    code = ("import torchless\n"
            "from torchless.io.source import Source\n"
            f"s = Source({str(_a_checkpoint())!r})\n"
            "class Keep: pass\n"
            "k = Keep(); k.s = s; k.k = k\n"
            "c = torchless.open(s.path)\n"
            "t = c.tensors\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert "Exception ignored" not in out.stderr, out.stderr
    assert out.stderr == ""
