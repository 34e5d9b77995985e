"""Directories of per-rank ``torch.save`` files of DTensors (verl's FSDP2 checkpoints) and
ShardedTensors (FSDP1's ``SHARDED_STATE_DICT``), written by :mod:`tests._rankgen` with torch
itself, 2 gloo ranks: the tensors equal torch's own ``DTensor.full_tensor()`` /
``ShardedTensor.gather`` byte for byte, ``convert`` writes them, and one rank
file alone says what its pieces are instead of passing a piece off as the tensor."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

import torchless
from tests._rankfixture import rank_cases  # noqa: F401 - the session fixture
from torchless.cli.main import main
from torchless.errors import UnsupportedError


def _bytes(t: Any, torch: Any) -> bytes:
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


@pytest.mark.parametrize(("case", "placed"), [("verl", 7), ("fsdp1", 5)])
def test_tensors_equal_torchs_assembly(rank_cases: Path, torch: Any,  # noqa: F811
                                       case: str, placed: int) -> None:
    from safetensors.torch import load_file

    ref = load_file(str(rank_cases / f"{case}.ref.safetensors"))
    with torchless.open(rank_cases / case) as ckpt:
        assert ckpt.format == "ranks"
        assert ckpt.info["world_size"] == 2
        # the model's pieces, and (verl) the optimizer's moments
        assert ckpt.info["distributed_tensors"] >= placed
        assert set(ckpt.tensors) == set(ref)
        for name, want in ref.items():
            got = ckpt.tensors[name]
            assert got.shape == tuple(want.shape), name
            assert got.dtype.name == str(want.dtype).removeprefix("torch."), name
            assert got.numpy().tobytes() == _bytes(want, torch), name


def test_load_puts_the_optimizer_moments_together(rank_cases: Path,  # noqa: F811
                                                  torch: Any) -> None:
    from safetensors.torch import load_file

    ref = load_file(str(rank_cases / "verl.optim.ref.safetensors"))
    tree = torchless.load(rank_cases / "verl")
    assert set(tree) == {"model", "optimizer", "extra_state"}
    state = tree["optimizer"]["state"]
    assert len(ref) == 2 * len(state) > 0
    for key, want in ref.items():
        index, name = key.split(".")
        got = state[int(index)][name]
        assert got.shape == tuple(want.shape) and got.tobytes() == _bytes(want, torch), key
    assert tree["extra_state"]["lr_scheduler"] == {"last_epoch": 1}  # rank 0's


def test_convert_writes_the_full_tensors(rank_cases: Path, tmp_path: Path,  # noqa: F811
                                         torch: Any) -> None:
    from safetensors.torch import load_file

    out = tmp_path / "model.safetensors"
    assert main(["convert", str(rank_cases / "verl"), "-o", str(out), "--verify"]) == 0
    ref = load_file(str(rank_cases / "verl.ref.safetensors"))
    got = load_file(str(out))
    assert set(got) == set(ref)
    for name, want in ref.items():
        assert got[name].dtype == want.dtype and torch.equal(got[name], want), name


def test_one_rank_file_lists_its_pieces(rank_cases: Path) -> None:  # noqa: F811
    with torchless.open(rank_cases / "fsdp1" / "model_world_size_2_rank_0.pt") as ckpt:
        assert ckpt.unsupported["body.weight"].startswith(
            "ShardedTensor piece (rank 0's 1 local shard(s) of [5, 6]")
    with torchless.open(rank_cases / "verl" / "model_world_size_2_rank_1.pt") as ckpt:
        assert list(ckpt.tensors) == ["scale"]  # the one plain tensor
        assert "emb.weight" in ckpt.unsupported
        assert re.match(r"DTensor piece \(\[Shard\(0\)\] of \[7, 6\] on a \[2\] mesh, "
                        r"coordinate \[1\]: one rank's part", ckpt.unsupported["emb.weight"])
        with pytest.raises(UnsupportedError):
            ckpt.numpy("emb.weight")


def test_a_missing_rank_is_not_a_rank_directory(rank_cases: Path,  # noqa: F811
                                                tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(rank_cases / "verl", run)
    (run / "model_world_size_2_rank_1.pt").unlink()
    with pytest.raises(torchless.NotACheckpointError):
        torchless.open(run)


def test_rank_files_disagreeing_is_refused(rank_cases: Path, tmp_path: Path) -> None:  # noqa: F811
    run = tmp_path / "run"
    shutil.copytree(rank_cases / "verl", run)
    # rank 1's file where rank 0's should be: two files hold the same pieces
    shutil.copy(run / "model_world_size_2_rank_1.pt", run / "model_world_size_2_rank_0.pt")
    with pytest.raises(torchless.FormatError, match="the same piece"):
        torchless.load(run)


def test_global_size_is_limited(rank_cases: Path) -> None:  # noqa: F811
    with pytest.raises(torchless.LimitError,
                       match=r"max_tensor_bytes=100 exceeded: 168 \(emb\.weight\)"):
        torchless.open(rank_cases / "verl", limits=torchless.Limits(max_tensor_bytes=100))


@pytest.mark.parametrize("case", ["verl", "fsdp1"])
def test_rank_files_scan_clean(rank_cases: Path, case: str) -> None:  # noqa: F811
    """The torch.distributed records a DTensor or ShardedTensor pickles (spec, mesh,
    placements, shard metadata) are vetted plain data: every rank file scans clean."""
    report = torchless.scan(rank_cases / case)
    counts = report.counts()
    assert counts["clean"] == len(report.files) >= 2, counts
    assert report.ok and report.exit_code == 0
