"""Write ``src/torchless/scanner/script_ops.py``: the operators torch registers, by namespace.

The TorchScript code scan (:mod:`torchless.scanner.script`) vets an operator only if the
installed torch registers it in a namespace whose operators compute on tensors; this script
reads the registry (``torch._C._jit_get_all_schemas()``) and writes it as data, so the library
never imports torch. ``--check`` compares the shipped module with what this torch registers
(the test ``tests/scanner/test_script_ops.py`` runs it, so the list cannot drift silently).

Run: ``python benchmarks/gen_script_ops.py`` (or ``--check``).
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "torchless" / "scanner" / "script_ops.py"

_HEAD = '''"""The operators torch {version} registers, by namespace (generated: do not edit).

Written by ``benchmarks/gen_script_ops.py`` from ``torch._C._jit_get_all_schemas()``; the
test ``tests/scanner/test_script_ops.py`` checks it against the installed torch. Names only,
without overloads: :mod:`torchless.scanner.script` decides which namespaces it vets and which
operators are dangerous.
"""

from __future__ import annotations

__all__ = ["CLASSES", "REGISTERED", "TORCH_VERSION"]

TORCH_VERSION = {version!r}

#: Operator names (``add``, ``from_file``) under each namespace (``aten``) torch registers.
REGISTERED: dict[str, frozenset[str]] = {{
'''


def classes() -> list[str]:
    """The custom classes torch's own operators take or return (``quantized.X``)."""
    import torch

    found = set()
    for schema in torch._C._jit_get_all_schemas():
        found.update(re.findall(r"__torch__\.torch\.classes\.(\w+\.\w+)", str(schema)))
    return sorted(found)


def registered() -> dict[str, list[str]]:
    """Every registered operator name, without its overload, by namespace."""
    import torch

    out: dict[str, set[str]] = {}
    for schema in torch._C._jit_get_all_schemas():
        ns, _, name = schema.name.partition("::")
        out.setdefault(ns, set()).add(name)
    return {ns: sorted(names) for ns, names in sorted(out.items())}


def render() -> str:
    import torch

    version = torch.__version__.split("+")[0]
    parts = [_HEAD.format(version=version)]
    for ns, names in registered().items():
        body = textwrap.fill(" ".join(names), width=88, break_long_words=False,
                             break_on_hyphens=False)
        lines = "\n".join(f"        {line!r}" for line in body.split("\n"))
        # each line ends at a name, so the pieces join with a space
        lines = lines.replace("'\n", " '\n")
        parts.append(f"    {ns!r}: frozenset((\n{lines}\n    ).split()),\n")
    parts.append("}\n")
    parts.append("\n#: Custom classes (``ns.Name``) that torch's own operators take or return.\n"
                 "CLASSES: frozenset[str] = frozenset((\n")
    parts += [f"    {name!r},\n" for name in classes()]
    parts.append("))\n")
    return "".join(parts)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if OUT.read_text() != text:
            print(f"{OUT} differs from what this torch registers: regenerate it")
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
