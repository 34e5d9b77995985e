"""``convert`` of a DCP directory: every tensor of ``dcp_to_torch_save`` + ``torch.load``
byte for byte in the safetensors output (one file, shards with an index, a key, weights
only), the object tree kept, and ``verify`` of the result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import torchless
from tests._dcpfixture import dcp_cases, flat
from torchless.cli.main import main

__all__ = ["dcp_cases"]

CASES = ("single", "fsdp", "dtensor")


def _tensors(torch: Any, path: Path, key: str | None = None) -> dict[str, Any]:
    ref = torch.load(path, weights_only=False)
    if key is not None:
        ref = ref[key]
    return {k: v for k, v in flat(ref).items() if isinstance(v, torch.Tensor)}


def _assert_same_bytes(want: dict[str, Any], got: dict[str, Any], torch: Any) -> None:
    assert sorted(want) == sorted(got)
    for name, t in want.items():
        g = got[name]
        assert (g.dtype, g.shape) == (t.dtype, t.shape), name
        assert g.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() == \
            t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes(), name


@pytest.mark.parametrize("case", CASES)
def test_convert_equals_dcp_to_torch_save(case: str, dcp_cases: Path, tmp_path: Path,
                                          torch: Any) -> None:
    from safetensors.torch import load_file

    out = tmp_path / "out.safetensors"
    report = torchless.convert(dcp_cases / case, out, verify=True)
    assert report.verified is not None and report.verified.ok
    _assert_same_bytes(_tensors(torch, dcp_cases / f"{case}.pt"), load_file(out), torch)
    want = torch.load(dcp_cases / f"{case}.pt", weights_only=False)
    got = torchless.load(out, framework="pt")
    assert list(flat(want)) == list(flat(got))
    for name, value in flat(want).items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(flat(got)[name], value), name
        else:
            assert flat(got)[name] == value, name


@pytest.mark.parametrize("case", ["st", "hf"])
def test_safetensors_formats_convert(case: str, dcp_cases: Path, tmp_path: Path,
                                     torch: Any) -> None:
    from safetensors.torch import load_file

    out = tmp_path / "st.safetensors"
    torchless.convert(dcp_cases / case, out, verify=True)
    _assert_same_bytes(_tensors(torch, dcp_cases / "st.full.pt"), load_file(out), torch)


def test_torch_dcp_reads_the_output_back(dcp_cases: Path, tmp_path: Path,
                                         torch: Any) -> None:
    """The reverse direction needs no DCP writer: torch's own HuggingFaceStorageReader
    loads a converted file into a state dict (and would reshard it onto DTensors)."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    (tmp_path / "out").mkdir()
    torchless.convert(dcp_cases / "dtensor", tmp_path / "out" / "model.safetensors")
    want = _tensors(torch, dcp_cases / "dtensor.pt")
    state = {k: torch.empty_like(v) for k, v in want.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process"
        dcp.load(state, storage_reader=HuggingFaceStorageReader(str(tmp_path / "out")),
                 no_dist=True)
    _assert_same_bytes(want, state, torch)


def test_shards_key_and_weights_only(dcp_cases: Path, tmp_path: Path, torch: Any) -> None:
    from safetensors.torch import load_file

    out = tmp_path / "model.safetensors"
    report = torchless.convert(dcp_cases / "fsdp", out, key="model", max_shard_size=100,
                               tree=False, verify=True)
    assert report.verified is not None and report.verified.ok
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    got: dict[str, Any] = {}
    for shard in sorted(set(index["weight_map"].values())):
        got.update(load_file(tmp_path / shard))
    _assert_same_bytes(_tensors(torch, dcp_cases / "fsdp.pt", "model"), got, torch)
    assert torchless.verify(dcp_cases / "fsdp", tmp_path / "model.safetensors.index.json",
                            key="model").ok


def test_cli_convert_default_output_and_verify(dcp_cases: Path, tmp_path: Path,
                                               torch: Any) -> None:
    import shutil

    src = tmp_path / "ckpt"
    shutil.copytree(dcp_cases / "dtensor", src)
    assert main(["convert", str(src) + "/", "--no-tree"]) == 0
    out = tmp_path / "ckpt.safetensors"
    assert out.is_file()
    assert main(["verify", str(src), str(out)]) == 0
    from safetensors.torch import load_file

    _assert_same_bytes(_tensors(torch, dcp_cases / "dtensor.pt"), load_file(out), torch)


def test_verify_finds_a_changed_chunk(dcp_cases: Path, tmp_path: Path) -> None:
    out = tmp_path / "d.safetensors"
    torchless.convert(dcp_cases / "dtensor", out, tree=False)
    data = bytearray(out.read_bytes())
    data[-1] ^= 0xFF  # the last tensor's last byte
    out.write_bytes(bytes(data))
    report = torchless.verify(dcp_cases / "dtensor", out)
    assert not report.ok and list(report.mismatched.values()) == ["bytes differ"]


def test_batch_takes_dcp_directories_as_units(dcp_cases: Path, tmp_path: Path) -> None:
    """``torchless convert RUNS/`` converts each DCP checkpoint under RUNS as one source
    (never its shards one by one), beside ordinary checkpoint files."""
    import shutil

    runs = tmp_path / "runs"
    shutil.copytree(dcp_cases / "dtensor", runs / "step-10")
    shutil.copytree(dcp_cases / "single", runs / "a" / "step-20")
    shutil.copy(dcp_cases / "single.pt", runs / "final.pt")
    from torchless.api.batch import expand

    assert expand([runs]) == [str(runs / "step-10"), str(runs / "final.pt"),
                              str(runs / "a" / "step-20")]
    assert main(["convert", str(runs), "--no-tree"]) == 0
    for name in ("step-10", "a/step-20"):
        assert torchless.verify(runs / name, runs / f"{name}.safetensors").ok
    assert expand([runs], units=False) == [str(runs / "final.pt")]
