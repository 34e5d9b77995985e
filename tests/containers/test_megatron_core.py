"""A ``torch_dist`` directory Megatron-Core itself wrote (tests/data/megatron_core_tp2/,
made by ``tests/gen_megatron_core.py`` with megatron-core 0.16.1: a two-layer GPTModel,
tensor_model_parallel_size=2, saved on CPU by two gloo processes). The expected values in
its ``expected.json`` come from torch's DCP reader (``dcp_to_torch_save``) and from
Megatron-Core's own ``dist_checkpointing.load`` into the model built with TP=1, both run
when the directory was written."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

import torchless

DIR = Path(__file__).resolve().parent.parent / "data" / "megatron_core_tp2"
EXPECTED: dict[str, Any] = json.loads((DIR / "expected.json").read_text())


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def test_tensors_equal_torchs_dcp_reader() -> None:
    want = EXPECTED["tensors"]
    with torchless.open(DIR) as ckpt:
        assert ckpt.format == "dcp"
        assert ckpt.info["megatron"] == {"sharded_backend": "torch_dist", "common": "common.pt"}
        assert sorted(ckpt.tensors) == sorted(want)
        for name, w in want.items():
            t = ckpt.tensors[name]
            assert t.dtype.name == w["dtype"], name
            assert list(t.shape) == w["shape"], name
            assert _sha(t.numpy()) == w["sha256"], name


def test_tensors_equal_megatrons_tp1_load() -> None:
    """Each weight Megatron's loader gives the TP=1 model (``decoder.layers.0...``) is the
    layer of torchless's stacked tensor its ShardedTensor key and offset name."""
    want = EXPECTED["megatron_load_tp1"]
    assert len(want) == 29
    with torchless.open(DIR) as ckpt:
        assert {w["key"] for w in want.values()} == set(ckpt.tensors)
        for name, w in want.items():
            got = ckpt.tensors[w["key"]].numpy()[tuple(w["index"])]
            assert list(got.shape) == w["shape"], name
            assert _sha(got) == w["sha256"], name


def test_load_and_scan() -> None:
    tree = torchless.load(DIR)  # common.pt is {} for a model-only save
    names = set(EXPECTED["tensors"]) | set(EXPECTED["objects"])
    assert set(tree) == names
    for name in EXPECTED["objects"]:  # TransformerEngine-less layers' _extra_state
        assert tree[name] == [None], name
    report = torchless.scan(DIR)  # .metadata holds Megatron's all_local_plans (SavePlan)
    assert report.ok and report.counts()["clean"] == 1, report.files


def test_convert_writes_the_same_bytes(tmp_path: Path) -> None:
    torchless.convert(DIR, tmp_path / "model.safetensors")
    with torchless.open(tmp_path / "model.safetensors") as out:
        assert sorted(out.tensors) == sorted(EXPECTED["tensors"])
        for name, w in EXPECTED["tensors"].items():
            assert _sha(out.tensors[name].numpy()) == w["sha256"], name
