"""``_rebuild_from_type_v2(func, new_type, args, state)`` calls ``func(*args)``: ``*`` unpacks
any iterable, so ``args`` may be a list, a dict (its keys) or a tuple a call made
(``builtins.tuple([...])``), and torch (in a subprocess, a marker file as the oracle) still
calls ``func``. The scan judges that call whatever spells its arguments.
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


def _args(marker: str, shape: str) -> bytes:
    """Arguments ``("x", marker)`` for ``torch.serialization.save``, spelled as ``shape``."""
    if shape == "list":
        return b"(" + _uni("x") + _uni(marker) + b"l"
    if shape == "dict":
        return b"(" + _uni("x") + b"K\x00" + _uni(marker) + b"K\x00d"
    return _global("builtins", "tuple") + b"(" + _uni("x") + _uni(marker) + b"l\x85R"


@pytest.mark.parametrize("rule", ["_rebuild_from_type_v2", "_rebuild_from_type"])
@pytest.mark.parametrize("shape", ["list", "dict", "made"])
def test_func_torch_calls_with_unpacked_args_is_judged(tmp_path: Path, rule: str,
                                                       shape: str) -> None:
    pytest.importorskip("torch")
    marker = tmp_path / "ran"
    path = tmp_path / "a.pkl"
    path.write_bytes(b"\x80\x02" + _global("torch._tensor", rule) + b"(" +
                     _global("torch.serialization", "save") + _global("torch", "Tensor") +
                     _args(str(marker), shape) + b"}tR.")
    subprocess.run([sys.executable, "-c", "import sys, torch\ntry:\n torch.load(sys.argv[1], "
                    "weights_only=False)\nexcept Exception:\n pass", str(path)],
                   capture_output=True, timeout=300, check=False)
    assert marker.exists()  # torch called torch.serialization.save("x", marker)
    assert scan(str(path)).files[0].status == "dangerous"
