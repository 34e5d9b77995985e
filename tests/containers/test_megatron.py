"""Megatron-Core ``torch_dist`` directories (:mod:`tests._rankgen` writes one the way
Megatron-Core's ``dist_checkpointing.save`` does, TP=2): ``load`` is ``common.pt``'s state
with the sharded state merged in, as Megatron's loader merges it; the tensors equal torch's
``full_tensor()``; the directory scans clean, its standard files included."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import torchless
from tests._rankfixture import rank_cases  # noqa: F401 - the session fixture
from tests._rankgen import fake_megatron
from torchless.containers.megatron import merge
from torchless.errors import FormatError, StorageError


def test_load_merges_common_pt(rank_cases: Path, torch: Any) -> None:  # noqa: F811
    tree = torchless.load(rank_cases / "megatron")
    fake_megatron()  # the args' AttnBackend enum, for torch.load
    common = torch.load(rank_cases / "megatron" / "common.pt", weights_only=False)
    full = torch.load(rank_cases / "megatron.full.pt")
    assert set(tree) == set(common) | set(full) | {"rng_state/shard_0.0_1.2",
                                                   "rng_state/shard_0.1_1.2"}
    assert vars(tree["args"]).keys() == vars(common["args"]).keys()
    assert tree["args"].num_layers == common["args"].num_layers == 2
    assert common["args"].attention_backend.value == 5  # an enum: torchless keeps a record
    assert "AttnBackend" in repr(tree["args"].attention_backend)
    for key in ("iteration", "checkpoint_version", "opt_param_scheduler",
                "num_floating_point_operations_so_far"):
        assert tree[key] == common[key], key
    for key, want in full.items():
        got = tree[key]
        assert str(want.dtype).removeprefix("torch.") == (
            "bfloat16" if got.dtype.name == "bfloat16" else str(got.dtype)), key
        assert got.shape == tuple(want.shape), key
        assert got.tobytes() == want.contiguous().view(torch.uint8).numpy().tobytes(), key
    # each rank's ShardedObject: torch.save of the list of its data, read as saved
    rank1 = tree["rng_state/shard_0.1_1.2"][0][0]
    assert rank1["random_rng_state"] == (3, (0, 1, 2, 3), None)
    assert np.array_equal(rank1["torch_rng_state"], np.arange(1, 5, dtype=np.uint8))


def test_info_names_megatron(rank_cases: Path) -> None:  # noqa: F811
    with torchless.open(rank_cases / "megatron") as ckpt:
        assert ckpt.format == "dcp"
        assert ckpt.info["megatron"] == {"sharded_backend": "torch_dist",
                                         "common": "common.pt"}
        assert ckpt.info["era"].startswith("Megatron-Core dist checkpoint (torch_dist")


def test_run_directory_opens_the_tracked_save(rank_cases: Path) -> None:  # noqa: F811
    run = rank_cases / "megatron_run"
    with torchless.open(run) as ckpt, torchless.open(rank_cases / "megatron") as save:
        assert ckpt.info["layout"] == "megatron-dist" and ckpt.format == "dcp"
        assert list(ckpt.tensors) == list(save.tensors)
        for name, t in save.tensors.items():
            assert ckpt.tensors[name].numpy().tobytes() == t.numpy().tobytes(), name
    assert torchless.load(run)["iteration"] == 10
    report = torchless.scan(run)
    assert report.ok and report.counts()["clean"] == 1, report.files


def test_mcore_metadata(rank_cases: Path, torch: Any) -> None:  # noqa: F811
    """Megatron-Core 0.15's .metadata (MCoreMetadata: DCP's Metadata plus mcore_data) reads
    and scans as DCP's own (the same tensors, torch's full_tensor())."""
    full = torch.load(rank_cases / "megatron.full.pt")
    with torchless.open(rank_cases / "megatron_mcore_metadata") as ckpt:
        for key, want in full.items():
            assert ckpt.tensors[key].numpy().tobytes() == \
                want.contiguous().view(torch.uint8).numpy().tobytes(), key
    assert torchless.scan(rank_cases / "megatron_mcore_metadata").ok


def test_scans_clean(rank_cases: Path) -> None:  # noqa: F811
    """common.pt (its args hold Megatron's AttnBackend enum, vetted) and metadata.json are
    the standard files: the directory scans clean."""
    report = torchless.scan(rank_cases / "megatron")
    assert report.ok and report.exit_code == 0, report.files
    assert report.counts()["clean"] == 1


def test_common_pt_missing(rank_cases: Path, tmp_path: Path) -> None:  # noqa: F811
    run = tmp_path / "run"
    shutil.copytree(rank_cases / "megatron", run)
    (run / "common.pt").unlink()
    with pytest.raises(StorageError, match=r"common\.pt is missing"):
        torchless.load(run)
    # without Megatron's metadata.json it is the plain DCP directory it then is
    (run / "metadata.json").unlink()
    assert "iteration" not in torchless.load(run)


def test_common_pt_not_a_checkpoint_is_an_anomaly(rank_cases: Path,  # noqa: F811
                                                  tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(rank_cases / "megatron", run)
    (run / "common.pt").write_bytes(b"not a checkpoint at all")
    report = torchless.scan(run)
    assert not report.ok
    assert any("common.pt" in str(a) for a in report.files[0].anomalies)


def test_merge_is_megatrons() -> None:
    """dict_utils.merge: dicts key by key, equal-length lists item by item, a value on both
    sides refused (hand-made inputs: what the Megatron source says it does)."""
    assert merge({"a": 1, "b": {"x": 1}}, {"b": {"y": 2}, "c": 3}) == {
        "a": 1, "b": {"x": 1, "y": 2}, "c": 3}
    assert merge([{"a": 1}], [{"b": 2}]) == [{"a": 1, "b": 2}]
    with pytest.raises(FormatError, match="lengths 1 and 2"):
        merge({"l": [1]}, {"l": [1, 2]})
    with pytest.raises(FormatError, match=r"both hold a value at \['iteration'\]"):
        merge({"iteration": 1}, {"iteration": 2})


def test_legacy_directory_opens_per_rank(rank_cases: Path, torch: Any) -> None:  # noqa: F811
    """``--ckpt-format torch`` (TP=2): each rank's file as torch.load reads it, under its
    rank directory's name; the partitions listed, none merged (no split axis is saved)."""
    root = rank_cases / "megatron_legacy"
    for path in (root, root / "iter_0000010"):  # the tracker file, or the iteration
        with torchless.open(path) as ckpt:
            assert ckpt.format == "megatron-legacy"
            assert (ckpt.info["iteration"], ckpt.info["tensor_parallel"],
                    ckpt.info["pipeline_parallel"]) == (10, 2, 1)
            for rank in ("mp_rank_00", "mp_rank_01"):
                want = torch.load(root / "iter_0000010" / rank / "model_optim_rng.pt",
                                  weights_only=False)
                for name, t in want["model"].items():
                    got = ckpt.tensors[f"{rank}.model.{name}"].numpy()
                    assert got.tobytes() == t.numpy().tobytes(), (rank, name)
            parts = ckpt.info["partitions"]
            assert parts["decoder.layers.0.self_attention.linear_proj.weight"] == [[8, 6],
                                                                                  [8, 6]]
            assert parts["decoder.final_layernorm.weight"] == [[8], [8]]
            assert ckpt.info["unplaced"] == sorted(parts)
            assert "not merged" in ckpt.info["era"]
    tree = torchless.load(root)
    assert set(tree) == {"mp_rank_00", "mp_rank_01"}
    assert tree["mp_rank_01"]["iteration"] == 10
    assert torchless.scan(root).ok
