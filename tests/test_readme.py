"""Every Python example in the README and in docs/*.md runs, from the repository root."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)
DOC_BLOCKS = [(p.name, block) for p in sorted((ROOT / "docs").glob("*.md"))
              for block in re.findall(r"```python\n(.*?)```", p.read_text(), re.S)]


def test_readme_has_examples() -> None:
    assert BLOCKS


def test_readme_python_examples_run() -> None:
    for block in BLOCKS:
        out = subprocess.run([sys.executable, "-c", block], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr


def test_docs_python_examples_run() -> None:
    assert DOC_BLOCKS
    for name, block in DOC_BLOCKS:
        out = subprocess.run([sys.executable, "-c", block], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, f"{name}: {out.stderr}"


def test_readme_keeps_two_setup_commands() -> None:
    lines = README.splitlines()
    commands = [lines[i + 1] for i, line in enumerate(lines) if re.match(r"# [12]\. ", line)]
    assert len(commands) == 2
    assert "torchless inspect examples/tiny.pt" in commands[0]
    assert "pytest" in commands[1] and "torch==2.13.0" in commands[1]
    assert (ROOT / "examples" / "tiny.pt").is_file()
