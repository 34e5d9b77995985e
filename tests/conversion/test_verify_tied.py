"""``verify`` against transformers' own safetensors output of a tied model: the names
``save_pretrained`` drops (a tied weight is written once, with no record) are reported as
aliases of the tensor kept, not as missing.

Oracles: the names ``safetensors.torch.load_file`` finds in transformers' file, and torch's
own ``data_ptr`` of each state_dict tensor (which names share one storage)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import torchless
from torchless.cli.main import main

from ..conftest import require

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A tiny random GPT-2 saved by transformers as safetensors (``safe/``) and as
    ``pytorch_model.bin`` (``bin/``), and its ``torch.save``d state_dict (``sd.pt``)."""
    torch = require("torch")
    transformers = require("transformers")
    root = tmp_path_factory.mktemp("tied")
    config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=64,
                                     n_positions=32)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(root / "safe", safe_serialization=True)
    model.save_pretrained(root / "bin", safe_serialization=False)
    sd = model.state_dict()
    torch.save(sd, root / "sd.pt")
    return root, sd


def _dropped(root: Path, sd: dict[str, Any]) -> dict[str, set[str]]:
    """Each name transformers left out of its file -> the names in the file sharing its
    storage (torch's own view of the state_dict)."""
    import safetensors.torch

    kept = set(safetensors.torch.load_file(root / "safe" / "model.safetensors"))
    return {name: {k for k in kept if sd[k].data_ptr() == t.data_ptr()
                   and sd[k].shape == t.shape}
            for name, t in sd.items() if name not in kept}


@pytest.mark.parametrize(("src", "dst"), [
    ("sd.pt", "safe/model.safetensors"),
    ("bin/pytorch_model.bin", "safe/model.safetensors"),
    ("bin", "safe"),
])
def test_tied_weight_dropped_by_transformers_is_an_alias(
        gpt2: tuple[Path, dict[str, Any]], src: str, dst: str) -> None:
    root, sd = gpt2
    dropped = _dropped(root, sd)
    assert set(dropped) == {"lm_head.weight"}  # transformers did drop the tie's target
    report = torchless.verify(root / src, root / dst)
    assert report.ok, (report.missing, report.mismatched, report.extra)
    assert report.missing == ()
    assert set(report.matched) == set(sd)
    assert {n: {k} for n, k in report.aliases.items()} == dropped


def test_cli_verify_says_identical_and_names_the_alias(
        gpt2: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = gpt2
    assert main(["verify", str(root / "bin"), str(root / "safe")]) == 0
    out = capsys.readouterr().out
    assert "ok        lm_head.weight -> transformer.wte.weight" in out
    assert "identical" in out and "MISSING" not in out
    assert main(["verify", str(root / "sd.pt"), str(root / "safe" / "model.safetensors"),
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["missing"] == [] and doc["aliases"] == {
        "lm_head.weight": "transformer.wte.weight"}


def test_an_alias_of_a_changed_tensor_differs_too(torch: ModuleType, tmp_path: Path) -> None:
    """The alias is compared with the bytes it resolves to: a changed kept tensor fails
    both names; a dropped name with no twin in SRC stays missing."""
    import safetensors.torch

    emb = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    torch.save({"wte.weight": emb, "lm_head.weight": emb, "bias": torch.ones(2)},
               tmp_path / "sd.pt")
    safetensors.torch.save_file({"wte.weight": emb + 1, "bias": torch.ones(2)},
                                tmp_path / "changed.safetensors")
    report = torchless.verify(tmp_path / "sd.pt", tmp_path / "changed.safetensors")
    assert set(report.mismatched) == {"wte.weight", "lm_head.weight"}
    safetensors.torch.save_file({"wte.weight": emb.clone()}, tmp_path / "nobias.safetensors")
    report = torchless.verify(tmp_path / "sd.pt", tmp_path / "nobias.safetensors")
    assert report.missing == ("bias",) and dict(report.aliases) == {
        "lm_head.weight": "wte.weight"}
