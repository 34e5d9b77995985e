"""Issue 26, rows 6, 7 and 16: torchless's own outputs and Hugging Face model directories
through the command line. A model directory (an index and its shards, ``.bin`` or
safetensors, or one weights file) inspects as one model in every view; an index file scans
the shards it names and reports those missing; ``inspect --json`` has one schema for one
file or many; convert never takes a file as its own output.

The sharded ``.bin`` directory is written as transformers' ``save_pretrained(...,
safe_serialization=False)`` writes it (torch.save per shard, the index's weight_map), the
safetensors one by ``convert`` itself and by the safetensors package; expected tensor names
and counts come from what the test saved."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from tests._dcpfixture import dcp_cases  # noqa: F401  (fixture)
from torchless.cli.main import main
from torchless.scanner.files import scan

from ..conftest import REPO

TINY = REPO / "examples" / "tiny.pt"


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def _shards(torch: ModuleType) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(0)
    return [{"model.embed.weight": torch.randn(8, 4, generator=g),
             "model.layers.0.w": torch.randn(4, 4, generator=g)},
            {"model.layers.1.w": torch.randn(4, 4, generator=g),
             "lm_head.weight": torch.randn(8, 4, generator=g)}]


def _bin_dir(torch: ModuleType, root: Path) -> Path:
    """As save_pretrained(safe_serialization=False) writes a sharded model."""
    root.mkdir()
    (root / "config.json").write_text('{"model_type": "test"}')
    from .._torchgen import save_bin_shards

    save_bin_shards(root, _shards(torch))
    torch.save({"state": {}, "param_groups": []}, root / "optimizer.pt")
    return root


NAMES = {"model.embed.weight", "model.layers.0.w", "model.layers.1.w", "lm_head.weight"}


# ---- row 7: a model directory inspects as one model ------------------------------------------

@pytest.mark.torch
def test_a_sharded_bin_directory_is_one_model(torch: ModuleType, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    model = _bin_dir(torch, tmp_path / "m")
    code, out, err = _cli(capsys, "inspect", str(model))
    assert code == 0, err
    assert out.count("format: ") == 1  # one block, not one per shard
    assert "tensors: 4, 384 B" in out
    assert "also in the directory" in out and "optimizer.pt" in out  # named, not dropped
    code, out, _ = _cli(capsys, "inspect", str(model), "--tree")
    assert code == 0 and out.startswith("dict (4)")
    assert {line.split(":")[0].strip() for line in out.splitlines()[1:]} == NAMES
    code, out, _ = _cli(capsys, "inspect", str(model), "--json")
    (entry,) = json.loads(out)["files"]
    assert code == 0 and entry["format"] == "index" and entry["model_dir"] == str(model)
    assert {t["name"] for t in entry["tensors"]} == NAMES
    assert entry["also_in_dir"] == ["optimizer.pt"]
    page = tmp_path / "r.html"
    code, out, _ = _cli(capsys, "inspect", str(model), "--html", "-o", str(page))
    assert code == 0 and "report of 4 tensors, scan verdict clean" in out
    text = page.read_text()
    assert text.count('class="verdict clean"') == 4  # the page's verdict, the index, 2 shards
    assert "verdict unreadable" not in text


@pytest.mark.torch
def test_the_directory_convert_wrote_inspects(torch: ModuleType, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Was: "no checkpoint files" for the directory convert had just written."""
    model = _bin_dir(torch, tmp_path / "m")
    out_dir = tmp_path / "out"
    assert main(["convert", str(model), "-o", str(out_dir), "-q"]) == 0
    assert capsys.readouterr().out == ""  # -q
    code, out, err = _cli(capsys, "inspect", str(out_dir))
    assert code == 0, err
    assert out.startswith(f"{out_dir}/model.safetensors.index.json\n")
    assert "tensors: 4, 384 B" in out and out.count("format: ") == 1
    code, out, _ = _cli(capsys, "inspect", str(out_dir), "--json")
    assert {t["name"] for t in json.loads(out)["files"][0]["tensors"]} == NAMES
    page = tmp_path / "o.html"
    assert main(["inspect", str(out_dir), "--html", "-o", str(page)]) == 0
    text = page.read_text()
    assert 'id="verdict">clean<' in text and "verdict unreadable" not in text
    capsys.readouterr()
    # a directory holding both (converted in place): the safetensors, as transformers loads
    assert main(["convert", str(model), "-q"]) == 0
    code, out, _ = _cli(capsys, "inspect", str(model), "--json")
    (entry,) = json.loads(out)["files"]
    assert entry["path"].endswith("model.safetensors.index.json")
    assert set(entry["also_in_dir"]) >= {"pytorch_model.bin.index.json", "optimizer.pt"}


def test_a_single_safetensors_model_directory(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.numpy import save_file

    model = tmp_path / "m"
    model.mkdir()
    save_file({"w": np.ones((2, 3), np.float32)}, str(model / "model.safetensors"))
    (model / "config.json").write_text("{}")
    code, out, err = _cli(capsys, "inspect", str(model))
    assert code == 0 and "tensors: 1, 24 B" in out, err
    code, out, _ = _cli(capsys, "inspect", str(model), "--tree")
    assert out.splitlines() == ["dict (1)", "  w: Tensor float32 2x3"]


@pytest.mark.torch
def test_tree_and_html_of_a_dcp_directory(dcp_cases: Path, tmp_path: Path,  # noqa: F811
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Was: "--html and --tree take one checkpoint file"."""
    code, out, err = _cli(capsys, "inspect", str(dcp_cases / "single"), "--tree")
    assert code == 0 and out.startswith("dict ("), err
    page = tmp_path / "d.html"
    code, out, err = _cli(capsys, "inspect", str(dcp_cases / "single"), "--html", "-o",
                          str(page))
    assert code == 0 and "scan verdict clean" in out, err
    code, out, _ = _cli(capsys, "inspect", str(dcp_cases / "single"), "--json")
    (entry,) = json.loads(out)["files"]
    assert entry["format"] == "dcp" and entry["tensor_count"] > 0


def test_tree_of_a_plain_directory_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "a.pt").write_bytes(TINY.read_bytes())
    (tmp_path / "b.pt").write_bytes(TINY.read_bytes())
    with pytest.raises(SystemExit) as info:
        main(["inspect", str(tmp_path), "--tree"])
    assert info.value.code == 4


# ---- row 6: an index scans the shards it names ------------------------------------------------

@pytest.mark.torch
def test_an_index_scans_its_shards(torch: ModuleType, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    model = _bin_dir(torch, tmp_path / "m")
    index = model / "pytorch_model.bin.index.json"
    files = scan(index).files
    assert [(Path(f.path).name, f.status, f.layout) for f in files] == [
        ("pytorch_model.bin.index.json", "clean", "index"),
        ("pytorch_model-00001-of-00002.bin", "clean", "zip"),
        ("pytorch_model-00002-of-00002.bin", "clean", "zip")]
    assert _cli(capsys, "scan", str(index))[0] == 0
    # a shard missing: reported by name, exit 2 (unreadable), named or met in a walk
    (model / "pytorch_model-00002-of-00002.bin").unlink()
    for target in (index, model):
        code, out, _ = _cli(capsys, "scan", str(target))
        assert code == 2, target
        assert "ERROR    index" in out and "1 of them missing: pytorch_model-00002-of-00002.bin" \
            in out
    entry = [f for f in scan(model).files if f.layout == "index"]
    assert len(entry) == 1 and entry[0].status == "unreadable"


def test_safetensors_index_scans_clean_and_the_report_has_no_red_pill(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.numpy import save_file

    save_file({"a": np.zeros(2, np.float32)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"b": np.ones(3, np.int64)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 32}, "weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    report = scan(index)
    assert [f.status for f in report.files] == ["clean"] * 3 and report.exit_code == 0
    page = tmp_path / "r.html"
    for target in (index, tmp_path / "model-00001-of-00002.safetensors"):
        assert main(["inspect", str(target), "--html", "-o", str(page), "--force"]) == 0
        text = page.read_text()
        assert 'id="verdict">clean<' in text and "verdict unreadable" not in text
    capsys.readouterr()


def test_a_damaged_index_is_unreadable(tmp_path: Path) -> None:
    index = tmp_path / "model.safetensors.index.json"
    index.write_text('{"weight_map": {"a": "../outside.safetensors"}}')
    (f,) = scan(index).files
    assert f.status == "unreadable" and f.layout == "index"
    assert f.error is not None and "not a plain file name" in f.error


# ---- row 16: one JSON schema; a file is never its own output ----------------------------------

def test_inspect_json_is_one_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    code, out, _ = _cli(capsys, "inspect", str(TINY), "--json")
    one = json.loads(out)
    assert code == 0 and set(one) == {"format", "version", "ok", "files"}
    assert one["format"] == "torchless-inspect" and one["ok"] and len(one["files"]) == 1
    code, out, err = _cli(capsys, "inspect", str(TINY), str(bad), "--json")
    many = json.loads(out)
    assert code == 1 and set(many) == set(one) and not many["ok"]
    assert many["files"][0] == one["files"][0]  # the same entry, one file or many
    assert many["files"][1]["status"] == "refused" and many["files"][1]["hint"]
    assert "bad.pt" in err  # the error is on stderr too
    code, out, _ = _cli(capsys, "inspect", str(TINY), str(bad), "--jsonl")
    assert code == 1 and [json.loads(line) for line in out.splitlines()] == many["files"]


def test_convert_never_takes_a_file_as_its_own_output(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Was: ``convert A existing.safetensors`` converted A, then "verified" the existing file
    against itself and said "already converted"."""
    src = tmp_path / "a.pt"
    src.write_bytes(TINY.read_bytes())
    existing = tmp_path / "other.safetensors"
    assert main(["convert", str(TINY), "-o", str(existing), "-q"]) == 0
    before = existing.read_bytes()
    for argv in (["convert", str(src), str(existing)], ["convert", str(existing)],
                 ["convert", str(src), str(existing), str(TINY)],
                 ["convert", str(existing), "-o", str(existing), "--force"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 4, argv
    err = capsys.readouterr().err
    assert f"-o {existing}" in err and "its own output" in err
    assert existing.read_bytes() == before and not (tmp_path / "a.safetensors").exists()
    # the existing-output rule: -o an existing file is refused unless --force
    assert main(["convert", str(src), "-o", str(existing)]) == 1
    assert "exists" in capsys.readouterr().err and existing.read_bytes() == before
    assert main(["convert", str(src), "-o", str(existing), "--force", "-q"]) == 0
