"""A file larger than the address space the process may reserve: a clear error that names
the limit, no traceback and no output file (``ulimit -v`` is how many people cap memory)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

from ..conftest import REPO

LIMIT = 3 << 30  # RLIMIT_AS of the child: its interpreter fits, a map of the file does not


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def test_map_larger_than_address_space_limit(tmp_path: Path) -> None:
    big = tmp_path / "big.pt"
    with open(big, "wb") as f:  # sparse: no disk space used
        f.truncate(2 * LIMIT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"),
                                         *filter(None, [env.get("PYTHONPATH")])])
    for args in (["inspect", str(big)], ["convert", str(big), "-o", str(tmp_path / "o.st")]):
        r = subprocess.run([sys.executable, "-m", "torchless", *args], env=env,
                           capture_output=True, text=True, preexec_fn=_limited, timeout=120)
        assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
        assert "Traceback" not in r.stderr, r.stderr[-2000:]
        assert "address space" in r.stderr and "ulimit -v" in r.stderr, r.stderr
        assert f"{2 * LIMIT:,} bytes" in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.pt"]
