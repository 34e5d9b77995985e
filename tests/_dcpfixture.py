"""The DCP checkpoints of :mod:`tests._dcpgen`, written once per test session (a
subprocess: two gloo processes, a few seconds) and shared by the DCP tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="session")
def dcp_cases(torch: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.getbasetemp() / "dcp-cases"
    if (out / "done").is_file():
        return out
    out.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "tests._dcpgen", str(out)], env=env,
                         capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return out


def flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """Leaves of nested dicts and lists by dotted path (as torch's DCP names them)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(flat(v, f"{prefix}{k}."))
        return out
    if isinstance(value, list):
        out = {}
        for i, v in enumerate(value):
            out.update(flat(v, f"{prefix}{i}."))
        return out
    return {prefix[:-1]: value}
