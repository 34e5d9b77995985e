"""DeepSpeed ZeRO checkpoint directories (stages 1-3, fp32 and bf16, 2 ranks; three of them
with 4 ranks), written by DeepSpeed itself (:mod:`tests._zerogen`, once a session each):
the consolidated weights equal
zero_to_fp32's byte for byte, ``convert`` writes the file ``zero_to_fp32
--safe_serialization`` writes (but for the source name in ``__metadata__``), the moments are
reachable by name, and a rank file opened alone says what to open instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import torchless
from tests.conftest import REPO, require
from tests.conversion.test_convert import parse
from torchless.cli.main import main
from torchless.errors import MissingFileError, NotACheckpointError

CASES = ("z1", "z2", "z3", "z1_bf16", "z2_bf16", "z3_bf16")
#: written with 4 ranks: every stage, ZeRO-1 through DeepSpeed's BF16_Optimizer, ZeRO-3 bf16
CASES4 = ("z1_bf16", "z2", "z3_bf16")


def _generate(tmp_path_factory: pytest.TempPathFactory, name: str, *args: str) -> Path:
    require("torch")
    require("deepspeed")
    out = tmp_path_factory.getbasetemp() / name
    if (out / "done").is_file():
        return out
    out.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "DS_ACCELERATOR": "cpu"}
    run = subprocess.run([sys.executable, "-m", "tests._zerogen", str(out), *args], env=env,
                         capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def zero_cases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _generate(tmp_path_factory, "zero-cases")


@pytest.fixture(scope="session")
def zero4_cases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One spawn of four gloo ranks for every 4-rank test; its z2 saved at steps 1 and 2."""
    return _generate(tmp_path_factory, "zero4-cases", "--world", "4", *CASES4)


def _reference(path: Path) -> dict[str, np.ndarray[Any, Any]]:
    from safetensors.numpy import load_file

    return load_file(str(path))


def _check_equal_zero_to_fp32(zero_cases: Path, case: str, world: int) -> None:
    ref = _reference(zero_cases / f"{case}.ref.safetensors")
    with torchless.open(zero_cases / case) as ckpt:
        assert ckpt.format == "zero"
        assert ckpt.info["zero_stage"] == int(case[1]) and ckpt.info["world_size"] == world
        assert len(ckpt.info["optim_files"]) == world
        got = {k: t.numpy() for k, t in ckpt.tensors.items()}
        extra = sorted(set(got) - set(ref))
        for name, want in ref.items():
            assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
            assert got[name].tobytes() == want.tobytes(), name
        if case.startswith("z1"):
            # ZeRO-1 records no frozen parameters: zero_to_fp32 leaves them out, torchless
            # keeps them as the module saved them (float32)
            assert extra == ["frozen.bias", "frozen.weight"]
            with torchless.open(zero_cases / case / "global_step2" /
                                "mp_rank_00_model_states.pt") as states:
                for name in extra:
                    saved = states.tensors[f"module.{name}"].numpy()
                    assert got[name].tobytes() == saved.astype(np.float32).tobytes()
        else:
            assert extra == []
        # the trainable weights are views of the partitions or stream their pieces
        assert got["head.weight"].tobytes() == got["emb.weight"].tobytes()


@pytest.mark.parametrize("case", CASES)
def test_tensors_equal_zero_to_fp32(zero_cases: Path, case: str) -> None:
    _check_equal_zero_to_fp32(zero_cases, case, 2)


@pytest.mark.parametrize("case", CASES4)
def test_four_ranks_equal_zero_to_fp32(zero4_cases: Path, case: str) -> None:
    _check_equal_zero_to_fp32(zero4_cases, case, 4)


def test_four_ranks_convert_and_verify(zero4_cases: Path, tmp_path: Path) -> None:
    for case in CASES4:
        out = tmp_path / f"{case}.safetensors"
        assert main(["convert", str(zero4_cases / case), "-o", str(out), "--verify",
                     "-q"]) == 0
        if case != "z1_bf16":  # (ZeRO-1: torchless keeps the frozen parameters too)
            assert parse(out)[2] == parse(zero4_cases / f"{case}.ref.safetensors")[2], case
    tree = torchless.load(zero4_cases / "z3_bf16")
    moments = tree["optimizer"]["state"]
    assert moments["body.weight"]["exp_avg"].shape == (7, 6)


def test_tag_picks_a_save(zero4_cases: Path, tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    """``tag=`` / ``--tag``: the save zero_to_fp32 ``-t global_step1`` reads; by default the
    one ``latest`` names; an unknown tag refused by name, with the tags present."""
    run = zero4_cases / "z2"
    old = parse(zero4_cases / "z2.global_step1.ref.safetensors")[2]
    new = parse(zero4_cases / "z2.ref.safetensors")[2]
    assert old != new  # a step apart
    with torchless.open(run, tag="global_step1") as ckpt:
        assert ckpt.info["tag"] == "global_step1"
        assert ckpt.info["tags"] == ["global_step1", "global_step2"]
        ref = _reference(zero4_cases / "z2.global_step1.ref.safetensors")
        assert all(ckpt.tensors[k].numpy().tobytes() == v.tobytes() for k, v in ref.items())
    assert torchless.load(run, tag="global_step1")["global_steps"] == 1
    assert torchless.load(run)["global_steps"] == 2
    out = tmp_path / "old.safetensors"
    assert main(["convert", str(run), "--tag", "global_step1", "-o", str(out), "-q"]) == 0
    assert parse(out)[2] == old
    torchless.convert(run, tmp_path / "new.safetensors")
    assert parse(tmp_path / "new.safetensors")[2] == new
    assert main(["verify", str(run), str(out), "-t", "global_step1", "-q"]) == 0
    assert main(["verify", str(run), str(out), "-q"]) == 1  # latest: step 2
    assert main(["inspect", str(run), "--tag", "global_step1", "--json"]) == 0
    assert '"global_step1"' in capsys.readouterr().out
    with pytest.raises(MissingFileError, match=r"'global_step9'.*global_step1, global_step2"):
        torchless.open(run, tag="global_step9")
    for bad in ("../z2", ".", "latest"):
        with pytest.raises(MissingFileError, match="tags present"):
            torchless.open(run, tag=bad)
    with pytest.raises(NotACheckpointError, match="not the run directory"):
        torchless.open(run / "global_step2", tag="global_step2")
    bad_out = tmp_path / "bad.safetensors"
    assert main(["convert", str(run), "--tag", "global_step9", "-o", str(bad_out)]) == 1
    assert "global_step1, global_step2" in capsys.readouterr().err
    assert not bad_out.exists()
    # a run directory whose latest file is gone: a tag still picks a save
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "global_step1").symlink_to(run / "global_step1")
    with torchless.open(bare, tag="global_step1") as ckpt:
        assert ckpt.info["world_size"] == 4


@pytest.mark.parametrize("case", ["z2", "z3_bf16"])
def test_convert_writes_what_zero_to_fp32_writes(zero_cases: Path, tmp_path: Path,
                                                 case: str) -> None:
    out = tmp_path / "model.safetensors"
    assert main(["convert", str(zero_cases / case), "-o", str(out), "--verify"]) == 0
    ours, _, data = parse(out)
    theirs, _, ref_data = parse(zero_cases / f"{case}.ref.safetensors")
    assert ours.pop("__metadata__") == {"format": "pt", "source": case}
    assert theirs.pop("__metadata__") == {"format": "pt"}
    assert ours == theirs and data == ref_data
    # the tag directory itself, and --tag's directory, read the same
    again = tmp_path / "again.safetensors"
    torchless.convert(zero_cases / case / "global_step2", again)
    assert parse(again)[2] == ref_data
    shards = tmp_path / "shards"
    assert main(["convert", str(zero_cases / case), "-o", str(shards),
                 "--max-shard-size", "600B"]) == 0
    index = tmp_path / "shards.safetensors.index.json"
    assert len(list(tmp_path.glob("shards-0000?-of-00002.safetensors"))) == 2
    assert main(["verify", str(zero_cases / case), str(index)]) == 0


@pytest.mark.parametrize("case", ["z2", "z3"])
def test_load_gives_model_states_and_moments(zero_cases: Path, case: str) -> None:
    torch = require("torch")
    tree = torchless.load(zero_cases / case)
    assert tree["global_steps"] == 2 and tree["epoch"] == 1 and tree["note"] == "tiny"
    assert tree["ds_version"] == "0.19.8"
    ref = _reference(zero_cases / f"{case}.ref.safetensors")
    assert all(tree["module"][k].tobytes() == v.tobytes() for k, v in ref.items())
    # the moments, cut like the weights: for each group, its parameters' moments in order
    # are the ranks' flat moments end to end (ZeRO-2), or each rank's share of every
    # parameter in turn (ZeRO-3), by the spec of zero_to_fp32's layout
    key = "base_optimizer_state" if case == "z2" else "optimizer_state_dict"
    files = sorted((zero_cases / case / "global_step2").glob("*_optim_states.pt"))
    flats = [torch.load(f, weights_only=False)["optimizer_state_dict"][key]["state"]
             for f in files]
    states = torchless.open(zero_cases / case / "global_step2" /
                            "mp_rank_00_model_states.pt") if case == "z2" else None
    groups = (torch.load(zero_cases / case / "global_step2" /
                         ("mp_rank_00_model_states.pt" if case == "z2" else
                          "zero_pp_rank_0_mp_rank_00_model_states.pt"),
                         weights_only=False)["param_shapes"])
    if states is not None:
        states.close()
    moments = tree["optimizer"]["state"]
    for g, shapes in enumerate(groups):
        for m in ("exp_avg", "exp_avg_sq"):
            if case == "z2":
                whole = torch.cat([f[g][m] for f in flats]).numpy()
                ours = np.concatenate([moments[n][m].reshape(-1) for n in shapes])
                assert ours.tobytes() == whole[:ours.size].tobytes()
            else:
                for n, shape in shapes.items():
                    assert moments[n][m].shape == tuple(shape)
    assert set(moments) == {n for s in groups for n in s}


def test_rank_files_alone_say_what_to_open(zero_cases: Path, tmp_path: Path) -> None:
    tag = zero_cases / "z3" / "global_step2"
    for name in ("zero_pp_rank_0_mp_rank_00_model_states.pt",
                 "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
                 if (tag / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt").exists()
                 else "zero_pp_rank_1_mp_rank_00_optim_states.pt"):
        with pytest.raises(NotACheckpointError, match="open its directory") as e:
            torchless.open(tag / name)
        assert str(tag) in (e.value.hint or "")
    # a ZeRO-3 model-states file is never converted into zero-element tensors
    out = tmp_path / "bad.safetensors"
    assert main(["convert", str(tag / "zero_pp_rank_0_mp_rank_00_model_states.pt"),
                 "-o", str(out)]) == 1
    assert not out.exists()
    # ZeRO-1/2's model-states file is a whole module state dict: it opens as the torch
    # file it is
    with torchless.open(zero_cases / "z2" / "global_step2" / "mp_rank_00_model_states.pt"
                        ) as states:
        assert "module.emb.weight" in states.tensors


@pytest.mark.parametrize("case", ["z1", "z3_bf16"])
def test_rank_files_scan_clean(zero_cases: Path, case: str) -> None:
    """DeepSpeed's own partition records (the loss scaler, the ZeRO stage enum, fragment
    addresses) are plain data: every file of a run DeepSpeed wrote scans clean."""
    report = torchless.scan(zero_cases / case)
    counts = report.counts()
    # the model states and two optimizer partitions at least; nothing else but skipped files
    # (``latest``, DeepSpeed's zero_to_fp32.py)
    assert counts["clean"] >= 3, counts
    assert counts["clean"] + counts["skipped"] == len(report.files), counts
    assert report.ok and report.exit_code == 0
