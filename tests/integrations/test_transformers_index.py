"""A model directory converted by default is what transformers itself writes with
safetensors: tied weights once (the names ``save_pretrained`` keeps), and an index with the
same keys and values (``metadata.total_parameters``, ``metadata.total_size``, the
``weight_map``'s names). ``--no-dedupe`` still writes every name.

Oracles: transformers 4.57's ``save_pretrained(safe_serialization=True)`` of the same model
(the index byte for byte, the tensor names of each file) and transformers 5.x's
``save_pretrained`` in a subprocess (its index's metadata and names; 5.x places tensors in
shards in another order, so the shard of each name is not compared)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import torchless
from torchless.cli.main import main

from ..conftest import require
from .conftest import OFFLINE, TRANSFORMERS_5

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

_SAVE_5 = """
import sys, transformers
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1])
model.save_pretrained(sys.argv[2], max_shard_size="10KB")
print(transformers.__version__)
"""


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random GPT-2 (tied embeddings) saved by transformers 4.x, sharded at 10 KB:
    ``bin/`` (``pytorch_model-*.bin``) and ``safe/`` (``model-*.safetensors``); and unsharded
    ``bin1/`` and ``safe1/``."""
    torch = require("torch")
    transformers = require("transformers")
    root = tmp_path_factory.mktemp("index")
    config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=64,
                                     n_positions=32)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    for name, safe, shard in (("bin", False, "10KB"), ("safe", True, "10KB"),
                              ("bin1", False, "10GB"), ("safe1", True, "10GB")):
        model.save_pretrained(root / name, safe_serialization=safe, max_shard_size=shard)
    return root


def _names(directory: Path) -> dict[str, set[str]]:
    import safetensors

    out = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            with safetensors.safe_open(directory / name, "np") as f:
                out[name] = set(f.keys())
    return out


def test_default_index_is_transformers_own(saved: Path) -> None:
    report = torchless.convert(saved / "bin", saved / "out", verify=True)
    assert dict(report.aliases) == {"lm_head.weight": "transformer.wte.weight"}
    index = "model.safetensors.index.json"
    assert (saved / "out" / index).read_bytes() == (saved / "safe" / index).read_bytes()
    doc = json.loads((saved / "out" / index).read_text())
    assert set(doc["metadata"]) == {"total_parameters", "total_size"}
    assert _names(saved / "out") == _names(saved / "safe")


def test_default_single_file_holds_transformers_names(saved: Path) -> None:
    import safetensors

    torchless.convert(saved / "bin1", saved / "out1")
    assert _names(saved / "out1") == _names(saved / "safe1")
    with safetensors.safe_open(saved / "out1" / "model.safetensors", "np") as f:
        assert f.metadata()["lm_head.weight"] == "transformer.wte.weight"


def test_no_dedupe_writes_every_name(saved: Path) -> None:
    torch = require("torch")
    assert main(["convert", str(saved / "bin"), "-o", str(saved / "plain"), "--no-dedupe",
                 "-q"]) == 0
    index = json.loads((saved / "plain" / "model.safetensors.index.json").read_text())
    want = set(torch.load(saved / "bin" / "pytorch_model-00004-of-00004.bin",
                          weights_only=True))
    for part in range(1, 4):
        want |= set(torch.load(saved / "bin" / f"pytorch_model-0000{part}-of-00004.bin",
                               weights_only=True))
    assert set(index["weight_map"]) == want and "lm_head.weight" in want
    # the tied weight counted twice: every name's bytes, as written
    assert index["metadata"]["total_size"] == sum(
        t.nbytes for n in range(1, 5) for t in torch.load(
            saved / "bin" / f"pytorch_model-0000{n}-of-00004.bin", weights_only=True).values())


@pytest.mark.slow
def test_index_keys_match_transformers_5(saved: Path, transformers_5: Path) -> None:
    env = {**os.environ, **OFFLINE, "PYTHONPATH": str(transformers_5)}
    out = subprocess.run([sys.executable, "-c", _SAVE_5, str(saved / "bin"),
                          str(saved / "safe5")], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-1] == TRANSFORMERS_5
    torchless.convert(saved / "bin", saved / "out5")
    index = "model.safetensors.index.json"
    theirs: dict[str, Any] = json.loads((saved / "safe5" / index).read_text())
    ours: dict[str, Any] = json.loads((saved / "out5" / index).read_text())
    assert ours["metadata"] == theirs["metadata"]
    assert set(ours["weight_map"]) == set(theirs["weight_map"])
