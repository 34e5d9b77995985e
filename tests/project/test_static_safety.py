"""The library source never imports torch, never unpickles, never evaluates or imports by name.

This is the test twin of the ruff banned-api rule: it parses every module of src/torchless
and fails on any import of a banned module or any use of a banned builtin.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "torchless"
BANNED_MODULES = {"torch", "pickle", "_pickle", "cPickle", "marshal", "importlib", "dill",
                  "cloudpickle", "joblib", "runpy", "shelve"}
BANNED_NAMES = {"eval", "exec", "__import__", "compile", "execfile"}
BANNED_ATTRS = {("pickle", "load"), ("pickle", "loads"), ("pickle", "Unpickler"),
                ("np", "load"), ("numpy", "load"), ("importlib", "import_module")}

FILES = sorted(SRC.rglob("*.py"))


def test_source_files_found() -> None:
    assert len(FILES) >= 10


#: The one exception: the torch.load drop-in (torchless.torch) returns torch objects, so it
#: imports torch (and torch's own load config) inside one function, ``_import_torch``, and
#: nowhere else.
TORCH_IMPORTER = (SRC / "torch.py", "_import_torch")
TORCH_MODULES = ("torch", "torch.utils.serialization.config")


def _allowed_torch_imports(path: Path, tree: ast.Module) -> set[int]:
    if path != TORCH_IMPORTER[0]:
        return set()
    return {id(n) for f in tree.body if isinstance(f, ast.FunctionDef)
            and f.name == TORCH_IMPORTER[1] for n in ast.walk(f)
            if isinstance(n, ast.Import) and len(n.names) == 1
            and n.names[0].name in TORCH_MODULES and n.names[0].asname is None}


def test_the_torch_exception_is_one_function() -> None:
    tree = ast.parse(TORCH_IMPORTER[0].read_text())
    assert len(_allowed_torch_imports(TORCH_IMPORTER[0], tree)) == len(TORCH_MODULES)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_no_banned_imports_or_calls(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    allowed = _allowed_torch_imports(path, tree)
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and id(node) in allowed:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in BANNED_MODULES:
                    problems.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            if node.module and node.module.split(".")[0] in BANNED_MODULES and node.level == 0:
                problems.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Name) and node.id in BANNED_NAMES:
            problems.append(f"line {node.lineno}: uses {node.id}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) in BANNED_ATTRS:
                problems.append(f"line {node.lineno}: uses {node.value.id}.{node.attr}")
            if node.attr in BANNED_NAMES - {"compile"}:
                problems.append(f"line {node.lineno}: uses .{node.attr}")
    assert not problems, "\n".join(problems)


def test_getattr_only_on_self() -> None:
    """Dynamic attribute lookups exist only for our own dispatch tables (getattr(self, ...))."""
    for path in FILES:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id == "getattr":
                target = node.args[0]
                assert isinstance(target, ast.Name) and target.id in ("self", "os"), \
                    f"{path.name}:{node.lineno}"


def test_importing_torchless_does_not_import_torch() -> None:
    code = ("import sys, torchless, torchless.torch, torchless.api.safeopen; "
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]; "
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == ""


def test_ruff_bans_the_same_apis() -> None:
    text = (SRC.parent.parent / "pyproject.toml").read_text()
    for name in ("torch", "pickle", "importlib", "marshal", "builtins.eval", "builtins.exec"):
        assert f'"{name}".msg' in text
