"""DeepSpeed ZeRO checkpoint directories (stages 1-3, fp32 and bf16, 2 ranks), written by
DeepSpeed itself (:mod:`tests._zerogen`, once a session): the consolidated weights equal
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
from torchless.errors import NotACheckpointError

CASES = ("z1", "z2", "z3", "z1_bf16", "z2_bf16", "z3_bf16")


@pytest.fixture(scope="session")
def zero_cases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require("torch")
    require("deepspeed")
    out = tmp_path_factory.getbasetemp() / "zero-cases"
    if (out / "done").is_file():
        return out
    out.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "DS_ACCELERATOR": "cpu"}
    run = subprocess.run([sys.executable, "-m", "tests._zerogen", str(out)], env=env,
                         capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return out


def _reference(path: Path) -> dict[str, np.ndarray[Any, Any]]:
    from safetensors.numpy import load_file

    return load_file(str(path))


@pytest.mark.parametrize("case", CASES)
def test_tensors_equal_zero_to_fp32(zero_cases: Path, case: str) -> None:
    ref = _reference(zero_cases / f"{case}.ref.safetensors")
    with torchless.open(zero_cases / case) as ckpt:
        assert ckpt.format == "zero"
        assert ckpt.info["zero_stage"] == int(case[1]) and ckpt.info["world_size"] == 2
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
