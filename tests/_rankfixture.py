"""The per-rank checkpoints of :mod:`tests._rankgen` (Megatron ``torch_dist``, verl's FSDP2
DTensor rank files, FSDP1 ShardedTensor rank files), written once per test session (a
subprocess: two gloo processes) and shared by their tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="session")
def rank_cases(torch: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.getbasetemp() / "rank-cases"
    if (out / "done").is_file():
        return out
    out.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "tests._rankgen", str(out)], env=env,
                         capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return out
