"""Imports point one way (docs/architecture.md): each subpackage of torchless imports only from
the layers below it, and no module imports itself back through others.

The layers, bottom up: ``errors`` and ``core``; ``io``; ``pickle``; ``model``; ``rules``;
``containers``; ``write``; ``inert``; ``reader``; ``conversion`` and ``scanner``; ``api``;
``cli``. ``torchless/__init__.py`` (the public API) and ``__main__`` may import any of them.
"""

from __future__ import annotations

import ast
import shutil
from collections.abc import Iterator
from pathlib import Path

from ..conftest import REPO

SRC = REPO / "src" / "torchless"

LAYERS: dict[str, int] = {
    "errors": 0, "_version": 0, "core": 0, "io": 1, "pickle": 2, "model": 3, "rules": 4,
    "containers": 5, "write": 6, "inert": 7, "reader": 8, "conversion": 9, "scanner": 9,
    "api": 10, "torch": 10, "cli": 11, "integrations": 12,
}


def _imports(path: Path, root: Path) -> Iterator[tuple[int, str, bool]]:
    """(line, imported torchless module, at module level) for each import in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(("torchless", *path.relative_to(root).parent.parts))
    top_level = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if module == "torchless":
                for alias in node.names:
                    yield node.lineno, f"torchless.{alias.name}", id(node) in top_level
            elif module.startswith("torchless."):
                for alias in node.names:
                    yield node.lineno, f"{module}.{alias.name}", id(node) in top_level
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("torchless."):
                    yield node.lineno, alias.name, id(node) in top_level


#: ``torchless/torch.py``'s ``_import_torch``, the library's one ``import torch``: any layer
#: may call it inside a function (``framework='pt'``, ``to_torch()`` import torch on
#: request). Its module imports only core, errors and model at load.
TORCH_IMPORTER = "torchless.torch._import_torch"


def _layer(dotted: str) -> str:
    return dotted.split(".")[1].removesuffix(".py")


def upward_imports(root: Path) -> list[str]:
    """Every import from a higher layer than the importing module's, as 'file:line: a -> b'."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        own = path.relative_to(root).parts[0].removesuffix(".py")
        if own in ("__init__", "__main__"):
            continue
        assert own in LAYERS, f"{path}: a package no layer names (add it to LAYERS)"
        for line, target, top_level in _imports(path, root):
            other = _layer(target)
            if other not in LAYERS:
                continue  # a name of the package itself (``from torchless import __version__``)
            if target == TORCH_IMPORTER and not top_level:
                continue  # the one torch import, called where torch objects are asked for
            if LAYERS[other] > LAYERS[own]:
                bad.append(f"{path.relative_to(root)}:{line}: {own} -> {other}")
    return bad


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(("torchless", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def import_cycles(root: Path) -> list[list[str]]:
    """Cycles among module-level imports (an import inside a function is resolved when it
    runs, and stays within one layer by the rule above)."""
    modules = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for _, target, top in _imports(path, root):
            if not top:
                continue
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]  # a name imported from a module
            if target in modules and target != name and target != "torchless":
                deps.add(target)
        graph[name] = deps
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append([*trail[trail.index(dep):], dep])
            elif dep not in state:
                visit(dep, [*trail, dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_every_import_points_down() -> None:
    assert upward_imports(SRC) == []


def test_no_import_cycles() -> None:
    assert import_cycles(SRC) == []


def test_a_planted_upward_import_is_caught(tmp_path: Path) -> None:
    copy = tmp_path / "torchless"
    shutil.copytree(SRC, copy)
    target = copy / "core" / "limits.py"
    target.write_text(target.read_text() + "\n\ndef _late() -> None:\n"
                      "    from torchless.cli.main import main  # noqa: F401\n")
    assert upward_imports(copy) == [f"core/limits.py:{_last_line(target)}: core -> cli"]


def test_a_planted_cycle_is_caught(tmp_path: Path) -> None:
    copy = tmp_path / "torchless"
    shutil.copytree(SRC, copy)
    tensor = copy / "model" / "tensor.py"
    tensor.write_text("from torchless.model.walk import children  # noqa: F401\n"
                      + tensor.read_text())
    cycles = import_cycles(copy)
    assert ["torchless.model.tensor", "torchless.model.walk", "torchless.model.tensor"] in cycles


def _last_line(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_tests_mirror_the_packages() -> None:
    """Each package of src/torchless has its tests in the directory of the same name under
    tests/ (tests/project holds the ones about the project as a whole)."""
    root = Path(__file__).resolve().parents[2]
    packages = {p.name for p in (root / "src" / "torchless").iterdir()
                if p.is_dir() and (p / "__init__.py").exists()}
    tests = {p.name for p in (root / "tests").iterdir()
             if p.is_dir() and (p / "__init__.py").exists()}
    assert packages - tests == set(), "packages without a tests/ directory of their name"
    assert tests - packages - {"project"} == set(), "test directories no package matches"
