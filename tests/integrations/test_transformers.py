"""transformers' from_pretrained on every directory convert writes: GPT-2 and Llama, tied and
untied embeddings, one file and sharded, with and without --dedupe, under transformers 4.x
(the test extra's pin, in this process) and 5.x (installed by pip into a cache directory
and run in a subprocess). The oracle: the model's own state_dict and logits before it was
saved with save_pretrained(safe_serialization=False)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ..conftest import require
from .conftest import OFFLINE, TRANSFORMERS_5

pytestmark = [pytest.mark.torch, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

# each checks one case the converted directory must load: the tie's source kept (4.x leaves
# a missing one on the meta device), a head kept when not tied, index + shards named as
# transformers names them
_LOAD = """
import json, sys, torch
from transformers import AutoModelForCausalLM
torch.set_num_threads(1)  # as the oracle's logits were computed: sums in one order
out = {}
for d, ref in json.loads(sys.argv[1]):
    want = torch.load(ref, weights_only=True)
    model = AutoModelForCausalLM.from_pretrained(d).eval()
    sd = model.state_dict()
    bad = [k for k, v in want["state"].items()
           if k not in sd or sd[k].device.type == "meta" or not torch.equal(sd[k], v)]
    with torch.no_grad():
        same = torch.equal(model(want["ids"]).logits, want["logits"])
    out[d] = {"bad": bad, "logits": same}
print(json.dumps(out))
"""


def _models(transformers: ModuleType) -> dict[str, Any]:
    small = {"vocab_size": 64}
    llama = {**small, "num_hidden_layers": 2, "hidden_size": 16, "intermediate_size": 32,
             "num_attention_heads": 2, "num_key_value_heads": 2}
    return {
        "gpt2": transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, n_positions=32,
                                        **small),
        "llama-tied": transformers.LlamaConfig(**llama, tie_word_embeddings=True),
        "llama-untied": transformers.LlamaConfig(**llama, tie_word_embeddings=False),
    }


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, str]]:
    """(converted directory, oracle file) for every model x sharding x dedupe."""
    torch = require("torch")
    transformers = require("transformers")
    import torchless

    root = tmp_path_factory.mktemp("hf")
    cases: list[tuple[str, str]] = []
    for name, config in _models(transformers).items():
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
        ids = torch.arange(10)[None]
        # one thread here and in the loading process: with several, the order of a matmul's
        # partial sums depends on the thread count (which earlier tests may have changed)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.no_grad():
                logits = model(ids).logits
        finally:
            torch.set_num_threads(threads)
        ref = root / f"{name}.ref.pt"
        torch.save({"state": model.state_dict(), "ids": ids, "logits": logits}, ref)
        for shard in ("one", "sharded"):
            src = root / f"{name}-{shard}"
            model.save_pretrained(src, safe_serialization=False,
                                  **({"max_shard_size": "20KB"} if shard == "sharded" else {}))
            assert (src / "pytorch_model.bin.index.json").exists() == (shard == "sharded")
            for dedupe in (False, True):
                out = root / f"{name}-{shard}-{'dedupe' if dedupe else 'plain'}"
                torchless.convert(src, out, dedupe=dedupe, verify=True)
                assert not [n for n in os.listdir(out) if n.endswith(".bin")]
                cases.append((str(out), str(ref)))
    return cases


def _check(result: dict[str, Any], cases: list[tuple[str, str]]) -> None:
    assert set(result) == {d for d, _ in cases}
    for d, r in result.items():
        assert r == {"bad": [], "logits": True}, d


def test_from_pretrained_4(converted: list[tuple[str, str]]) -> None:
    transformers = require("transformers")
    assert transformers.__version__.startswith("4.")
    out = subprocess.run([sys.executable, "-c", _LOAD, json.dumps(converted)],
                         capture_output=True, text=True, env={**os.environ, **OFFLINE})
    assert out.returncode == 0, out.stderr[-3000:]
    _check(json.loads(out.stdout.splitlines()[-1]), converted)


def test_from_pretrained_5(converted: list[tuple[str, str]], transformers_5: Path) -> None:
    env = {**os.environ, **OFFLINE, "PYTHONPATH": str(transformers_5)}
    version = subprocess.run([sys.executable, "-c",
                              "import transformers; print(transformers.__version__)"],
                             capture_output=True, text=True, env=env, check=True)
    assert version.stdout.strip() == TRANSFORMERS_5
    out = subprocess.run([sys.executable, "-c", _LOAD, json.dumps(converted)],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    _check(json.loads(out.stdout.splitlines()[-1]), converted)
