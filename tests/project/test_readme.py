"""Every example in the README and the docs runs, and the output they show is what runs print.

* ``python`` blocks run from the repository root. A ``text`` block right after one is its
  output: the block's stdout must match it, where ``...`` at the end of a line stands for the
  rest of that line and a line of only ``...`` for any number of lines.
* A ``text`` block that starts with ``$ `` is a terminal transcript: the commands run from the
  repository root and their output must match the same way.
* ``sh`` and ``console`` blocks are command lines: ``torchless …`` lines run in a scratch
  directory holding the files the examples name (``model.pt``, ``./downloads/`` …);
  ``pip install`` lines must name extras the project has; ``python benchmarks/X.py`` lines
  must name a script that accepts the options shown. Any other command fails the test.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```[ \t]*$", re.S | re.M)
EXAMPLE = ROOT / "examples" / "tiny.pt"


@dataclass
class Block:
    doc: str
    line: int
    lang: str
    text: str
    output: str | None = None  # the text block that follows a python block

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def _blocks(path: Path) -> list[Block]:
    source = path.read_text()
    found: list[Block] = []
    previous_end = -1
    for m in FENCE.finditer(source):
        block = Block(str(path.relative_to(ROOT)), source.count("\n", 0, m.start()) + 1,
                      m.group(1), m.group(2))
        follows = found and not source[previous_end:m.start()].strip()
        if follows and block.lang == "text" and found[-1].lang == "python" \
                and not block.text.startswith("$ "):
            found[-1].output = block.text
        else:
            found.append(block)
        previous_end = m.end()
    return found


BLOCKS = [b for doc in DOCS for b in _blocks(doc)]
PYTHON = [b for b in BLOCKS if b.lang == "python"]
TRANSCRIPTS = [b for b in BLOCKS if b.lang == "text" and b.text.startswith("$ ")]
SHELL = [b for b in BLOCKS if b.lang in ("sh", "console", "bash", "shell")]


def _pattern(expected: str) -> re.Pattern[str]:
    """A regex for shown output: ``...`` ends a line early or stands for any lines."""
    parts = []
    for line in expected.rstrip("\n").split("\n"):
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        elif line.rstrip().endswith("..."):
            parts.append(re.escape(line.rstrip()[:-3]) + r"[^\n]*\n")
        else:
            parts.append(re.escape(line.rstrip()) + r"[ \t]*\n")
    return re.compile("".join(parts))


def _assert_shown(expected: str, actual: str, where: str) -> None:
    actual = actual if actual.endswith("\n") else actual + "\n"
    assert _pattern(expected).fullmatch(actual), (
        f"{where}: the output shown in the docs is not what the example prints.\n"
        f"--- shown\n{expected}--- printed\n{actual}")


def _env() -> dict[str, str]:
    """The interpreter running the tests, and its scripts (the ``torchless`` command) first."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["COLUMNS"] = "100"
    return env


# ---- the checker itself ------------------------------------------------------------------


def test_shown_output_pattern() -> None:
    shown = "head\n  a  1\n...\ntail ...\n"
    assert _pattern(shown).fullmatch("head\n  a  1\nx\ny\ntail and more\n")
    assert _pattern(shown).fullmatch("head\n  a  1\ntail \n")
    assert not _pattern(shown).fullmatch("head\n  a  2\ntail\n")
    assert not _pattern(shown).fullmatch("head\n  a  1\nx\n")  # the tail line is missing
    assert not _pattern("a\nb\n").fullmatch("a\nb\nc\n")  # no "..." means nothing more


def test_blocks_are_found() -> None:
    assert len(PYTHON) >= 12 and TRANSCRIPTS and SHELL
    assert any(b.output for b in PYTHON)
    docs_with_python = {b.doc for b in PYTHON}
    assert {"README.md", "docs/guide/read.md", "docs/guide/training.md"} <= docs_with_python
    langs = {b.lang for b in BLOCKS}
    # mermaid: diagrams the docs site draws (docs/architecture.md), nothing to run
    assert langs <= {"python", "text", "sh", "console", "mermaid", ""}, langs
    assert {b.doc for b in BLOCKS if b.lang == "mermaid"} == {"docs/architecture.md"}
    # unlabelled blocks are the byte layouts and record shapes of the inert-format spec
    assert {b.doc for b in BLOCKS if not b.lang} == {"docs/inert-format.md"}


# ---- python examples -----------------------------------------------------------------------


#: frameworks docs/integrations.md uses: in the test extra, so CI has them; a developer's
#: environment without one skips its examples
FRAMEWORKS = re.compile(r"^(?:import|from) .*?\b(lightning|transformers|accelerate)\b", re.M)


def _needs_missing_framework(block: Block) -> str | None:
    import importlib.util

    for name in FRAMEWORKS.findall(block.text):
        if importlib.util.find_spec(name) is None:
            return name
    return None


@pytest.mark.parametrize("block", PYTHON, ids=lambda b: b.id)
def test_python_example_runs(block: Block) -> None:
    missing = _needs_missing_framework(block)
    if missing is not None:
        if os.environ.get("TORCHLESS_REQUIRE_TORCH"):
            pytest.fail(f"{block.id} needs {missing} (TORCHLESS_REQUIRE_TORCH is set)")
        pytest.skip(f"{block.id} needs {missing}, not installed")
    out = subprocess.run([sys.executable, "-c", block.text], cwd=ROOT, capture_output=True,
                         text=True, timeout=180, env=_env())
    assert out.returncode == 0, f"{block.id}: {out.stderr}"
    if block.output is not None:
        _assert_shown(block.output, out.stdout, block.id)


# ---- terminal transcripts --------------------------------------------------------------


def _transcript(text: str) -> list[tuple[str, str]]:
    """``$ command`` lines, each with the output shown under it."""
    steps: list[tuple[str, str]] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("$ "):
            steps.append((line[2:].strip(), ""))
        else:
            command, shown = steps[-1]
            steps[-1] = (command, shown + line)
    return steps


@pytest.mark.parametrize("block", TRANSCRIPTS, ids=lambda b: b.id)
def test_transcript_matches(block: Block) -> None:
    for command, shown in _transcript(block.text):
        assert command.startswith("torchless "), f"{block.id}: {command}"
        out = subprocess.run(command, shell=True, cwd=ROOT, capture_output=True, text=True,
                             timeout=180, env=_env())
        assert out.returncode == 0, f"{block.id}: {command}: {out.stderr}"
        _assert_shown(shown, out.stdout, f"{block.id}: {command}")


# ---- command lines --------------------------------------------------------------------------


def _commands(block: Block) -> list[str]:
    commands = []
    for line in block.text.splitlines():
        line = line.removeprefix("$ ").strip()
        if line and not line.startswith("#"):
            commands.append(re.sub(r"\s+#.*$", "", line))
    return commands


def _scratch(tmp: Path) -> Path:
    """The files the command-line examples name, each a copy of the bundled example (a DCP
    directory: of the bundled DCP example)."""
    for name in ("model.pt", "model.ckpt", "downloads/a.pt", "downloads/sub/b.bin",
                 "examples/tiny.pt"):
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(EXAMPLE, tmp / name)
    for name in ("lightning.ckpt", "sd-ema.ckpt"):  # docs/recipes.md
        shutil.copy(ROOT / "examples" / name, tmp / "examples" / name)
    shutil.copytree(ROOT / "examples" / "dcp", tmp / "ckpt" / "step-1000")  # docs/dcp.md
    shutil.copytree(ROOT / "examples" / "zero", tmp / "run")  # docs/deepspeed.md
    return tmp


def _check_pip(command: str, where: str) -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for arg in shlex.split(command)[2:]:
        if arg.startswith("-") or arg == "torch==2.13.0":  # the test-only torch of the README
            continue
        m = re.fullmatch(r"(?:torchless|\.)(?:\[([\w,-]+)\])?", arg)
        if m is None:  # something besides torchless: only the scanners it is compared with
            assert arg in ("picklescan", "modelscan", "fickling", "typing_extensions"), \
                f"{where}: pip installs {arg}"
            continue
        extras = set(m.group(1).split(",")) if m.group(1) else set()
        assert extras <= set(project["optional-dependencies"]), f"{where}: {arg}"


def _check_benchmark(command: str, where: str) -> None:
    args = shlex.split(re.sub(r"\[[^]]*\]", "", command))  # [--optional ARGS] shown in brackets
    script = ROOT / args[1]
    assert script.is_file(), f"{where}: no {args[1]}"
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                         text=True, timeout=120, env=_env())
    assert out.returncode == 0, f"{where}: {out.stderr}"
    for option in re.findall(r"--[\w-]+", command):
        assert option in out.stdout, f"{where}: {args[1]} has no {option}"


def _run_part(part: str, scratch: Path, where: str) -> None:
    part = re.sub(r"^\S*/(?=pip )", "", part)  # /tmp/venv/bin/pip install …
    if part.startswith("torchless "):
        out = subprocess.run(part, shell=True, cwd=scratch, capture_output=True, text=True,
                             timeout=180, env=_env())
        assert out.returncode == 0, f"{where}: exit {out.returncode}: {out.stderr}"
        assert "Traceback" not in out.stderr
    elif part.startswith(("pip install", "pipx install")):
        _check_pip(part, where)
    elif part.startswith("python benchmarks/"):
        _check_benchmark(part, where)
    elif part == "python -m pytest":
        pass  # the README's test command: CI runs it, this is part of it
    elif not re.fullmatch(r"python3 -m venv \S+|\. \S+/bin/activate", part):
        pytest.fail(f"{where}: the docs show a command this test does not know how to run")


@pytest.mark.parametrize("block", SHELL, ids=lambda b: b.id)
def test_command_lines_run(block: Block, tmp_path: Path) -> None:
    scratch = _scratch(tmp_path)
    commands = _commands(block)
    assert commands
    for command in commands:
        for part in (p.strip() for p in command.split("&&")):
            _run_part(part, scratch, f"{block.id}: {part}")
    # what the commands were meant to write is there
    if any(c.startswith("torchless convert model.pt") for c in commands):
        assert (scratch / "model.safetensors").is_file()
    if any("> scan.json" in c for c in commands):
        assert '"files"' in (scratch / "scan.json").read_text()


def test_inert_format_example_is_what_save_writes(torch: ModuleType, tmp_path: Path) -> None:
    """The spec's worked example (section 5) is the header torchless.save writes for it."""
    import argparse
    import json
    import struct

    import torchless

    example = next(b for b in BLOCKS if b.doc == "docs/inert-format.md"
                   and b.text.startswith("__metadata__:"))
    meta_text, tensor_line = example.text.split("\nw: ")
    shown_meta = json.loads(meta_text.removeprefix("__metadata__:"))
    path = tmp_path / "example.safetensors"
    torchless.save({"epoch": 3, "lr": 1e-3, "args": argparse.Namespace(seed=1),
                    "w": torch.tensor([1.0, 2.0])}, path)
    raw = path.read_bytes()
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    assert header["__metadata__"] == shown_meta
    assert header["w"] == json.loads(tensor_line)


# ---- the README's shape ------------------------------------------------------------------


def test_readme_keeps_two_setup_commands() -> None:
    lines = README.splitlines()
    commands = [lines[i + 1] for i, line in enumerate(lines) if re.match(r"# [12]\. ", line)]
    assert len(commands) == 2
    assert "torchless inspect examples/tiny.pt" in commands[0]
    assert "pytest" in commands[1] and "torch==2.13.0" in commands[1]
    assert (ROOT / "examples" / "tiny.pt").is_file()


def test_readme_limits_table_is_the_defaults() -> None:
    """Every Limits field is in the README's table with its default (units read by hand:
    MiB = 2**20, GiB = 2**30)."""
    import dataclasses

    import torchless

    rows = dict(re.findall(r"^\| `(max_\w+)` \| ([\d,]+(?: [MG]iB)?) \|", README, re.M))
    unit = {"MiB": 1 << 20, "GiB": 1 << 30}
    shown = {}
    for name, text in rows.items():
        number, _, suffix = text.partition(" ")
        shown[name] = int(number.replace(",", "")) * unit.get(suffix, 1)
    defaults = {f.name: f.default for f in dataclasses.fields(torchless.Limits)}
    assert shown == defaults
