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


@pytest.mark.parametrize("case", ["verl", "fsdp1", "placements"])
def test_rank_files_scan_clean(rank_cases: Path, case: str) -> None:  # noqa: F811
    """The torch.distributed records a DTensor or ShardedTensor pickles (spec, mesh,
    placements, shard metadata) are vetted plain data: every rank file scans clean."""
    report = torchless.scan(rank_cases / case)
    counts = report.counts()
    assert counts["clean"] == len(report.files) >= 2, counts
    assert report.ok and report.exit_code == 0


def _renamed(src: Path, dst: Path, pattern: str) -> Path:
    """The rank files of ``src`` (verl's naming) copied as ``pattern.format(R=rank)``."""
    dst.mkdir()
    for f in src.glob("model_world_size_2_rank_*.pt"):
        rank = int(f.stem.rsplit("_", 1)[1])
        shutil.copy(f, dst / pattern.format(R=rank))
    return dst


@pytest.mark.parametrize("pattern", ["rank{R}.pt", "model_rank{R}.pt", "shard_{R}.pt",
                                     "sharded_rank_{R}.pth", "state-0{R}.bin"])
@pytest.mark.parametrize("case", ["fsdp1", "verl"])
def test_rank_files_found_by_content_under_any_naming(rank_cases: Path,  # noqa: F811
                                                      tmp_path: Path, torch: Any,
                                                      pattern: str, case: str) -> None:
    """FSDP1's SHARDED_STATE_DICT (ShardedTensors) and FSDP2's DTensors saved per rank with
    torch.save under other names: the files whose names differ only in their last number,
    0 .. W-1, each naming DTensor or ShardedTensor, are one checkpoint."""
    from safetensors.torch import load_file

    run = _renamed(rank_cases / case, tmp_path / "run", pattern)
    (run / "notes.txt").write_text("a file that is no rank file\n")
    ref = load_file(str(rank_cases / f"{case}.ref.safetensors"))
    with torchless.open(run) as ckpt:
        assert ckpt.format == "ranks" and ckpt.info["naming"] == "by content"
        assert ckpt.info["world_size"] == 2
        assert set(ckpt.tensors) == set(ref)
        for name, want in ref.items():
            assert ckpt.tensors[name].numpy().tobytes() == _bytes(want, torch), name
    out = tmp_path / "model.safetensors"
    assert main(["convert", str(run), "-o", str(out), "--verify", "-q"]) == 0
    got = load_file(str(out))
    assert all(torch.equal(got[k], v) for k, v in ref.items()) and set(got) == set(ref)


def test_two_groups_of_rank_files(rank_cases: Path, tmp_path: Path,  # noqa: F811
                                  torch: Any) -> None:
    """model_rank{R}.pt beside optim_rank{R}.pt: the tree holds each group under its
    pattern, the tensors are the model's."""
    from safetensors.torch import load_file

    run = _renamed(rank_cases / "verl", tmp_path / "run", "model_rank{R}.pt")
    for f in (rank_cases / "verl").glob("optim_world_size_2_rank_*.pt"):
        shutil.copy(f, run / f"optim_rank{f.stem.rsplit('_', 1)[1]}.pt")
    ref = load_file(str(rank_cases / "verl.ref.safetensors"))
    with torchless.open(run) as ckpt:
        assert set(ckpt.tree) == {"model_rank{R}.pt", "optim_rank{R}.pt"}
        assert set(ckpt.tensors) == set(ref)
    moments = load_file(str(rank_cases / "verl.optim.ref.safetensors"))
    state = torchless.load(run)["optim_rank{R}.pt"]["state"]
    for key, want in moments.items():
        index, name = key.split(".")
        assert state[int(index)][name].tobytes() == _bytes(want, torch), key


def test_what_is_no_directory_of_rank_files(rank_cases: Path, tmp_path: Path,  # noqa: F811
                                            torch: Any) -> None:
    # plain state dicts numbered 0, 1 (epochs): no distributed tensor in them
    plain = tmp_path / "plain"
    plain.mkdir()
    for i in range(2):
        torch.save({"w": torch.zeros(3)}, plain / f"epoch{i}.pt")
    with pytest.raises(torchless.NotACheckpointError):
        torchless.open(plain)
    # a rank missing (0 and 2), and a rank named twice (1 and 01)
    for names in (("rank0.pt", "rank2.pt"), ("rank0.pt", "rank1.pt", "rank01.pt")):
        run = tmp_path / f"run{len(names)}"
        run.mkdir()
        files = sorted((rank_cases / "fsdp1").glob("*.pt"))
        for i, name in enumerate(names):
            shutil.copy(files[min(i, 1)], run / name)
        with pytest.raises(torchless.NotACheckpointError):
            torchless.open(run)
    # the model's rank 1 gone beside a complete optimizer group: not the optimizer alone
    run = _renamed(rank_cases / "verl", tmp_path / "optim", "model_rank{R}.pt")
    for f in (rank_cases / "verl").glob("optim_world_size_2_rank_*.pt"):
        shutil.copy(f, run / f"optim_rank{f.stem.rsplit('_', 1)[1]}.pt")
    (run / "model_rank1.pt").unlink()
    with pytest.raises(torchless.NotACheckpointError):
        torchless.open(run)


@pytest.mark.parametrize("case", ["fsdp1", "verl"])
def test_world_size_must_match_the_files(rank_cases: Path, tmp_path: Path,  # noqa: F811
                                         case: str) -> None:
    """Three files of pieces saved by two ranks: refused, the mesh (DTensor) or the rank a
    shard lies on (ShardedTensor) against the number of files."""
    run = _renamed(rank_cases / case, tmp_path / "run", "rank{R}.pt")
    # a third file holding rank 1's pieces
    shutil.copy(run / "rank1.pt", run / "rank2.pt")
    with pytest.raises(torchless.FormatError,
                       match="mesh of 2 ranks .* holds 3 rank files" if case == "verl" else
                       "the same piece"):
        torchless.load(run)


def test_strided_shard_assembled_partial_refused(rank_cases: Path, tmp_path: Path,  # noqa: F811
                                                 torch: Any,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``_StridedShard`` DTensors (FSDP2 + TP's placement) put together as torch's
    ``full_tensor()``; a ``Partial`` one refused by name, saying it needs a reduction."""
    from safetensors.torch import load_file

    ref = load_file(str(rank_cases / "placements.ref.safetensors"))
    run = rank_cases / "placements"
    with torchless.open(run) as ckpt:
        assert ckpt.info["distributed_tensors"] == len(ref) == 4
        for name, want in ref.items():
            got = ckpt.tensors[name]
            assert got.shape == tuple(want.shape), name
            assert got.numpy().tobytes() == _bytes(want, torch), name
        why = ckpt.unsupported["partial"]
        assert "Partial(sum)" in why and "reduction" in why, why
        with pytest.raises(UnsupportedError, match="Partial"):
            ckpt.numpy("partial")
    out = tmp_path / "model.safetensors"
    assert main(["convert", str(run), "-o", str(out)]) == 1
    assert "partial" in capsys.readouterr().err and not out.exists()
    assert main(["convert", str(run), "-o", str(out), "--skip-unsupported", "-q"]) == 0
    got = load_file(str(out))
    assert set(got) == set(ref) and all(torch.equal(got[k], v) for k, v in ref.items())
