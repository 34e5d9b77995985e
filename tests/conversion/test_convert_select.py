"""``include`` / ``exclude`` / ``strip_prefix`` / ``rename`` (issue 28, item 2): the names
written are checked against lists written out by hand from the rules, the bytes against
the tensors torch saved, and every refusal leaves nothing on disk."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import torchless
from tests.cli.test_cli import run
from torchless.conversion.select import substitution
from torchless.errors import ConversionError
from torchless.inert import schema as _inert
from torchless.write.safetensors import read_header

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _lightning(torch: ModuleType, path: Path) -> dict[str, Any]:
    """A checkpoint shaped as Lightning saves one: the module's state_dict (a ``model``
    attribute: names ``model.…``) beside optimizer state."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    head = torch.nn.Linear(4, 2)
    state = {**{f"model.enc.{k}": v for k, v in net.state_dict().items()},
             **{f"model.head.{k}": v for k, v in head.state_dict().items()}}
    ckpt = {"epoch": 1, "global_step": 10, "state_dict": state,
            "optimizer_states": [{"state": {0: {"exp_avg": torch.zeros(8, 4)}},
                                  "param_groups": [{"lr": 0.1, "params": [0]}]}]}
    torch.save(ckpt, path)
    return state


def _written(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return dict(load_file(str(path)))


def test_include_exclude_strip_and_rename_give_the_names_worked_out_by_hand(
        torch: ModuleType, tmp_path: Path) -> None:
    src, out = tmp_path / "run.ckpt", tmp_path / "out.safetensors"
    state = _lightning(torch, src)
    report = torchless.convert(
        src, out, key="state_dict", include=["model.enc.*", "model.head.weight"],
        exclude="*.0.bias", strip_prefix="model.",
        rename=[r"s/^enc\.(\d+)\./encoder.layer.\1./", r"s/^head\./classifier./",
                "s/layer/layers/"], verify=True)
    # by hand: enc.0.weight, enc.2.weight, enc.2.bias, head.weight are kept (enc.0.bias
    # excluded, head.bias not included); "model." stripped; then the three rules in order
    expected = {"encoder.layers.0.weight": "model.enc.0.weight",
                "encoder.layers.2.weight": "model.enc.2.weight",
                "encoder.layers.2.bias": "model.enc.2.bias",
                "classifier.weight": "model.head.weight"}
    written = _written(out)
    assert sorted(written) == sorted(expected)
    for name, source in expected.items():
        assert torch.equal(written[name], state[source])
    assert report.tensors == 4 and report.verified is not None and report.verified.ok
    # the tensors chosen only: no object tree naming tensors the file does not hold
    meta = read_header(out.read_bytes()).metadata
    assert _inert.TREE_KEY not in meta and meta["format"] == "pt"
    assert torchless.verify(src, out, key="state_dict", include=["model.enc.*",
                            "model.head.weight"], exclude="*.0.bias", strip_prefix="model.",
                            rename=[r"s/^enc\.(\d+)\./encoder.layer.\1./",
                                    r"s/^head\./classifier./", "s/layer/layers/"]).ok
    assert not torchless.verify(src, out, key="state_dict").ok


def test_without_key_the_filters_see_the_whole_flat_names(torch: ModuleType,
                                                          tmp_path: Path) -> None:
    src, out = tmp_path / "run.ckpt", tmp_path / "out.safetensors"
    _lightning(torch, src)
    torchless.convert(src, out, exclude=["state_dict.*"])
    assert sorted(_written(out)) == ["optimizer_states.0.state.0.exp_avg"]


def test_callables_and_sed_flags(torch: ModuleType, tmp_path: Path) -> None:
    src, out = tmp_path / "run.ckpt", tmp_path / "out.safetensors"
    _lightning(torch, src)
    torchless.convert(src, out, key="state_dict",
                      include=lambda n: n.endswith("weight"), rename=[str.upper, "s/\\./_/"])
    assert sorted(_written(out)) == ["MODEL_ENC.0.WEIGHT", "MODEL_ENC.2.WEIGHT",
                                     "MODEL_HEAD.WEIGHT"]
    # sed: the first match, every match with g; any delimiter, escaped where it is literal
    assert substitution("s/\\./_/")("a.b.c") == "a_b.c"
    assert substitution("s/\\./_/g")("a.b.c") == "a_b_c"
    assert substitution("s|a\\|b|x|")("a|b.a") == "x.a"
    assert substitution(r"s/^(\w+)\.(\w+)$/\2.\1/")("w.b") == "b.w"
    for bad in ["x/a/b/", "s/a/b", "s/a/b/q", "s/a(/b/", r"s/a/\1/", "sxaxbx"]:
        with pytest.raises(ConversionError):
            substitution(bad)


def test_a_collision_is_refused_by_name_before_anything_is_written(
        torch: ModuleType, tmp_path: Path) -> None:
    src, out = tmp_path / "run.ckpt", tmp_path / "out.safetensors"
    _lightning(torch, src)
    with pytest.raises(ConversionError) as e:
        torchless.convert(src, out, key="state_dict", rename=r"s/\.\d+\./.N./")
    text = str(e.value)
    assert "'model.enc.0.weight' and 'model.enc.2.weight' both become 'model.enc.N.weight'" \
        in text
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["run.ckpt"]
    out.write_bytes(b"kept")  # an existing output is left as it was, even with force
    with pytest.raises(ConversionError, match="both become"):
        torchless.convert(src, out, key="state_dict", strip_prefix="model.",
                          rename=r"s/^head\./enc.0./", force=True)
    assert out.read_bytes() == b"kept"


def test_refusals_of_a_selection_that_does_nothing_or_leaves_nothing(
        torch: ModuleType, tmp_path: Path) -> None:
    src, out = tmp_path / "run.ckpt", tmp_path / "out.safetensors"
    _lightning(torch, src)
    with pytest.raises(ConversionError,
                       match=re.escape("no tensor name starts with the prefix 'enc.'")):
        torchless.convert(src, out, key="state_dict", strip_prefix="enc.")
    with pytest.raises(ConversionError, match="no tensor name is left"):
        torchless.convert(src, out, include="*.nothing")
    with pytest.raises(ConversionError, match=re.escape("turns 'model.enc.0.weight' into ''")):
        torchless.convert(src, out, key="state_dict", rename="s/.*//")
    with pytest.raises(ConversionError, match="no tensors under key 'nope'"):
        torchless.convert(src, out, key="nope", include="*")
    assert not out.exists()


def test_the_command_line(torch: ModuleType, tmp_path: Path) -> None:
    src = tmp_path / "run.ckpt"
    _lightning(torch, src)
    out = run("convert", str(src), "-o", str(tmp_path / "a.safetensors"), "--key",
              "state_dict", "--include", "model.head.*", "--include", "*.2.*",
              "--exclude", "*.bias", "--strip-prefix", "model.", "--rename",
              "s/^head/classifier/", "--verify", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert sorted(_written(tmp_path / "a.safetensors")) == ["classifier.weight",
                                                            "enc.2.weight"]
    out = run("verify", str(src), str(tmp_path / "a.safetensors"), "--key", "state_dict",
              "--include", "model.head.*", "--include", "*.2.*", "--exclude", "*.bias",
              "--strip-prefix", "model.", "--rename", "s/^head/classifier/", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    out = run("convert", str(src), "--rename", "s/a(/b/", cwd=tmp_path)
    assert out.returncode == 4 and "unterminated subpattern" in out.stderr
    out = run("convert", str(src), "--key", "state_dict", "--rename", "s/[0-9]/X/",
              cwd=tmp_path)
    assert out.returncode == 1 and "both become 'model.enc.X.weight'" in out.stderr
    assert not (tmp_path / "run.safetensors").exists()


def _model_dir(torch: ModuleType, root: Path) -> dict[str, Any]:
    """Two shards and their index, as transformers' save_pretrained names them."""
    torch.manual_seed(1)
    shards = {"pytorch_model-00001-of-00002.bin": {
                  "bert.embeddings.word_embeddings.weight": torch.randn(10, 4),
                  "bert.encoder.layer.0.attention.self.query.weight": torch.randn(4, 4)},
              "pytorch_model-00002-of-00002.bin": {
                  "bert.encoder.layer.1.attention.self.query.weight": torch.randn(4, 4),
                  "cls.predictions.bias": torch.randn(10)}}
    root.mkdir()
    weight_map = {}
    for name, state in shards.items():
        torch.save(state, root / name)
        weight_map.update(dict.fromkeys(state, name))
    (root / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 0}, "weight_map": weight_map}))
    (root / "config.json").write_text("{}")
    return {k: v for state in shards.values() for k, v in state.items()}


def test_a_model_directory_is_selected_and_renamed_as_one_model(
        torch: ModuleType, tmp_path: Path) -> None:
    state = _model_dir(torch, tmp_path / "src")
    out = tmp_path / "out"
    torchless.convert(tmp_path / "src", out, exclude="cls.*", strip_prefix="bert.",
                      rename=r"s/layer\.(\d+)\.attention\.self\./layers.\1.attn./",
                      verify=True)
    expected = {  # by hand, shard by shard
        "model-00001-of-00002.safetensors": {
            "embeddings.word_embeddings.weight": "bert.embeddings.word_embeddings.weight",
            "encoder.layers.0.attn.query.weight":
                "bert.encoder.layer.0.attention.self.query.weight"},
        "model-00002-of-00002.safetensors": {
            "encoder.layers.1.attn.query.weight":
                "bert.encoder.layer.1.attention.self.query.weight"}}
    for shard, names in expected.items():
        written = _written(out / shard)
        assert sorted(written) == sorted(names)
        for name, source in names.items():
            assert torch.equal(written[name], state[source])
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {n: s for s, names in expected.items() for n in names}
    assert (out / "config.json").exists()
    assert torchless.verify(tmp_path / "src", out, exclude="cls.*", strip_prefix="bert.",
                            rename=r"s/layer\.(\d+)\.attention\.self\./layers.\1.attn./").ok
    assert not torchless.verify(tmp_path / "src", out).ok
    # a clash between names of two shards is one clash: refused, both named, nothing written
    with pytest.raises(ConversionError, match=re.escape(
            "'bert.encoder.layer.0.attention.self.query.weight' and "
            "'bert.encoder.layer.1.attention.self.query.weight' both become")):
        torchless.convert(tmp_path / "src", tmp_path / "out2", rename=r"s/\.\d\././")
    assert not (tmp_path / "out2").exists() or not any((tmp_path / "out2").iterdir())


@pytest.mark.parametrize("layout", ["dcp", "zero"])
def test_dcp_and_zero_directories_go_through_the_same_path(layout: str,
                                                           tmp_path: Path) -> None:
    src = EXAMPLES / layout
    with torchless.open(src) as ckpt:
        names = list(ckpt.tensors)
    assert len(names) > 1, "the example checkpoint holds tensors"
    first = names[0]
    out = tmp_path / "one.safetensors"
    torchless.convert(src, out, include=first, rename="s/^/renamed./", verify=True)
    assert list(read_header(out.read_bytes()).entries) == ["renamed." + first]


def test_a_url_is_selected_by_range_requests(tmp_path: Path) -> None:
    from benchmarks.range_server import serve

    served = tmp_path / "served"
    served.mkdir()
    (served / "tiny.pt").write_bytes((EXAMPLES / "tiny.pt").read_bytes())
    for server in serve(served):
        out = tmp_path / "w.safetensors"
        torchless.convert(server.url + "tiny.pt", out, key="state_dict",
                          include="*.weight", rename="s/^/net./", verify=True)
        # tiny.pt's state_dict: 0.weight, 0.bias, 1.weight, 1.bias, 3.weight, 3.bias
        assert sorted(read_header(out.read_bytes()).entries) == [
            "net.0.weight", "net.1.weight", "net.3.weight"]


def test_several_sources_and_their_resumption(tmp_path: Path) -> None:
    for name in ("a.pt", "b.pt"):
        (tmp_path / name).write_bytes((EXAMPLES / "tiny.pt").read_bytes())
    args = ["convert", "a.pt", "b.pt", "--key", "state_dict", "--exclude", "*.bias",
            "--rename", "s/^/net./"]
    first = run(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "2 converted" in first.stdout
    assert sorted(_written(tmp_path / "b.safetensors")) == [
        "net.0.weight", "net.1.weight", "net.3.weight"]
    again = run(*args, "--skip-existing", cwd=tmp_path)  # they verify, same selection
    assert again.returncode == 0 and "2 already done" in again.stdout, again.stdout
