"""Start-up stays small: what ``import torchless``, ``torchless inspect`` and a conversion
import, bounded by which modules are loaded (never by a timing, which belongs in
``benchmarks/convert.py``). Each check runs in a fresh interpreter and lists
``sys.modules`` at its end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ..conftest import REPO, require

TINY = REPO / "examples" / "tiny.pt"

#: Pulled in only by remote files (urllib.request, http, email, ssl, socket), process pools
#: (concurrent.futures, multiprocessing), ``secrets`` (hashlib, OpenSSL), torch, ``traceback``
#: (errors walk a traceback themselves), or the
#: parts of torchless a command does not use.
NEVER = ("torch", "urllib.request", "http", "http.client", "email", "ssl", "socket",
         "concurrent.futures", "multiprocessing", "secrets", "hashlib", "decimal", "asyncio",
         "torchless.scanner", "torchless.api.batch", "torchless.conversion.hf", "traceback")


#: Imported only where values are made (``Tensor.numpy``, ``load``, arrays in a file):
#: inspecting and copying bytes need neither.
VALUES = ("numpy", "ml_dtypes")


def _modules(code: str, tmp_path: Path) -> set[str]:
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"),
                                         *filter(None, [env.get("PYTHONPATH")])])
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=True).stdout
    return set(json.loads(out.splitlines()[-1]))


#: Runs the CLI with its output captured; fails unless it exits 0 having written something
#: (an internal error would report a bug, and import what reporting needs).
_CLI = """import contextlib, io, torchless
from torchless.cli.main import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        code = main({args!r})
    except SystemExit as e:
        code = e.code
assert code in (0, None) and out.getvalue(), (code, out.getvalue())"""


def test_import_and_version_load_no_library(tmp_path: Path) -> None:
    """``import torchless`` and ``--version`` load neither NumPy nor any reader."""
    loaded = _modules(_CLI.format(args=["--version"]), tmp_path)
    assert "torchless.cli.main" in loaded  # the check ran
    heavy = {"numpy", "ml_dtypes", "torchless.reader.checkpoint", "torchless.inert.encode",
             "torchless.conversion.api", *NEVER}
    assert not loaded & heavy, sorted(loaded & heavy)


def test_inspect_loads_only_the_reader(tmp_path: Path) -> None:
    """``torchless inspect`` of a local file: the reader, not the writers, the inert format's
    encoder, the scanner, batches or anything remote."""
    loaded = _modules(_CLI.format(args=["inspect", str(TINY)]), tmp_path)
    assert "torchless.reader.checkpoint" in loaded
    heavy = {"torchless.write.safetensors", "torchless.inert.encode", "torchless.inert.decode",
             "torchless.conversion.api", "tempfile", *VALUES, *NEVER}
    assert not loaded & heavy, sorted(loaded & heavy)


def test_convert_loads_no_remote_or_batch_code(tmp_path: Path) -> None:
    """Converting a local file: no remote, batch, scanner or model-directory code, and no
    ``secrets`` (temporary names come from ``os.urandom``)."""
    loaded = _modules(f"import torchless\ntorchless.convert({str(TINY)!r}, 'o.safetensors')",
                      tmp_path)
    assert (tmp_path / "o.safetensors").exists() and "torchless.conversion.api" in loaded
    assert not loaded & set(NEVER), sorted(loaded & set(NEVER))


def test_convert_of_plain_tensors_loads_no_numpy(tmp_path: Path) -> None:
    """Converting a file of plain tensors and values copies bytes: it needs neither NumPy
    nor ml_dtypes (bfloat16 included), and the output is torch's (checked by the conversion
    tests); a file holding a NumPy array does import NumPy."""
    torch = require("torch")
    import numpy as np

    torch.save({"w": torch.ones(3, 4), "b": torch.zeros(5, dtype=torch.bfloat16),
                "step": 7, "name": "x"}, tmp_path / "plain.pt")
    torch.save({"w": torch.ones(3), "a": np.arange(4)}, tmp_path / "array.pt")
    loaded = _modules("import torchless\ntorchless.convert('plain.pt', 'p.safetensors')",
                      tmp_path)
    assert (tmp_path / "p.safetensors").exists()
    assert not loaded & set(VALUES), sorted(loaded & set(VALUES))
    loaded = _modules("import torchless\ntorchless.convert('array.pt', 'a.safetensors')",
                      tmp_path)
    assert (tmp_path / "a.safetensors").exists() and "numpy" in loaded


#: What a scan of one local torch.save file or plain pickle never needs: the values' and the
#: writers' libraries, the index and inert readers, the directory layouts (DCP, ZeRO, rank
#: files, Megatron), ctypes (only a writer asks a map's address), time zones and paths (only
#: a file that names one), and the process pools of ``-j``.
SCAN_NEVER = (*VALUES, "ctypes", "zoneinfo", "pathlib", "torchless.reader.formats",
              "torchless.inert.schema", "torchless.write.safetensors",
              "torchless.containers.dcp", "torchless.containers.dcpmeta",
              "torchless.containers.zero", "torchless.containers.ranks",
              "torchless.containers.megatron", "torchless.containers.megatronlegacy",
              *[m for m in NEVER if m != "torchless.scanner"])


def test_scan_of_a_file_loads_no_numpy_nor_directory_layouts(tmp_path: Path) -> None:
    """``torchless scan FILE`` of a ZIP checkpoint and of a plain pickle (both written by
    torch, clean): the scanner and the ZIP and pickle readers, nothing of SCAN_NEVER."""
    torch = require("torch")
    torch.save({"w": torch.ones(3, 4), "step": 7}, tmp_path / "zip.pt")
    torch.save({"step": 7, "lr": 0.1}, tmp_path / "plain.pkl",
               _use_new_zipfile_serialization=False)
    import pickle

    (tmp_path / "plain.pickle").write_bytes(pickle.dumps({"step": 7, "names": ["a", "b"]}))
    for name in ("zip.pt", "plain.pkl", "plain.pickle"):
        loaded = _modules(_CLI.format(args=["scan", str(tmp_path / name)]), tmp_path)
        assert "torchless.scanner.files" in loaded, name  # the scan ran
        assert not loaded & set(SCAN_NEVER), (name, sorted(loaded & set(SCAN_NEVER)))
