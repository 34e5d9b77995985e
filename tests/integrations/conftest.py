"""What the integration tests share: transformers 5.x, installed once into a cache (the
test extra pins 4.x, and one environment cannot hold both), for the tests that run it in a
subprocess (test_transformers, test_hf_trainer)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TRANSFORMERS_5 = "5.24.0"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(scope="session")
def transformers_5() -> Path:
    """transformers 5.x installed with pip --target into a cache kept across runs (the test
    extra holds the 4.x pin; one environment cannot hold both)."""
    given = os.environ.get("TORCHLESS_TRANSFORMERS5")
    cache = Path(given) if given else Path(os.environ.get(
        "XDG_CACHE_HOME", Path.home() / ".cache")) / "torchless-tests" / (
        f"transformers-{TRANSFORMERS_5}")
    if (cache / "transformers").is_dir():
        return cache
    if cache.exists():  # an interrupted install
        shutil.rmtree(cache)
    partial = cache.with_name(cache.name + f".{os.getpid()}.partial")
    run = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target",
                          str(partial), f"transformers=={TRANSFORMERS_5}"],
                         capture_output=True, text=True)
    if run.returncode != 0:
        message = f"cannot install transformers {TRANSFORMERS_5}: {run.stderr[-2000:]}"
        if os.environ.get("TORCHLESS_REQUIRE_TORCH"):
            pytest.fail(message)
        pytest.skip(message)
    os.replace(partial, cache)
    return cache
