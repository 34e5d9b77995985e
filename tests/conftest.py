"""Shared fixtures. Torch is a test dependency only: differential tests use it as the oracle.

With TORCHLESS_REQUIRE_TORCH=1 (set by CI) a missing torch fails the run instead of skipping.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
SHARED = REPO.parent / "shared"

# DeepSpeed (in the test extra, for the ZeRO writers) is imported by transformers and
# accelerate when installed, and its accelerator probe then prints a warning on stdout: the
# machine has a CPU only, so say so (the tests and the examples they run stay quiet)
os.environ.setdefault("DS_ACCELERATOR", "cpu")


def require(module: str) -> ModuleType:
    """A test-only dependency (torch, jax, mlx …): skipped when missing, a failure when
    TORCHLESS_REQUIRE_TORCH is set (CI installs every one of them)."""
    import importlib  # the test suite's own imports; the library never imports by name

    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("TORCHLESS_REQUIRE_TORCH"):
            pytest.fail(f"{module} is required (TORCHLESS_REQUIRE_TORCH is set) but not "
                        "installed")
        pytest.skip(f"{module} is not installed")


@pytest.fixture(scope="session")
def torch() -> ModuleType:
    return require("torch")


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        if os.environ.get("TORCHLESS_REQUIRE_TORCH"):
            pytest.fail(f"{SHARED} is missing")
        pytest.skip("../shared is not beside the checkout")
    return SHARED
