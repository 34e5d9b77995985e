"""benchmarks/bench_open.py runs end to end at a tiny size (as tests/project/test_benchmarks.py
does for the other scripts): the readers it promises, numbers where the figures go. Never a
figure: at this size they mean nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"),
                                         *filter(None, [env.get("PYTHONPATH")])])
    cp = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_open.py"), *args],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                        check=False)
    assert cp.returncode == 0, cp.stderr
    assert "Traceback" not in cp.stderr, cp.stderr
    return cp.stdout


def test_bench_open_with_torch(torch: ModuleType) -> None:
    results = json.loads(_run("--quick", "--json"))
    rows = results["rows"]
    assert [r["reader"] for r in rows] == ["c-pickle", "py-pickle", "torch-wo", "torchless"]
    for r in rows:
        assert r["count"] == r["tensors"] == 300 and r["floats"] == 4
        assert r["seconds"] > 0 and r["us_per_tensor"] > 0 and r["cpu"] >= 0
        assert (r["traced_per_tensor"] is None) == (r["reader"] == "torch-wo")
    big = results["big"]
    assert [(r["cache"], r["reader"]) for r in big] == [
        ("warm", "torchless"), ("warm", "torch-mmap"), ("cold", "torchless"),
        ("cold", "torch-mmap")]
    assert all(r["seconds"] > 0 and r["read"] >= 0 for r in big)


def test_bench_open_without_torch() -> None:
    out = _run("--quick", "--no-torch")
    lines = [line for line in out.splitlines() if line.startswith("| 300 | 4 |")]
    assert [line.split("|")[3].strip() for line in lines] == ["c-pickle", "py-pickle",
                                                              "torchless"]
    for line in lines:
        assert line.rstrip().endswith("x) |")
    assert [line.split("|")[2].strip() for line in out.splitlines()
            if line.startswith("| 4 MiB")] == ["warm", "cold"]
