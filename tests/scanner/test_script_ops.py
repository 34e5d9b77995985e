"""The TorchScript allowlist is what the installed torch registers (``import torch`` alone, in
a fresh process), and the dangerous list covers every registered operator that takes a file
name, path, URL or descriptor.

The expected sets come from torch itself (``torch._C._jit_get_all_schemas()``), never from
the shipped module: the generator's ``--check`` compares the module with the registry, and
the schema scan below looks at argument names and types, not at our lists.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from torchless.scanner import script
from torchless.scanner.script_ops import REGISTERED, TORCH_VERSION

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]
#: Argument names that mean a file, a path, a URL or a descriptor.
_FILEISH = re.compile(r"^(f|fd|fp|file|filename|fname|path|filepath|url|uri|dir|directory)$"
                      r"|file|path|url|socket|host", re.IGNORECASE)


def test_the_shipped_registry_is_what_torch_registers(torch: ModuleType) -> None:
    assert torch.__version__.split("+")[0] == TORCH_VERSION
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gen_script_ops.py"),
                           "--check"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    # in this process other tests may have imported modules that register more operators
    names = {s.name for s in torch._C._jit_get_all_schemas()}
    assert {f"{ns}::{n}" for ns, ops in REGISTERED.items() for n in ops} <= names


def test_every_operator_taking_a_file_is_dangerous(torch: ModuleType) -> None:
    """An argument named like a file (a string or a descriptor) in any registered schema:
    its operator is on the dangerous list (or in a dangerous namespace)."""
    found = set()
    for schema in torch._C._jit_get_all_schemas():
        for arg in schema.arguments:
            kind = str(arg.type)
            if _FILEISH.search(arg.name) and ("str" in kind or kind == "int"):
                found.add(schema.name)
    assert "aten::from_file" in found and "aten::save" in found  # the scan has teeth
    missed = {op for op in found if op not in script.DANGEROUS and
              op.split("::")[0] not in script.DANGEROUS_NAMESPACES}
    assert missed == set()


def test_dangerous_methods_are_the_dangerous_operators_taking_self(torch: ModuleType) -> None:
    """``value.name(...)`` reaches an operator whose schema takes ``self`` first: each
    dangerous one is reachable that way only if it is in DANGEROUS_METHODS."""
    methods = {s.name.split("::")[1]: s.name for s in torch._C._jit_get_all_schemas()
               if s.name in script.DANGEROUS and s.arguments and s.arguments[0].name == "self"}
    assert methods == script.DANGEROUS_METHODS


def test_vetted_namespaces_are_registered_and_disjoint_from_dangerous() -> None:
    assert script.VETTED_NAMESPACES <= set(REGISTERED)
    assert not script.VETTED_NAMESPACES & set(script.DANGEROUS_NAMESPACES)
    assert set(script.DANGEROUS_NAMESPACES) <= set(REGISTERED)
