"""Every example in the commands' ``--help`` (and so in docs/cli.md, generated from it) runs.

The examples run in order in one scratch directory holding the files they name, so that
``verify`` finds what ``convert`` wrote; ``https://example.org/`` is a local server with
``Range`` support serving the same files, and each URL example runs in a directory of its own
(its default output is named after the URL's file).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from benchmarks.range_server import RangeServer, serve

from tests.cli.test_cli import run

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny.pt"
COMMANDS = ("inspect", "convert", "verify", "scan")


def _examples(command: str) -> list[str]:
    out = run(command, "--help", cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "examples:" in out.stdout, f"torchless {command} --help has no examples"
    lines = out.stdout.split("examples:", 1)[1].splitlines()
    return [re.sub(r"\s+#.*$", "", line.strip()) for line in lines
            if line.strip().startswith("torchless ")]


def _scratch(root: Path) -> Path:
    """Every file and directory the examples name, each checkpoint a copy of the example."""
    files = ["model.pt", "model.ckpt", "pytorch_model.bin", "ckpt.pt", "a.pt", "b.pt", "c.pt",
             "my-model/pytorch_model.bin", "checkpoints/one.pt", "checkpoints/two.pt",
             "models/m.pt", "hub-cache/org/model/pytorch_model.bin", "runs/1/last.ckpt",
             "runs/2/last.ckpt"]
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(EXAMPLE, root / name)
    (root / "my-model" / "config.json").write_text('{"model_type": "tiny"}')
    (root / "sharded").mkdir()
    weight_map = {}
    for k in (1, 2):
        shard = f"pytorch_model-0000{k}-of-00002.bin"
        shutil.copy(EXAMPLE, root / "sharded" / shard)
        weight_map[f"t{k}"] = shard
    (root / "sharded" / "pytorch_model.bin.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RangeServer]:
    yield from serve(_scratch(tmp_path / "served"))


def test_every_command_has_examples() -> None:
    for command in COMMANDS:
        assert len(_examples(command)) >= 3, command


@pytest.mark.parametrize("command", COMMANDS)
def test_help_examples_run(command: str, tmp_path: Path, server: RangeServer) -> None:
    work = _scratch(tmp_path / "work")
    if command == "verify":  # what the convert examples write, in the order they write it
        for example in _examples("convert"):
            if "https://" not in example:
                run(*example.split()[1:], cwd=work)
    for i, example in enumerate(_examples(command)):
        cwd = work
        if "https://example.org/" in example:
            example = example.replace("https://example.org/", server.url)
            cwd = tmp_path / f"url{i}"
            cwd.mkdir()
        args = example.split()[1:]
        out = run(*args, cwd=cwd)
        assert out.returncode == 0, f"{example}: exit {out.returncode}\n{out.stderr}"
        assert "Traceback" not in out.stderr, example
        if "--json" in args:
            text = out.stdout.strip()
            if text.startswith("{") or text.startswith("["):
                json.loads(text)
            else:  # one document per line
                for line in text.splitlines():
                    json.loads(line)
        if command == "convert" and "-o" in args:
            target = cwd / args[args.index("-o") + 1]
            assert target.exists(), example
        elif command == "convert" and args[1].endswith((".pt", ".ckpt", ".bin")) \
                and "://" not in args[1]:
            assert (cwd / args[1]).with_suffix(".safetensors").is_file(), example
    if command == "convert":
        assert (work / "my-model" / "model.safetensors").is_file()
        assert (work / "out" / "model.safetensors").is_file()
        assert (work / "runs" / "1" / "last.safetensors").is_file()
        assert (work / "run.jsonl").read_text().count("\n") == 2
        assert (tmp_path / "url8" / "model.safetensors").is_file()
