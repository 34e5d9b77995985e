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


def _torch() -> ModuleType | None:
    try:
        import torch
    except ImportError:
        return None
    return torch


@pytest.fixture(scope="session")
def torch() -> ModuleType:
    mod = _torch()
    if mod is None:
        if os.environ.get("TORCHLESS_REQUIRE_TORCH"):
            pytest.fail("torch is required (TORCHLESS_REQUIRE_TORCH is set) but not installed")
        pytest.skip("torch is not installed")
    return mod


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        if os.environ.get("TORCHLESS_REQUIRE_TORCH"):
            pytest.fail(f"{SHARED} is missing")
        pytest.skip("../shared is not beside the checkout")
    return SHARED
