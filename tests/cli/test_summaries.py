"""Per-library summaries (``cli/summaries``) against hand-written lines, on trees shaped as
each library's own save code lays its checkpoint out (the source of each layout is cited at
its test); and through ``inspect`` on files torch wrote with those keys."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from torchless.cli.main import main
from torchless.cli.summaries import LIBRARIES, Seen, structures
from torchless.pickle.values import Global, Opaque


def _record(class_path: str, state: dict[str, Any]) -> Opaque:
    module, name = class_path.rsplit(".", 1)
    record = Opaque(Global(module, name), (), newobj=True)
    record.state = state
    return record


def _module(class_path: str, **attrs: Any) -> Opaque:
    """A pickled nn.Module as the loaded tree keeps one left whole: its ``__dict__``."""
    return _record(class_path, {"training": False, "_parameters": {}, "_buffers": {},
                                "_modules": {}, **attrs})


def test_ultralytics_final_checkpoint() -> None:
    """ultralytics/engine/trainer.py ``save_model`` keys, after ``strip_optimizer``
    (ultralytics/utils/torch_utils.py): epoch -1, the EMA moved to ``model``; the model a
    ``DetectionModel`` with the attributes ``set_model_attributes`` gives it."""
    model = _module("ultralytics.nn.tasks.DetectionModel",
                    yaml={"nc": 2, "scales": {}, "yaml_file": "yolo11n.yaml"},
                    names={0: "cat", 1: "dog"}, nc=2,
                    args={"task": "detect", "imgsz": 640})
    tree = {"epoch": -1, "best_fitness": 0.4125, "model": model, "ema": None,
            "updates": None, "optimizer": None,
            "train_args": {"task": "detect", "mode": "train", "model": "yolo11n.yaml",
                           "data": "coco8.yaml", "epochs": 3, "batch": 16, "imgsz": 640},
            "train_metrics": {"metrics/mAP50(B)": 0.5}, "date": "2026-12-02T10:00:00",
            "version": "8.3.40"}
    assert structures(tree, "") == [
        ("ultralytics", "Ultralytics checkpoint (ultralytics 8.3.40): task='detect', nc=2, "
                        "epoch=-1, best_fitness=0.4125, imgsz=640"),
        ("ultralytics", "model: <ultralytics.nn.tasks.DetectionModel>, yaml 'yolo11n.yaml'"),
        ("ultralytics", "names: 0='cat', 1='dog'"),
        ("ultralytics", "train_args: task='detect', mode='train', model='yolo11n.yaml', "
                        "data='coco8.yaml', epochs=3, batch=16, imgsz=640"),
    ]


def test_ultralytics_without_module_attributes() -> None:
    """The same keys with the model as a state dict (``modules="state_dict"``): the task
    and size still come from ``train_args``, nc from nothing (not guessed)."""
    tree = {"epoch": 5, "best_fitness": None, "model": {"model.0.conv.weight": 0},
            "ema": None, "train_args": {"task": "segment", "imgsz": 320}, "version": "8.0.0"}
    assert structures(tree, "") == [
        ("ultralytics", "Ultralytics checkpoint (ultralytics 8.0.0): task='segment', "
                        "epoch=5, imgsz=320"),
        ("ultralytics", "train_args: task='segment', imgsz=320"),
    ]


def test_timm_checkpoint_saver() -> None:
    """timm/utils/checkpoint_saver.py ``CheckpointSaver._save``: epoch, arch, state_dict,
    optimizer, version 2, args, the scaler's state, state_dict_ema, metric."""
    args = argparse.Namespace(model="resnet18", lr=0.1)
    tree = {"epoch": 7, "arch": "resnet18", "state_dict": {"fc.weight": 0},
            "optimizer": {"state": {}, "param_groups": [{"params": [0], "lr": 0.1}]},
            "version": 2, "args": args, "amp_scaler": {"scale": 65536.0},
            "state_dict_ema": {"fc.weight": 0}, "metric": 71.25}
    found = structures(tree, "")
    assert found[0] == ("timm", "timm checkpoint: arch='resnet18', epoch=7, metric=71.25; "
                                "EMA present (state_dict_ema)")
    assert ("config", "args (Namespace): model='resnet18', lr=0.1") in found
    assert not [k for k, _ in found if k == "progress"]  # the timm line says the epoch
    del tree["state_dict_ema"], tree["metric"]
    assert structures(tree, "")[0] == ("timm", "timm checkpoint: arch='resnet18', epoch=7; "
                                               "no EMA")


def test_timm_model_saved_whole() -> None:
    """timm models carry ``pretrained_cfg`` (timm/models/_builder.py
    ``build_model_with_cfg`` sets ``model.pretrained_cfg``)."""
    tree = _module("timm.models.resnet.ResNet", num_classes=10,
                   pretrained_cfg={"architecture": "resnet18", "tag": "a1_in1k",
                                   "num_classes": 1000, "input_size": (3, 224, 224),
                                   "mean": (0.485, 0.456, 0.406)})
    assert structures(tree, "")[0] == (
        "timm", "timm model <timm.models.resnet.ResNet>: pretrained_cfg "
                "architecture='resnet18', tag='a1_in1k', num_classes=1000, "
                "input_size=(3, 224, 224)")


def test_hf_model_saved_whole() -> None:
    """``torch.save(model)`` of a PreTrainedModel: ``config`` is a PretrainedConfig, whose
    ``__dict__`` holds ``architectures`` and ``model_type`` (configuration_utils.py)."""
    config = _record("transformers.models.gpt2.configuration_gpt2.GPT2Config",
                     {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                      "vocab_size": 50257, "n_embd": 768})
    tree = _module("transformers.models.gpt2.modeling_gpt2.GPT2LMHeadModel", config=config)
    assert structures(tree, "")[0] == (
        "hf", "HF model <transformers.models.gpt2.modeling_gpt2.GPT2LMHeadModel>: config "
              "<transformers.models.gpt2.configuration_gpt2.GPT2Config> "
              "architectures=['GPT2LMHeadModel'], model_type='gpt2', vocab_size=50257")


def test_hf_trainer_directory(tmp_path: Path) -> None:
    """``Trainer._save_checkpoint`` writes trainer_state.json (TrainerState.save_to_json)
    and the model's config.json into ``checkpoint-N/``."""
    (tmp_path / "trainer_state.json").write_text(
        '{"global_step": 500, "epoch": 1.0, "best_metric": null, "log_history": []}')
    (tmp_path / "config.json").write_text(
        '{"architectures": ["BertForMaskedLM"], "model_type": "bert", "vocab_size": 30522}')
    found = structures({"state": {}}, str(tmp_path / "optimizer.pt"))
    assert found == [
        ("trainer_state", "HF Trainer state (trainer_state.json): global_step=500, "
                          "epoch=1, best_metric=None; 0 log entries"),
        ("trainer_state", "HF config (config.json): architectures=['BertForMaskedLM'], "
                          "model_type='bert', vocab_size=30522"),
    ]


def test_stable_diffusion_ckpt() -> None:
    """CompVis ldm/models/diffusion/ddpm.py ``LatentDiffusion``: ``model.diffusion_model``
    (the UNet, wrapped by DiffusionWrapper), ``first_stage_model``, ``cond_stage_model``,
    ``model_ema`` (LitEma: ``decay``, ``num_updates`` and the UNet's names without dots),
    saved by Lightning with ``global_step``."""
    sd = {"betas": 0, "model.diffusion_model.input_blocks.0.0.weight": 0,
          "model.diffusion_model.out.2.bias": 0, "first_stage_model.encoder.conv_in.weight": 0,
          "cond_stage_model.transformer.text_model.embeddings.position_ids": 0,
          "model_ema.decay": 0, "model_ema.num_updates": 0,
          "model_ema.diffusion_modelinput_blocks00weight": 0}
    tree = {"state_dict": sd, "global_step": 470000, "epoch": 6,
            "pytorch-lightning_version": "1.4.2"}
    assert structures(tree, "")[:2] == [
        ("ldm", "Stable Diffusion (ldm) checkpoint: UNet model.diffusion_model (2 entries), "
                "VAE first_stage_model (1 entries), text encoder cond_stage_model "
                "(1 entries); EMA present (model_ema, 3 entries); global_step 470000"),
        ("lightning", "Lightning checkpoint (lightning 1.4.2): epoch 6, global_step 470000"),
    ]
    pruned = {k: v for k, v in sd.items() if not k.startswith("model_ema.")}
    assert structures(pruned, "")[0][1].endswith("(1 entries); no EMA")


def test_rvc_voice_model() -> None:
    """RVC infer/lib/train/process_ckpt.py ``savee``: weight, config (a list), info, sr,
    f0, version."""
    tree = {"weight": {"emb_g.weight": 0, "dec.conv_pre.weight": 0},
            "config": [1025, 32, 192, 192, 768, 2, 6, 3, 0, "1", [3, 7, 11], 109, 256, 40000],
            "info": "20epoch", "sr": "40k", "f0": 1, "version": "v2"}
    assert structures(tree, "") == [
        ("rvc", "RVC voice model: sr='40k', f0=1, version='v2', info='20epoch'; 2 weights")]


def test_deepspeed_files() -> None:
    """deepspeed/runtime/engine.py ``_save_checkpoint`` (model states) and
    ``_save_zero_checkpoint`` (``optimizer_state_dict`` with zero_stage and
    partition_count, from stage_1_and_2.py ``state_dict``)."""
    model_states = {"module": {"w": 0}, "buffer_names": [], "optimizer": None,
                    "lr_scheduler": None, "skipped_steps": 0, "global_steps": 10,
                    "global_samples": 80, "dp_world_size": 2, "mp_world_size": 1,
                    "ds_config": {"train_batch_size": 8}, "ds_version": "0.16.4"}
    assert structures(model_states, "")[0] == (
        "deepspeed", "DeepSpeed model states (deepspeed 0.16.4): global_steps=10, "
                     "global_samples=80, skipped_steps=0, dp_world_size=2, mp_world_size=1")
    optim = {"optimizer_state_dict": {"loss_scaler": None, "zero_stage": 2,
                                      "partition_count": [2], "overflow": False},
             "ds_config": {}, "ds_version": "0.16.4"}
    assert structures(optim, "") == [
        ("deepspeed", "DeepSpeed optimizer states (deepspeed 0.16.4): zero_stage=2, "
                      "partition_count=[2]")]
    zero = structures({"w": 0}, "", {"zero_stage": 3, "world_size": 4, "tag": "global_step10"},
                      "zero")
    assert zero == [("deepspeed", "DeepSpeed ZeRO checkpoint: stage=3, world_size=4, "
                                  "tag='global_step10'")]
    # a run of several saves names them (what --tag picks from)
    zero = structures({"w": 0}, "", {"zero_stage": 2, "world_size": 2, "tag": "global_step2",
                                     "tags": ["global_step1", "global_step2"]}, "zero")
    assert zero[0][1].endswith("tag='global_step2', saves='global_step1 global_step2'")


def test_megatron_rank_file() -> None:
    """megatron/training/checkpointing.py: args, checkpoint_version 3.0, iteration, model,
    one file per rank under ``iter_NNNNNNN/mp_rank_TT_PPP/model_optim_rng.pt``."""
    args = argparse.Namespace(tensor_model_parallel_size=2, pipeline_model_parallel_size=4)
    tree = {"args": args, "checkpoint_version": 3.0, "iteration": 100, "model": {},
            "rng_state": []}
    path = "/ckpt/iter_0000100/mp_rank_01_003/model_optim_rng.pt"
    assert structures(tree, path)[0] == (
        "megatron", "Megatron checkpoint (version 3.0): iteration=100, TP=2, PP=4; this "
                    "file: tensor rank 1, pipeline rank 3")


def test_plain_progress_only_when_no_library_spoke() -> None:
    assert structures({"epoch": 2, "step": 9}, "") == [
        ("progress", "training progress: epoch=2, step=9")]
    assert structures({"weight": np.zeros(2)}, "") == []


def test_registry_summaries_never_break_on_odd_shapes() -> None:
    """Each library's summary on values that only look like its keys: lines or nothing."""
    odd: list[Any] = [None, 5, [], {}, {"train_args": 3, "model": 4, "best_fitness": []},
                      {"arch": 1, "state_dict": 2, "epoch": 3},
                      {"weight": {}, "sr": [], "config": None},
                      {"checkpoint_version": "x", "args": 1},
                      {"ds_version": 1, "optimizer_state_dict": 5, "module": 0},
                      _module("a.B", config=5, pretrained_cfg=[1], names=7, yaml=2)]
    for tree in odd:
        for summary in LIBRARIES:
            for kind, text in summary(Seen(tree, "x/y", "dcp", {"shards": 3})):
                assert isinstance(kind, str) and isinstance(text, str)


@pytest.mark.torch
def test_inspect_yolo_file_no_longer_says_epoch_minus_one(
        torch: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file torch wrote with the keys of an ultralytics ``best.pt`` (the model as a state
    dict here: ultralytics is not installed)."""
    path = tmp_path / "best.pt"
    torch.save({"epoch": -1, "best_fitness": 0.5, "model": {"w": torch.zeros(2)},
                "ema": None, "updates": None, "optimizer": None,
                "train_args": {"task": "detect", "imgsz": 640}, "version": "8.3.0"}, path)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert ("Ultralytics checkpoint (ultralytics 8.3.0): task='detect', epoch=-1, "
            "best_fitness=0.5, imgsz=640") in out
    assert "training progress" not in out


@pytest.mark.torch
def test_inspect_dcp_directory(torch: ModuleType, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    """A one-process ``torch.distributed.checkpoint.save`` writes ``__0_0.distcp``."""
    import torch.distributed.checkpoint as dcp

    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"step": 7, "w": torch.zeros(2)}, checkpoint_id=str(tmp_path / "ck"),
                 no_dist=True)
    assert main(["inspect", str(tmp_path / "ck")]) == 0
    out = capsys.readouterr().out
    assert "DCP checkpoint (version " in out
    assert ": 1 shard file from 1 rank (0), torch_save; step=7" in out
