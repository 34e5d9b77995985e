"""The package metadata: one version, the extras the docs name, links that agree, typed."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

import torchless

ROOT = Path(__file__).resolve().parents[2]
tomllib = pytest.importorskip("tomllib")
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_version_is_defined_once() -> None:
    assert "version" in PROJECT["dynamic"] and "version" not in PROJECT
    assert re.fullmatch(r"\d+\.\d+\.\d+(?:\.dev\d+|rc\d+)?", torchless.__version__)
    assert importlib.metadata.version("torchless") == torchless.__version__
    changelog = (ROOT / "CHANGELOG.md").read_text()
    newest = re.search(r"^## (\S+)", changelog, re.M)
    assert newest is not None and newest.group(1) == torchless.__version__
    out = subprocess.run([sys.executable, "-m", "torchless", "--version"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and torchless.__version__ in out.stdout


def test_extras_the_docs_name_exist() -> None:
    extras = set(PROJECT["optional-dependencies"])
    assert {"remote", "torch", "dask", "test", "docs", "lint", "lightning", "transformers",
            "accelerate"} <= extras
    named = set()
    for doc in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
        named |= set(re.findall(r"torchless\[([\w-]+)\]", doc.read_text()))
    assert named and named <= extras, named - extras
    assert not any("torch" in dep for dep in PROJECT["dependencies"])  # torch is never required


def test_links_agree() -> None:
    urls = PROJECT["urls"]
    assert {"Homepage", "Documentation", "Source", "Issues", "Changelog"} <= set(urls)
    mkdocs = (ROOT / "mkdocs.yml").read_text()
    repo = re.search(r"^repo_url: (\S+)$", mkdocs, re.M)
    site = re.search(r"^site_url: (\S+)$", mkdocs, re.M)
    assert repo is not None and site is not None
    assert urls["Source"] == repo.group(1) and urls["Documentation"] == site.group(1)
    assert urls["Issues"] == repo.group(1) + "/issues"
    assert urls["Changelog"].startswith(repo.group(1)) and urls["Changelog"].endswith(
        "/CHANGELOG.md")
    assert all(u.startswith("https://") for u in urls.values())


def test_typed_and_classified() -> None:
    assert (Path(torchless.__file__).parent / "py.typed").is_file()
    classifiers = PROJECT["classifiers"]
    assert "Typing :: Typed" in classifiers
    python = re.search(r">=3\.(\d+)", PROJECT["requires-python"])
    assert python is not None
    assert f"Programming Language :: Python :: 3.{python.group(1)}" in classifiers
    assert PROJECT["scripts"]["torchless"] == "torchless.cli.main:main"
