"""What the atheris harnesses share: the repository on ``sys.path`` and the outcome check."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(__file__).resolve().parent / "corpus"


def add_repo_to_path() -> None:
    """Make ``tests._fuzz_inputs`` importable (the seed builders and the outcome check)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
