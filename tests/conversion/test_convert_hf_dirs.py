"""Model directories as whole directories: tied-weight aliases kept as transformers keeps them,
sharded output into a directory, the other files brought over, a Trainer checkpoint's other
pickles converted.

Oracles: ``torch.load`` of each source; the names transformers' ``_tied_weights_keys``
declare (GPT-2, Llama: ``lm_head.weight``; T5: ``encoder/decoder.embed_tokens.weight`` and
``lm_head.weight``; BERT: ``cls.predictions.decoder.*``), written out by hand; shard names and
splits computed by hand. Loading with transformers itself is in tests/integrations/.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import torchless
from torchless.cli.main import main

pytestmark = pytest.mark.torch


def _tied(torch: ModuleType, names: list[str], n: int = 12) -> dict[str, Any]:
    emb = torch.randn(n, 4)
    return {name: emb for name in names}


def _dir(torch: ModuleType, root: Path, sd: dict[str, Any], config: dict[str, Any]) -> Path:
    root.mkdir(parents=True)
    torch.save(sd, root / "pytorch_model.bin")
    (root / "config.json").write_text(json.dumps(config))
    return root


@pytest.mark.parametrize(("names", "kept"), [
    (["transformer.wte.weight", "lm_head.weight"], "transformer.wte.weight"),      # GPT-2
    (["model.embed_tokens.weight", "lm_head.weight"], "model.embed_tokens.weight"),  # Llama
    (["model.decoder.embed_tokens.weight", "lm_head.weight"],                        # OPT
     "model.decoder.embed_tokens.weight"),
    (["shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight",  # T5
      "lm_head.weight"], "shared.weight"),
    (["bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight"],    # BERT
     "bert.embeddings.word_embeddings.weight"),
    (["cls.predictions.bias", "cls.predictions.decoder.bias"], "cls.predictions.bias"),
])
def test_dedupe_keeps_the_tie_source(torch: ModuleType, tmp_path: Path, names: list[str],
                                     kept: str) -> None:
    import safetensors.torch

    sd = {**_tied(torch, names), "other.weight": torch.randn(3)}
    root = _dir(torch, tmp_path / "m", sd, {"model_type": "toy"})
    report = torchless.convert(root, tmp_path / "out", dedupe=True, verify=True)
    assert report.verified is not None and report.verified.ok
    assert dict(report.aliases) == {n: kept for n in names if n != kept}
    got = safetensors.torch.load_file(tmp_path / "out" / "model.safetensors")
    assert set(got) == {kept, "other.weight"}
    assert torch.equal(got[kept], sd[kept]) and torch.equal(got["other.weight"],
                                                            sd["other.weight"])


def test_dedupe_leaves_untied_and_unknown_aliases(torch: ModuleType, tmp_path: Path) -> None:
    import safetensors.torch

    # tie_word_embeddings false: transformers would not tie lm_head back, so both stay
    names = ["model.embed_tokens.weight", "lm_head.weight"]
    root = _dir(torch, tmp_path / "a", _tied(torch, names), {"tie_word_embeddings": False})
    report = torchless.convert(root, tmp_path / "a-out", dedupe=True)
    assert not report.aliases
    assert set(safetensors.torch.load_file(tmp_path / "a-out" / "model.safetensors")) == set(
        names)
    # an alias no transformers class declares (it would load as missing): written in full
    names = ["blocks.0.w", "blocks.1.w"]
    root = _dir(torch, tmp_path / "b", _tied(torch, names), {})
    assert not torchless.convert(root, tmp_path / "b-out", dedupe=True).aliases


def test_max_shard_size_into_a_directory(torch: ModuleType, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    sd = {"a": torch.randn(10), "b": torch.randn(10), "c": torch.randn(10)}
    torch.save(sd, tmp_path / "net.pt")
    names = [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    # 40 bytes per tensor, limit 50: one tensor per shard (by hand)
    for out in (tmp_path / "new", tmp_path / "existing"):
        if out.name == "existing":
            out.mkdir()
            target = str(out)                       # an existing directory, no slash
        else:
            target = str(out) + os.sep              # a trailing slash: a directory
        assert main(["convert", str(tmp_path / "net.pt"), "-o", target,
                     "--max-shard-size", "50"]) == 0
        assert sorted(os.listdir(out)) == [*names, "model.safetensors.index.json"]
        index = json.loads((out / "model.safetensors.index.json").read_text())
        assert index["weight_map"] == {"a": names[0], "b": names[1], "c": names[2]}
    assert not list(tmp_path.glob("existing-*")) and not list(tmp_path.glob(".*"))
    capsys.readouterr()


def _model_dir(torch: ModuleType, root: Path) -> dict[str, bytes]:
    root.mkdir()
    torch.save({"w": torch.randn(3)}, root / "pytorch_model.bin")
    others = {"config.json": b'{"model_type": "gpt2"}', "generation_config.json": b"{}",
              "tokenizer.json": b'{"v": 1}', "tokenizer_config.json": b"{}",
              "special_tokens_map.json": b"{}", "vocab.txt": b"a\nb\n", "merges.txt": b"#\n"}
    for name, data in others.items():
        (root / name).write_bytes(data)
    (root / ".gitattributes").write_text("*.bin lfs\n")
    # as in a hub cache snapshot: a relative symlink to a blob
    (root.parent / "blobs").mkdir()
    (root.parent / "blobs" / "abc").write_bytes(b"SPM")
    (root / "tokenizer.model").symlink_to(Path("..") / "blobs" / "abc")
    others["tokenizer.model"] = b"SPM"
    (root / "checkpoint-5").mkdir()                        # a checkpoint: left out
    (root / "checkpoint-5" / "optimizer.pt").write_bytes(b"x")
    (root / "1_Pooling").mkdir()                           # plain files: brought
    (root / "1_Pooling" / "config.json").write_bytes(b'{"pooling": "mean"}')
    others["1_Pooling/config.json"] = b'{"pooling": "mean"}'
    return others


def test_convert_dir_brings_the_other_files(torch: ModuleType, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "m"
    others = _model_dir(torch, src)
    out = tmp_path / "out"
    assert main(["convert", str(src), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert sorted(os.listdir(out)) == sorted(
        {*(n.split("/")[0] for n in others), "model.safetensors"})
    for name, data in others.items():
        assert (out / name).read_bytes() == data
        assert os.path.samefile(out / name, src / name)      # hard links by default
        assert not (out / name).is_symlink()
        assert f"linked {src / name} -> {out / name}" in text
    left = "left out (hidden, or a directory holding checkpoints)"
    assert f"{left}: {src / '.gitattributes'}" in text
    assert f"{left}: {src / 'checkpoint-5'}" in text
    # --no-link-files: separate files, same bytes
    assert main(["convert", str(src), "-o", str(tmp_path / "copy"), "--no-link-files"]) == 0
    assert f"copied {src / 'config.json'}" in capsys.readouterr().out
    for name, data in others.items():
        assert (tmp_path / "copy" / name).read_bytes() == data
        assert not os.path.samefile(tmp_path / "copy" / name, src / name)
    # an existing, different file in OUTDIR: refused before anything is written
    third = tmp_path / "third"
    third.mkdir()
    (third / "config.json").write_bytes(b"mine")
    assert main(["convert", str(src), "-o", str(third)]) == 1
    assert "exist" in capsys.readouterr().err
    assert os.listdir(third) == ["config.json"]
    assert main(["convert", str(src), "-o", str(third), "--force", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (third / "config.json").read_bytes() == others["config.json"]
    assert {b["dst"] for b in doc["brought"]} == {str(third / n) for n in others}


class _Args:
    """Stands in for TrainingArguments: an object torch pickles by class path."""

    def __init__(self) -> None:
        self.learning_rate = 0.5
        self.output_dir = "runs"


def test_trainer_checkpoint_with_pytorch_model_bin(torch: ModuleType, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    ckpt = tmp_path / "checkpoint-10"
    ckpt.mkdir()
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    torch.save(model.state_dict(), ckpt / "pytorch_model.bin")
    torch.save(opt.state_dict(), ckpt / "optimizer.pt")
    torch.save(sched.state_dict(), ckpt / "scheduler.pt")
    torch.save({"python": (3, (1, 2), None), "numpy": np.random.get_state(),
                "cpu": torch.get_rng_state()}, ckpt / "rng_state.pth")
    torch.save(_Args(), ckpt / "training_args.bin")
    torch.save({"step": 10, "buffer": torch.arange(4)}, ckpt / "custom_checkpoint_0.pkl")
    (ckpt / "trainer_state.json").write_text('{"global_step": 10}')
    out = tmp_path / "out"
    assert main(["convert", str(ckpt), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    stems = ["custom_checkpoint_0", "optimizer", "rng_state", "scheduler", "training_args"]
    assert sorted(os.listdir(out)) == sorted(
        ["model.safetensors", "trainer_state.json", *(s + ".safetensors" for s in stems)])
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin",
                 "custom_checkpoint_0.pkl"):
        assert f"converted {ckpt / name} -> " in text
    assert "_Args" in text  # the inert record is named
    want = torch.load(ckpt / "optimizer.pt", weights_only=True)
    got = torchless.load(out / "optimizer.safetensors")
    assert got["param_groups"][0]["lr"] == want["param_groups"][0]["lr"]
    for k, st in want["state"].items():
        for field, t in st.items():
            assert np.array_equal(got["state"][k][field], t.numpy()), (k, field)
    rng = torchless.load(out / "rng_state.safetensors")
    want_rng = torch.load(ckpt / "rng_state.pth", weights_only=False)
    assert np.array_equal(rng["cpu"], want_rng["cpu"].numpy())
    assert np.array_equal(rng["numpy"][1], want_rng["numpy"][1])
    assert torchless.load(out / "scheduler.safetensors") == sched.state_dict()
    assert torchless.load(out / "custom_checkpoint_0.safetensors")["step"] == 10
    # verify finds the weights among the other converted files
    assert main(["verify", str(ckpt), str(out)]) == 0
    # in place: beside the sources
    assert main(["convert", str(ckpt)]) == 0
    assert (ckpt / "optimizer.safetensors").is_file()
    assert (ckpt / "model.safetensors").is_file()
