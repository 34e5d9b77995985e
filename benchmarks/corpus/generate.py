#!/usr/bin/env python
"""Writes the benign corpus: checkpoints that real libraries write through their own save
code (random init, tiny models, nothing downloaded), and MANIFEST.json, torch's view of each.

Usage (a venv of its own, never CI; see README.md beside this file)::

    python3 -m venv /work/corpus-venv
    /work/corpus-venv/bin/pip install -c benchmarks/corpus/constraints.txt \\
        -r benchmarks/corpus/requirements.txt
    HF_HUB_OFFLINE=1 /work/corpus-venv/bin/python benchmarks/corpus/generate.py /work/corpus-out
    /work/corpus-venv/bin/python benchmarks/corpus/generate.py OUT --only peft,zuko  # a few

Each library has one generator function below (``@library("name", "import name")``) that
writes several variants (models, configs, optimizers, save paths, seeds) under
``OUT/<library>/``. A library that does not import, or whose generator raises, is recorded in
the manifest's ``libraries`` with the reason, and its files are left out.

Then every file under OUT that ``torch.load(weights_only=False)`` reads (and every DCP
directory, through ``dcp_to_torch_save``) gets a manifest entry with torch's view of it:

* ``leaves``: every tensor torch's object reaches by the flat-name rule (``tests/
  _expected_names.py``, the same oracle the differential tests use: modules saved whole by
  their ``state_dict``), each as name, dtype, shape and the sha256 of its bytes in C order;
  ``sets``: the set names of that rule (members compared by content);
* ``skeleton``: the tree skeleton of the object (``skeleton.py``), which ``measure.py``
  compares with ``torchless.load``'s.

A DeepSpeed ZeRO checkpoint (stages 1-3) is one entry, its directory: its tensors are what
DeepSpeed's own ``get_fp32_state_dict_from_zero_checkpoint`` consolidates, and it has no
skeleton (torch reads no one object from it). Its optimizer partitions and ZeRO-3
model-states files get no entry of their own: torchless refuses them one by one by design
(a slice of flat vectors is not the model; docs/deepspeed.md).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))  # tests/_expected_names.py: the torch-side naming oracle
sys.path.insert(0, str(HERE))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402
from corpus_models import MLP, SDE, ODEFunc  # noqa: E402
from torch import nn  # noqa: E402

GENERATORS: list[tuple[str, str, Callable[[Path], None]]] = []
#: Seeds per variant of the table-driven generators (``--seeds``): more seeds, more files.
SEEDS = 2
#: Libraries tried and left out, with why (recorded in the manifest as skipped).
NOT_USED = {
    "torchvision": "its builds in the registry do not load beside the CPU torch 2.13 wheel "
    "(RuntimeError: operator torchvision::nms does not exist); uninstalled",
    "timm": "needs torchvision (ModuleNotFoundError: No module named 'torchvision')",
    "ultralytics": "not installed: needs torchvision",
    "captum": "imports, but has no save path of its own (it explains models, stores none)",
    "speechbrain": "not installed: needs torchaudio, whose builds are paired to one torch "
    "release each (left out to keep torch at 2.13.0)",
}
SKIP_EXT = {
    ".json",
    ".yaml",
    ".yml",
    ".txt",
    ".safetensors",
    ".md",
    ".model",
    ".csv",
    ".log",
    ".py",
    ".zip",
    ".npz",
    ".npy",
}


def library(name: str, module: str) -> Callable[[Callable[[Path], None]], Callable[[Path], None]]:
    def deco(fn: Callable[[Path], None]) -> Callable[[Path], None]:
        GENERATORS.append((name, module, fn))
        return fn

    return deco


def seed(n: int) -> None:
    import random

    import numpy as np

    torch.manual_seed(n)
    random.seed(n)
    np.random.seed(n)


def train_steps(
    model: nn.Module, opt: Any, x: torch.Tensor, steps: int = 2, closure: bool = False
) -> None:
    for _ in range(steps):

        def loss_fn() -> torch.Tensor:
            opt.zero_grad()
            loss = model(x).float().pow(2).mean()
            loss.backward()
            return loss

        if closure:
            opt.step(loss_fn)
        else:
            loss_fn()
            opt.step()


# ---- Hugging Face ----------------------------------------------------------------------------


def _hf_configs() -> list[tuple[str, Any]]:
    import transformers as tf

    small = {
        "hidden_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "vocab_size": 64,
        "max_position_embeddings": 32,
    }
    return [
        ("bert", tf.BertConfig(**small, type_vocab_size=2)),
        ("gpt2", tf.GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=64, n_positions=32)),
        ("llama", tf.LlamaConfig(**small, num_key_value_heads=1)),
        ("mistral", tf.MistralConfig(**small, num_key_value_heads=1)),
        ("t5", tf.T5Config(d_model=16, d_ff=32, num_layers=2, num_heads=2, vocab_size=64, d_kv=8)),
        ("roberta", tf.RobertaConfig(**{**small, "max_position_embeddings": 40})),
        (
            "distilbert",
            tf.DistilBertConfig(
                dim=16,
                n_layers=2,
                n_heads=2,
                hidden_dim=32,
                vocab_size=64,
                max_position_embeddings=32,
            ),
        ),
        (
            "vit",
            tf.ViTConfig(
                hidden_size=16,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=32,
                image_size=16,
                patch_size=8,
            ),
        ),
        (
            "opt",
            tf.OPTConfig(
                hidden_size=16,
                num_hidden_layers=2,
                num_attention_heads=2,
                ffn_dim=32,
                vocab_size=64,
                max_position_embeddings=32,
                word_embed_proj_dim=16,
            ),
        ),
        ("qwen2", tf.Qwen2Config(**small, num_key_value_heads=1)),
        (
            "bart",
            tf.BartConfig(
                d_model=16,
                encoder_layers=1,
                decoder_layers=1,
                encoder_attention_heads=2,
                decoder_attention_heads=2,
                encoder_ffn_dim=32,
                decoder_ffn_dim=32,
                vocab_size=64,
                max_position_embeddings=32,
            ),
        ),
        ("gpt_neox", tf.GPTNeoXConfig(**small)),
    ]


@library("transformers", "transformers")
def gen_transformers(out: Path) -> None:
    import transformers as tf

    heads = {
        "bert": [tf.BertModel, tf.BertForSequenceClassification, tf.BertForMaskedLM],
        "gpt2": [tf.GPT2LMHeadModel, tf.GPT2Model],
        "llama": [tf.LlamaForCausalLM],
        "mistral": [tf.MistralForCausalLM],
        "t5": [tf.T5ForConditionalGeneration],
        "roberta": [tf.RobertaForMaskedLM],
        "distilbert": [tf.DistilBertForSequenceClassification],
        "vit": [tf.ViTForImageClassification],
        "opt": [tf.OPTForCausalLM],
        "qwen2": [tf.Qwen2ForCausalLM],
        "bart": [tf.BartForConditionalGeneration],
        "gpt_neox": [tf.GPTNeoXForCausalLM],
    }
    for n, (arch, config) in enumerate(_hf_configs()):
        for cls in heads[arch]:
            for s in range(2):
                seed(100 * n + s)
                model = cls(config)
                d = out / f"{cls.__name__}-{s}"
                model.save_pretrained(d, safe_serialization=False)
                if s == 0:
                    torch.save(model, out / f"{cls.__name__}.whole.pt")
                    torch.save(
                        {"model": model.state_dict(), "config": config.to_dict(), "step": 10},
                        out / f"{cls.__name__}.dict.pt",
                    )
        if arch in ("gpt2", "llama"):  # sharded pytorch_model-0000x-of-0000y.bin + index
            seed(n)
            heads[arch][0](config).save_pretrained(
                out / f"{arch}-sharded", safe_serialization=False, max_shard_size="20KB"
            )
        if arch in ("bert", "llama"):
            seed(n)
            half = heads[arch][0](config).to(torch.bfloat16)
            half.save_pretrained(out / f"{arch}-bf16", safe_serialization=False)
            torch.save(heads[arch][0](config).half().state_dict(), out / f"{arch}-fp16.bin")


@library("transformers.Trainer", "transformers")
def gen_trainer(out: Path) -> None:
    import transformers as tf
    from torch.utils.data import Dataset

    class Toy(Dataset):  # type: ignore[type-arg]
        def __init__(self, n: int, vocab: int) -> None:
            g = torch.Generator().manual_seed(n)
            self.x = torch.randint(0, vocab, (n, 8), generator=g)

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": self.x[i], "labels": self.x[i]}

    import inspect

    cfgs = dict(_hf_configs())
    no_safetensors: dict[str, Any] = (  # transformers 4 only: 5 always writes safetensors
        {"save_safetensors": False}
        if "save_safetensors" in inspect.signature(tf.TrainingArguments).parameters
        else {}
    )
    runs = [
        ("gpt2", tf.GPT2LMHeadModel, "adamw_torch", "linear"),
        ("llama", tf.LlamaForCausalLM, "adamw_torch", "cosine"),
        ("gpt2", tf.GPT2LMHeadModel, "sgd", "constant"),
        ("qwen2", tf.Qwen2ForCausalLM, "adafactor", "linear"),
        ("opt", tf.OPTForCausalLM, "adamw_torch", "polynomial"),
    ]
    for i, (arch, cls, optim, sched) in enumerate(runs):
        seed(i)
        model = cls(cfgs[arch])
        args = tf.TrainingArguments(
            output_dir=str(out / f"{arch}-{optim}-{i}"),
            max_steps=4,
            save_steps=2,
            per_device_train_batch_size=2,
            report_to=[],
            optim=optim,
            lr_scheduler_type=sched,
            logging_steps=100,
            use_cpu=True,
            disable_tqdm=True,
            dataloader_num_workers=0,
            **no_safetensors,
        )
        tf.Trainer(model=model, args=args, train_dataset=Toy(16, 64)).train()


@library("peft", "peft")
def gen_peft(out: Path) -> None:
    import peft
    import transformers as tf

    cfgs = dict(_hf_configs())
    bases = [
        ("gpt2", tf.GPT2LMHeadModel, ["c_attn"]),
        ("llama", tf.LlamaForCausalLM, ["q_proj", "v_proj"]),
        ("bert", tf.BertForSequenceClassification, ["query", "value"]),
        ("opt", tf.OPTForCausalLM, ["q_proj", "v_proj"]),
    ]
    for i, (arch, cls, targets) in enumerate(bases):
        for kind in ("lora", "ia3", "lora-r8", "loha", "prefix"):
            seed(10 * i + len(kind))
            base = cls(cfgs[arch])
            task = "SEQ_CLS" if arch == "bert" else "CAUSAL_LM"
            if kind.startswith("lora"):
                conf: Any = peft.LoraConfig(
                    r=8 if kind == "lora-r8" else 2,
                    lora_alpha=4,
                    target_modules=targets,
                    task_type=task,
                )
            elif kind == "ia3":
                conf = peft.IA3Config(
                    target_modules=targets, feedforward_modules=[], task_type=task
                )
            elif kind == "loha":
                conf = peft.LoHaConfig(r=2, target_modules=targets, task_type=task)
            else:
                if arch == "bert":
                    continue
                conf = peft.PrefixTuningConfig(num_virtual_tokens=3, task_type=task)
            try:
                model = peft.get_peft_model(base, conf)
            except (TypeError, ValueError) as e:  # an adapter kind the base's layers lack
                print(f"  peft {arch}-{kind}: {e}"[:160])
                continue
            for p in model.parameters():
                if p.requires_grad:
                    p.data.normal_()
            model.save_pretrained(out / f"{arch}-{kind}", safe_serialization=False)
            if kind == "lora":
                torch.save(model, out / f"{arch}-{kind}.whole.pt")
                torch.save(model.merge_and_unload().state_dict(), out / f"{arch}-merged.bin")


@library("sentence-transformers", "sentence_transformers")
def gen_sentence_transformers(out: Path) -> None:
    import transformers as tf
    from sentence_transformers import SentenceTransformer, models

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(59)]
    for i in range(6):
        seed(i)
        base = out / f"base-{i}"
        base.mkdir(parents=True, exist_ok=True)
        (base / "vocab.txt").write_text("\n".join(vocab) + "\n")
        tf.BertTokenizerFast(vocab_file=str(base / "vocab.txt")).save_pretrained(base)
        tf.BertModel(dict(_hf_configs())["bert"]).save_pretrained(base, safe_serialization=False)
        word = models.Transformer(str(base), max_seq_length=16)
        mods: list[Any] = [word, models.Pooling(16, pooling_mode=["mean", "cls", "max"][i % 3])]
        if i % 2:
            mods.append(models.Dense(16, 8))
        if i >= 4:
            mods.append(models.Normalize())
        st = SentenceTransformer(modules=mods, device="cpu")
        st.save(str(out / f"st-{i}"), safe_serialization=False)
        if i < 2:
            torch.save(st, out / f"st-{i}.whole.pt")
        shutil.rmtree(base)


@library("accelerate", "accelerate")
def gen_accelerate(out: Path) -> None:
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    for i in range(6):
        set_seed(i)
        acc = Accelerator(cpu=True)
        model = MLP(6, 4 + i, 3)
        opt = [torch.optim.AdamW, torch.optim.SGD, torch.optim.Adam][i % 3](
            model.parameters(), lr=1e-2
        )
        sched = torch.optim.lr_scheduler.StepLR(opt, 2)
        model, opt, sched = acc.prepare(model, opt, sched)
        x = torch.randn(4, 6)
        for _ in range(2):
            loss = model(x).pow(2).mean()
            acc.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
        acc.save_state(str(out / f"state-{i}"), safe_serialization=False)
        acc.save(
            acc.unwrap_model(model).state_dict(),
            str(out / f"model-{i}.bin"),
            safe_serialization=False,
        )
        acc.save_model(model, str(out / f"save_model-{i}"), safe_serialization=False)
        acc.free_memory()


@library("diffusers", "diffusers")
def gen_diffusers(out: Path) -> None:
    import diffusers as df
    from diffusers.training_utils import EMAModel

    for i in range(3):
        seed(i)
        unet = df.UNet2DModel(
            sample_size=8,
            in_channels=3,
            out_channels=3,
            layers_per_block=1,
            block_out_channels=(8, 16),
            norm_num_groups=4,
            down_block_types=("DownBlock2D", "AttnDownBlock2D"),
            up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        )
        unet.save_pretrained(out / f"unet2d-{i}", safe_serialization=False)
        vae = df.AutoencoderKL(
            block_out_channels=(8,), norm_num_groups=4, latent_channels=2, sample_size=8
        )
        vae.save_pretrained(out / f"vae-{i}", safe_serialization=False)
        cond = df.UNet2DConditionModel(
            sample_size=8,
            in_channels=2,
            out_channels=2,
            layers_per_block=1,
            block_out_channels=(8, 16),
            norm_num_groups=4,
            cross_attention_dim=8,
            attention_head_dim=2,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        )
        cond.save_pretrained(out / f"unet-cond-{i}", safe_serialization=False)
        ema = EMAModel(unet.parameters(), decay=0.99 - i / 100)
        ema.step(unet.parameters())
        torch.save(ema.state_dict(), out / f"ema-{i}.pt")
        ema_m = EMAModel(vae.parameters(), model_cls=df.AutoencoderKL, model_config=vae.config)
        ema_m.save_pretrained(str(out / f"ema-vae-{i}"))
        if i == 0:
            torch.save(unet, out / "unet2d.whole.pt")
            torch.save(vae, out / "vae.whole.pt")
        sched = [df.DDPMScheduler, df.DDIMScheduler, df.EulerDiscreteScheduler][i]()
        torch.save(
            {
                "unet": unet.state_dict(),
                "scheduler_config": dict(sched.config),
                "global_step": 5 * i,
            },
            out / f"train-{i}.ckpt",
        )


def _lightning(out: Path, module_cls: Any, trainer_cls: Any, callbacks: Any) -> None:
    from omegaconf import OmegaConf

    class Lit(module_cls):  # type: ignore[misc,valid-type]
        def __init__(
            self, hidden: int = 8, lr: float = 0.01, opt: str = "adam", cfg: Any = None
        ) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = MLP(6, hidden, 2)

        def training_step(self, batch: Any, idx: int) -> torch.Tensor:
            loss = self.net(batch[0]).pow(2).mean()
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            opt = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}[
                self.hparams.opt
            ](self.parameters(), lr=self.hparams.lr)
            if self.hparams.opt == "sgd":
                return opt
            return {
                "optimizer": opt,
                "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1),
            }

    from torch.utils.data import DataLoader, TensorDataset

    data = DataLoader(TensorDataset(torch.randn(16, 6)), batch_size=4)
    for i in range(8):
        seed(i)
        cfg = OmegaConf.create({"model": {"hidden": 8 + i}, "data": {"bs": 4}}) if i % 2 else None
        lit = Lit(hidden=8 + i, opt=["adam", "sgd", "adamw"][i % 3], cfg=cfg)
        ck = callbacks.ModelCheckpoint(
            dirpath=str(out / f"run-{i}"),
            save_top_k=-1,
            every_n_train_steps=2,
            save_last=True,
            save_weights_only=i == 5,
        )
        cbs: list[Any] = [ck]
        if i == 6:
            cbs.append(callbacks.EarlyStopping(monitor="train_loss"))
        tr = trainer_cls(
            max_epochs=2,
            accelerator="cpu",
            devices=1,
            callbacks=cbs,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=str(out / f"root-{i}"),
        )
        tr.fit(lit, data)
        tr.save_checkpoint(str(out / f"manual-{i}.ckpt"))


@library("lightning", "lightning")
def gen_lightning(out: Path) -> None:
    import lightning as L

    _lightning(out, L.LightningModule, L.Trainer, L.pytorch.callbacks)


@library("pytorch-lightning", "pytorch_lightning")
def gen_pytorch_lightning(out: Path) -> None:
    import pytorch_lightning as pl

    _lightning(out, pl.LightningModule, pl.Trainer, pl.callbacks)


# ---- DeepSpeed (a process of its own) and DCP ---------------------------------------------------


_DS_CHILD = r"""
import os, sys, socket
os.environ["DS_ACCELERATOR"] = "cpu"
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0",
                  WORLD_SIZE="1")
import torch
from torch import nn
import deepspeed, deepspeed.comm.torch
sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo")
out = sys.argv[1]
i = 0
for stage in (0, 1, 2, 3):
    for bf16 in (False, True):
        for opt in ("adamw", "sgd"):
            torch.manual_seed(i)
            model = nn.Sequential(nn.Embedding(11, 6), nn.Linear(6, 7 + i % 3), nn.ReLU(),
                                  nn.Linear(7 + i % 3, 5))
            o = (torch.optim.AdamW if opt == "adamw" else torch.optim.SGD)(
                model.parameters(), lr=1e-2)
            config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage},
                      "zero_allow_untested_optimizer": True, "bf16": {"enabled": bf16},
                      "steps_per_print": 1000}
            engine, *_ = deepspeed.initialize(model=model, optimizer=o, config=config)
            for _ in range(2):
                loss = engine(torch.randint(0, 11, (2, 3))).float().pow(2).mean()
                engine.backward(loss)
                engine.step()
            engine.save_checkpoint(f"{out}/z{stage}-{'bf16' if bf16 else 'fp32'}-{opt}",
                                   client_state={"epoch": i, "note": "tiny"})
            engine.destroy()
            i += 1
print("ok")
"""


@library("deepspeed", "deepspeed")
def gen_deepspeed(out: Path) -> None:
    import subprocess

    out.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        [sys.executable, "-c", _DS_CHILD, str(out)], capture_output=True, text=True, timeout=1500
    )
    if r.returncode != 0 or "ok" not in r.stdout:
        raise RuntimeError(f"deepspeed child failed: {r.stderr[-2000:]}")


@library("torch.distributed.checkpoint", "torch.distributed.checkpoint")
def gen_dcp(out: Path) -> None:
    import torch.distributed.checkpoint as dcp

    for i in range(3 * SEEDS):
        seed(i)
        model = MLP(6, 4 + i, 3)
        opt = torch.optim.Adam(model.parameters())
        train_steps(model, opt, torch.randn(3, 6))
        state = {"model": model.state_dict(), "step": i, "name": f"run-{i}"}
        if i % 2:
            state["optim"] = opt.state_dict()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(state, checkpoint_id=str(out / f"dcp-{i}"), no_dist=True)


# ---- EMA savers and optimizers ----------------------------------------------------------------


@library("ema-pytorch", "ema_pytorch")
def gen_ema_pytorch(out: Path) -> None:
    from ema_pytorch import EMA, PostHocEMA

    for i in range(8):
        seed(i)
        net = MLP(6, 4 + i, 2)
        ema = EMA(net, beta=0.9 + i / 100, update_after_step=0, update_every=1)
        for _ in range(3):
            with torch.no_grad():
                for p in net.parameters():
                    p.add_(0.1)
            ema.update()
        torch.save(ema.state_dict(), out / f"ema-{i}.pt")
        if i < 3:
            torch.save(ema, out / f"ema-{i}.whole.pt")
    for i in range(3):
        seed(i)
        net = MLP(6, 5, 2)
        ph = PostHocEMA(
            net,
            sigma_rels=(0.05, 0.28),
            update_every=1,
            checkpoint_every_num_steps=2,
            checkpoint_folder=str(out / f"posthoc-{i}"),
        )
        for _ in range(4):
            with torch.no_grad():
                for p in net.parameters():
                    p.mul_(0.9)
            ph.update()
        torch.save(ph.state_dict(), out / f"posthoc-{i}.pt")


@library("torch-ema", "torch_ema")
def gen_torch_ema(out: Path) -> None:
    from torch_ema import ExponentialMovingAverage

    for i in range(10):
        seed(i)
        net = MLP(6, 3 + i, 2)
        ema = ExponentialMovingAverage(
            net.parameters(), decay=0.9 + i / 200, use_num_updates=i % 2 == 0
        )
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(2):
            train_steps(net, opt, torch.randn(2, 6), 1)
            ema.update()
        torch.save(
            {"model": net.state_dict(), "ema": ema.state_dict(), "optimizer": opt.state_dict()},
            out / f"ckpt-{i}.pt",
        )
        torch.save(ema.state_dict(), out / f"ema-{i}.pt")


def _optim_states(
    out: Path,
    makers: dict[str, Callable[[Any], Any]],
    reps: int = 2,
    closure: Callable[[str], bool] = lambda name: False,
) -> None:
    for name, make in makers.items():
        for s in range(reps * SEEDS):
            seed(s)
            net = MLP(6, 5 + s, 2)
            opt = make(net.parameters())
            if hasattr(opt, "train"):
                opt.train()
            train_steps(net, opt, torch.randn(4, 6), 2, closure=closure(name))
            torch.save(opt.state_dict(), out / f"{name}-{s}.pt")
            if s == 0:
                torch.save(
                    {"model": net.state_dict(), "optimizer": opt.state_dict(), "epoch": 1},
                    out / f"{name}-ckpt.pt",
                )


@library("lion-pytorch", "lion_pytorch")
def gen_lion(out: Path) -> None:
    from lion_pytorch import Lion

    _optim_states(
        out,
        {
            f"lion-{wd}": (lambda p, wd=wd: Lion(p, lr=1e-3, weight_decay=wd))
            for wd in (0.0, 0.01, 0.1)
        },
        reps=3,
    )


@library("schedulefree", "schedulefree")
def gen_schedulefree(out: Path) -> None:
    import schedulefree as sf

    _optim_states(
        out,
        {
            "adamw-sf": lambda p: sf.AdamWScheduleFree(p, lr=1e-3),
            "sgd-sf": lambda p: sf.SGDScheduleFree(p, lr=1e-3),
            "radam-sf": lambda p: sf.RAdamScheduleFree(p, lr=1e-3),
        },
        reps=3,
    )


@library("pytorch-optimizer", "pytorch_optimizer")
def gen_pytorch_optimizer(out: Path) -> None:
    import pytorch_optimizer as po

    names = [
        "AdaBelief",
        "AdaBound",
        "AdamP",
        "DiffGrad",
        "Lamb",
        "LARS",
        "MADGRAD",
        "Ranger",
        "Ranger21",
        "RAdam",
        "SGDP",
        "Lookahead",
        "Prodigy",
        "DAdaptAdam",
        "Tiger",
        "SophiaH",
        "Adan",
        "AdaHessian",
        "Shampoo",
        "SOAP",
    ]
    makers: dict[str, Callable[[Any], Any]] = {}
    for n in names:
        cls = getattr(po, n, None)
        if cls is None:
            continue
        if n == "Lookahead":
            makers[n] = lambda p: po.Lookahead(torch.optim.Adam(p), k=2)
        elif n == "Ranger21":
            makers[n] = lambda p: po.Ranger21(p, num_iterations=10)
        else:
            makers[n] = lambda p, cls=cls: cls(p, lr=1e-3)
    ok = 0
    for n, make in makers.items():
        try:
            _optim_states(out, {n: make}, reps=2)
            ok += 1
        except Exception as e:  # a few need create_graph or a closure
            for f in out.glob(f"{n}-*"):
                f.unlink()
            print(f"  pytorch-optimizer {n}: {type(e).__name__}: {str(e)[:100]}")
    if ok < 5:
        raise RuntimeError("fewer than 5 pytorch-optimizer optimizers ran")


@library("madgrad", "madgrad")
def gen_madgrad(out: Path) -> None:
    from madgrad import MADGRAD, MirrorMADGRAD

    _optim_states(
        out,
        {"madgrad": lambda p: MADGRAD(p, lr=1e-3), "mirror": lambda p: MirrorMADGRAD(p, lr=1e-3)},
        reps=3,
    )


@library("prodigyopt", "prodigyopt")
def gen_prodigy(out: Path) -> None:
    from prodigyopt import Prodigy

    _optim_states(
        out,
        {f"prodigy-{d}": (lambda p, d=d: Prodigy(p, lr=1.0, d_coef=d)) for d in (0.5, 1.0)},
        reps=3,
    )


@library("dadaptation", "dadaptation")
def gen_dadaptation(out: Path) -> None:
    import dadaptation as da

    _optim_states(
        out,
        {
            "dadapt-adam": lambda p: da.DAdaptAdam(p),
            "dadapt-sgd": lambda p: da.DAdaptSGD(p),
            "dadapt-adagrad": lambda p: da.DAdaptAdaGrad(p, eps=1e-6),
        },
        reps=3,
    )


# ---- model libraries: torch.save(model), state dicts, training checkpoints -------------------


def _save_models(
    out: Path,
    models: dict[str, Callable[[], nn.Module]],
    reps: int = 2,
    whole: bool = True,
    optim: bool = True,
) -> None:
    for name, make in models.items():
        for s in range(reps * SEEDS):
            seed(s)
            m = make()
            torch.save(m.state_dict(), out / f"{name}-{s}.pt")
            if whole and s == 0:
                torch.save(m, out / f"{name}.whole.pt")
            if optim and s == 0 and any(True for _ in m.parameters()):
                opt = torch.optim.Adam(m.parameters())
                for p in m.parameters():
                    p.grad = torch.randn_like(p)
                opt.step()
                torch.save(
                    {
                        "epoch": 2,
                        "model_state_dict": m.state_dict(),
                        "optimizer_state_dict": opt.state_dict(),
                        "loss": 0.5,
                    },
                    out / f"{name}-train.tar",
                )


@library("x-transformers", "x_transformers")
def gen_x_transformers(out: Path) -> None:
    from x_transformers import (
        ContinuousTransformerWrapper,
        Decoder,
        Encoder,
        TransformerWrapper,
        XTransformer,
    )

    _save_models(
        out,
        {
            "decoder": lambda: TransformerWrapper(
                num_tokens=64, max_seq_len=16, attn_layers=Decoder(dim=16, depth=2, heads=2)
            ),
            "encoder": lambda: TransformerWrapper(
                num_tokens=64, max_seq_len=16, attn_layers=Encoder(dim=16, depth=2, heads=2)
            ),
            "rotary": lambda: TransformerWrapper(
                num_tokens=64,
                max_seq_len=16,
                attn_layers=Decoder(dim=16, depth=1, heads=2, rotary_pos_emb=True, ff_glu=True),
            ),
            "continuous": lambda: ContinuousTransformerWrapper(
                dim_in=4, dim_out=4, max_seq_len=16, attn_layers=Encoder(dim=16, depth=1, heads=2)
            ),
            "xtransformer": lambda: XTransformer(
                dim=16,
                enc_num_tokens=32,
                enc_depth=1,
                enc_heads=2,
                enc_max_seq_len=16,
                dec_num_tokens=32,
                dec_depth=1,
                dec_heads=2,
                dec_max_seq_len=16,
            ),
        },
        reps=3,
    )


@library("vector-quantize-pytorch", "vector_quantize_pytorch")
def gen_vq(out: Path) -> None:
    import vector_quantize_pytorch as vq

    _save_models(
        out,
        {
            "vq": lambda: vq.VectorQuantize(dim=8, codebook_size=16),
            "vq-ema-off": lambda: vq.VectorQuantize(
                dim=8, codebook_size=16, ema_update=False, learnable_codebook=True
            ),
            "residual": lambda: vq.ResidualVQ(dim=8, num_quantizers=3, codebook_size=16),
            "fsq": lambda: vq.FSQ(levels=[4, 4, 3]),
            "lfq": lambda: vq.LFQ(dim=8, codebook_size=16),
            "grouped": lambda: vq.GroupedResidualVQ(
                dim=8, groups=2, num_quantizers=2, codebook_size=16
            ),
        },
        reps=3,
    )


@library("rotary-embedding-torch", "rotary_embedding_torch")
def gen_rotary(out: Path) -> None:
    from rotary_embedding_torch import RotaryEmbedding

    _save_models(
        out,
        {
            f"rotary-{d}-{lf}": (lambda d=d, lf=lf: RotaryEmbedding(dim=d, learned_freq=lf))
            for d in (8, 16, 32)
            for lf in (False, True)
        },
        reps=2,
        optim=False,
    )


@library("performer-pytorch", "performer_pytorch")
def gen_performer(out: Path) -> None:
    from performer_pytorch import Performer, PerformerLM

    _save_models(
        out,
        {
            "lm": lambda: PerformerLM(
                num_tokens=64, max_seq_len=16, dim=16, depth=1, heads=2, dim_head=8
            ),
            "lm-causal": lambda: PerformerLM(
                num_tokens=64, max_seq_len=16, dim=16, depth=2, heads=2, dim_head=8, causal=True
            ),
            "performer": lambda: Performer(dim=16, depth=1, heads=2, dim_head=8),
        },
        reps=3,
    )


@library("linear-attention-transformer", "linear_attention_transformer")
def gen_linear_attention(out: Path) -> None:
    from linear_attention_transformer import LinearAttentionTransformerLM

    _save_models(
        out,
        {
            f"lm-{d}-{c}": (
                lambda d=d, c=c: LinearAttentionTransformerLM(
                    num_tokens=64, dim=16, heads=2, depth=d, max_seq_len=16, causal=c
                )
            )
            for d in (1, 2)
            for c in (False, True)
        },
        reps=3,
        whole=False,
    )


@library("torchdiffeq", "torchdiffeq")
def gen_torchdiffeq(out: Path) -> None:
    from torchdiffeq import odeint

    for i in range(8):
        seed(i)
        f = ODEFunc(4 + i)
        opt = torch.optim.RMSprop(f.parameters(), lr=1e-3)
        t = torch.linspace(0, 1, 5)
        sol = odeint(f, torch.randn(3, 2), t, method=["dopri5", "rk4", "euler", "midpoint"][i % 4])
        sol.pow(2).mean().backward()
        opt.step()
        torch.save(
            {
                "func": f.state_dict(),
                "opt": opt.state_dict(),
                "t": t,
                "traj": sol.detach(),
                "method": ["dopri5", "rk4", "euler", "midpoint"][i % 4],
            },
            out / f"ode-{i}.pth",
        )
        if i < 3:
            torch.save(f, out / f"ode-{i}.whole.pth")


@library("torchsde", "torchsde")
def gen_torchsde(out: Path) -> None:
    import torchsde

    for i in range(8):
        seed(i)
        sde = SDE(3 + i)
        ys = torchsde.sdeint(sde, torch.randn(2, 2), torch.linspace(0, 1, 4), dt=0.1)
        torch.save({"sde": sde.state_dict(), "ys": ys.detach()}, out / f"sde-{i}.pt")
        if i < 3:
            torch.save(sde, out / f"sde-{i}.whole.pt")


@library("normflows", "normflows")
def gen_normflows(out: Path) -> None:
    import normflows as nf

    for i in range(8):
        seed(i)
        flows: list[Any] = []
        for _ in range(2 + i % 3):
            if i % 2:
                flows += [
                    nf.flows.MaskedAffineFlow(
                        torch.tensor([1.0, 0.0]), nf.nets.MLP([1, 4, 2], init_zeros=True)
                    ),
                    nf.flows.Permute(2, mode="swap"),
                ]
            else:
                flows += [
                    nf.flows.AffineCouplingBlock(nf.nets.MLP([1, 4, 2], init_zeros=True)),
                    nf.flows.ActNorm(2),
                ]
        model = nf.NormalizingFlow(nf.distributions.DiagGaussian(2), flows)
        model.save(str(out / f"flow-{i}.pt"))
        if i < 3:
            torch.save(model, out / f"flow-{i}.whole.pt")


@library("zuko", "zuko")
def gen_zuko(out: Path) -> None:
    import zuko

    _save_models(
        out,
        {
            "maf": lambda: zuko.flows.MAF(features=3, context=2, transforms=2, hidden_features=[8]),
            "nsf": lambda: zuko.flows.NSF(features=3, transforms=2, hidden_features=[8]),
            "nice": lambda: zuko.flows.NICE(features=4, transforms=2, hidden_features=[8]),
            "gf": lambda: zuko.flows.GF(features=2, transforms=2, components=3),
            "cnf": lambda: zuko.flows.CNF(features=2, hidden_features=[8]),
        },
        reps=3,
    )


@library("nflows", "nflows")
def gen_nflows(out: Path) -> None:
    from nflows.distributions.normal import StandardNormal
    from nflows.flows.base import Flow
    from nflows.transforms.autoregressive import (
        MaskedAffineAutoregressiveTransform,
        MaskedPiecewiseRationalQuadraticAutoregressiveTransform,
    )
    from nflows.transforms.base import CompositeTransform
    from nflows.transforms.permutations import ReversePermutation

    def make(kind: str, n: int) -> Flow:
        ts: list[Any] = []
        for _ in range(n):
            ts.append(ReversePermutation(features=3))
            ts.append(
                MaskedAffineAutoregressiveTransform(features=3, hidden_features=6)
                if kind == "affine"
                else MaskedPiecewiseRationalQuadraticAutoregressiveTransform(
                    features=3, hidden_features=6, num_bins=4, tails="linear"
                )
            )
        return Flow(CompositeTransform(ts), StandardNormal([3]))

    _save_models(
        out,
        {f"{k}-{n}": (lambda k=k, n=n: make(k, n)) for k in ("affine", "spline") for n in (1, 2)},
        reps=2,
    )


@library("pyro-ppl", "pyro")
def gen_pyro(out: Path) -> None:
    import pyro
    import pyro.distributions as dist
    from pyro.infer import SVI, Trace_ELBO
    from pyro.infer.autoguide import AutoDiagonalNormal, AutoNormal
    from pyro.optim import Adam

    data = torch.randn(20)
    for i in range(8):
        pyro.clear_param_store()
        seed(i)

        def model(x: torch.Tensor) -> None:
            loc = pyro.sample("loc", dist.Normal(0.0, 1.0))
            scale = pyro.sample("scale", dist.LogNormal(0.0, 1.0))
            with pyro.plate("data", len(x)):
                pyro.sample("obs", dist.Normal(loc, scale), obs=x)

        guide = (AutoNormal if i % 2 else AutoDiagonalNormal)(model)
        optim = Adam({"lr": 0.01 * (i + 1)})
        svi = SVI(model, guide, optim, loss=Trace_ELBO())
        for _ in range(3):
            svi.step(data)
        pyro.get_param_store().save(str(out / f"params-{i}.pt"))
        optim.save(str(out / f"optim-{i}.pt"))
        torch.save({"guide": guide.state_dict(), "step": 3}, out / f"guide-{i}.pt")
        if i < 2:
            torch.save(guide, out / f"guide-{i}.whole.pt")


@library("gpytorch", "gpytorch")
def gen_gpytorch(out: Path) -> None:
    import gpytorch
    from corpus_models import GP

    kernels = [
        lambda: gpytorch.kernels.RBFKernel(),
        lambda: gpytorch.kernels.MaternKernel(),
        lambda: gpytorch.kernels.PeriodicKernel(),
        lambda: gpytorch.kernels.LinearKernel(),
    ]
    for i in range(8):
        seed(i)
        x = torch.linspace(0, 1, 10)
        y = torch.sin(x * 6) + 0.1 * torch.randn(10)
        lik = gpytorch.likelihoods.GaussianLikelihood()
        gp = GP(x, y, lik, kernels[i % 4]())
        opt = torch.optim.Adam(gp.parameters(), lr=0.1)
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(lik, gp)
        gp.train()
        for _ in range(2):
            opt.zero_grad()
            (-mll(gp(x), y)).backward()
            opt.step()
        torch.save(gp.state_dict(), out / f"gp-{i}.pth")
        torch.save(
            {
                "model": gp.state_dict(),
                "likelihood": lik.state_dict(),
                "optimizer": opt.state_dict(),
            },
            out / f"gp-{i}-train.pth",
        )
        if i < 3:
            torch.save(gp, out / f"gp-{i}.whole.pth")


@library("botorch", "botorch")
def gen_botorch(out: Path) -> None:
    from botorch.models import MultiTaskGP, SingleTaskGP
    from botorch.models.transforms import Normalize, Standardize

    for i in range(6):
        seed(i)
        x = torch.rand(8, 2, dtype=torch.float64)
        y = x.sum(-1, keepdim=True) + 0.1 * torch.randn(8, 1, dtype=torch.float64)
        if i < 4:
            m: Any = SingleTaskGP(
                x,
                y,
                input_transform=Normalize(d=2) if i % 2 else None,
                outcome_transform=Standardize(m=1),
            )
        else:
            xt = torch.cat([x, torch.randint(0, 2, (8, 1)).double()], -1)
            m = MultiTaskGP(xt, y, task_feature=-1)
        torch.save(m.state_dict(), out / f"gp-{i}.pt")
        if i < 3:
            torch.save(m, out / f"gp-{i}.whole.pt")


@library("torch-geometric", "torch_geometric")
def gen_pyg(out: Path) -> None:
    import torch_geometric.nn as gnn
    from torch_geometric.data import Data, HeteroData

    _save_models(
        out,
        {
            "gcn": lambda: gnn.models.GCN(4, 8, 2, 3),
            "gat": lambda: gnn.models.GAT(4, 8, 2, 3, heads=2),
            "sage": lambda: gnn.models.GraphSAGE(4, 8, 2, 3),
            "gin": lambda: gnn.models.GIN(4, 8, 2, 3),
            "schnet": lambda: gnn.models.SchNet(
                hidden_channels=8, num_filters=8, num_interactions=1, num_gaussians=5
            ),
        },
        reps=2,
    )
    for i in range(4):
        seed(i)
        d = Data(x=torch.randn(5, 4), edge_index=torch.randint(0, 5, (2, 8)), y=torch.tensor([i]))
        torch.save(d, out / f"data-{i}.pt")
        h = HeteroData()
        h["paper"].x = torch.randn(3, 4)
        h["author"].x = torch.randn(2, 4)
        h["author", "writes", "paper"].edge_index = torch.tensor([[0, 1], [1, 2]])
        torch.save(h, out / f"hetero-{i}.pt")


@library("e3nn", "e3nn")
def gen_e3nn(out: Path) -> None:
    from e3nn import o3
    from e3nn.nn import Gate  # noqa: F401

    _save_models(
        out,
        {
            "linear": lambda: o3.Linear("2x0e + 1x1o", "3x0e + 2x1o"),
            "tp": lambda: o3.FullyConnectedTensorProduct("1x0e + 1x1o", "1x1o", "2x0e + 1x1o"),
            "sh": lambda: o3.SphericalHarmonics([0, 1, 2], normalize=True),
        },
        reps=3,
        whole=False,
    )


@library("kornia", "kornia")
def gen_kornia(out: Path) -> None:
    import kornia.feature as KF
    import kornia.filters as KFi

    _save_models(
        out,
        {
            "hardnet": lambda: KF.HardNet(pretrained=False),
            "sosnet": lambda: KF.SOSNet(pretrained=False),
            "tfeat": lambda: KF.TFeat(pretrained=False),
            "affnet": lambda: KF.LAFAffNetShapeEstimator(pretrained=False),
            "orinet": lambda: KF.OriNet(pretrained=False),
            "sobel": lambda: KFi.Sobel(),
        },
        reps=2,
    )


@library("monai", "monai")
def gen_monai(out: Path) -> None:
    from monai.networks import nets
    from monai.networks.utils import save_state

    makers = {
        "unet": lambda: nets.UNet(
            spatial_dims=2,
            in_channels=1,
            out_channels=2,
            channels=(4, 8),
            strides=(2,),
            num_res_units=1,
        ),
        "basicunet": lambda: nets.BasicUNet(
            spatial_dims=2, in_channels=1, out_channels=2, features=(4, 4, 8, 8, 16, 4)
        ),
        "segresnet": lambda: nets.SegResNet(
            spatial_dims=2,
            init_filters=8,
            in_channels=1,
            out_channels=2,
            blocks_down=(1, 1),
            blocks_up=(1,),
        ),
        "vit": lambda: nets.ViT(
            in_channels=1,
            img_size=(16, 16),
            patch_size=(8, 8),
            hidden_size=16,
            mlp_dim=32,
            num_layers=1,
            num_heads=2,
            spatial_dims=2,
        ),
        "densenet": lambda: nets.DenseNet(
            spatial_dims=2,
            in_channels=1,
            out_channels=2,
            init_features=4,
            growth_rate=4,
            block_config=(1, 1),
        ),
    }
    _save_models(out, makers, reps=2)
    for i, (name, make) in enumerate(makers.items()):
        seed(i)
        save_state(make(), str(out / f"{name}-save_state.pt"))


@library("pytorch-metric-learning", "pytorch_metric_learning")
def gen_pml(out: Path) -> None:
    from pytorch_metric_learning import losses

    _save_models(
        out,
        {
            "arcface": lambda: losses.ArcFaceLoss(num_classes=5, embedding_size=8),
            "cosface": lambda: losses.CosFaceLoss(num_classes=5, embedding_size=8),
            "proxyanchor": lambda: losses.ProxyAnchorLoss(num_classes=5, embedding_size=8),
            "normsoftmax": lambda: losses.NormalizedSoftmaxLoss(num_classes=5, embedding_size=8),
            "softtriple": lambda: losses.SoftTripleLoss(num_classes=5, embedding_size=8),
            "triplet": lambda: losses.TripletMarginLoss(margin=0.1),
        },
        reps=2,
    )


@library("pytorch-crf", "torchcrf")
def gen_crf(out: Path) -> None:
    from torchcrf import CRF

    _save_models(
        out,
        {
            f"crf-{n}-{b}": (lambda n=n, b=b: CRF(n, batch_first=b))
            for n in (3, 5, 9)
            for b in (False, True)
        },
        reps=2,
    )


@library("torchmetrics", "torchmetrics")
def gen_torchmetrics(out: Path) -> None:
    import torchmetrics as tm

    makers = {
        "acc": lambda: tm.classification.MulticlassAccuracy(num_classes=3),
        "f1": lambda: tm.classification.MulticlassF1Score(num_classes=3, average=None),
        "auroc": lambda: tm.classification.BinaryAUROC(),
        "mse": lambda: tm.MeanSquaredError(),
        "collection": lambda: tm.MetricCollection(
            {"acc": tm.classification.BinaryAccuracy(), "prec": tm.classification.BinaryPrecision()}
        ),
        "confmat": lambda: tm.classification.MulticlassConfusionMatrix(num_classes=3),
    }
    for name, make in makers.items():
        for s in range(2):
            seed(s)
            m = make()
            m.persistent(True)
            if name in ("acc", "f1", "confmat"):
                m.update(torch.randint(0, 3, (8,)), torch.randint(0, 3, (8,)))
            elif name == "mse":
                m.update(torch.randn(8), torch.randn(8))
            else:
                m.update(torch.rand(8), torch.randint(0, 2, (8,)))
            torch.save(m.state_dict(), out / f"{name}-{s}.pt")
            if s == 0:
                torch.save(m, out / f"{name}.whole.pt")


@library("skorch", "skorch")
def gen_skorch(out: Path) -> None:
    import numpy as np
    from skorch import NeuralNetClassifier, NeuralNetRegressor

    for i in range(6):
        seed(i)
        x = np.random.randn(20, 6).astype("float32")
        if i % 2:
            net: Any = NeuralNetRegressor(
                MLP, module__o=1, max_epochs=2, lr=0.05, verbose=0, train_split=None
            )
            net.fit(x, np.random.randn(20, 1).astype("float32"))
        else:
            net = NeuralNetClassifier(
                MLP,
                module__o=3,
                max_epochs=2,
                lr=0.05,
                verbose=0,
                criterion=nn.CrossEntropyLoss,
                train_split=None,
                optimizer=[torch.optim.SGD, torch.optim.Adam][i % 4 // 2],
            )
            net.fit(x, np.random.randint(0, 3, 20))
        net.save_params(
            f_params=str(out / f"params-{i}.pt"),
            f_optimizer=str(out / f"optim-{i}.pt"),
            f_criterion=str(out / f"criterion-{i}.pt"),
            f_history=str(out / f"history-{i}.json"),
        )
        if i < 2:
            torch.save(net.module_, out / f"module-{i}.whole.pt")


@library("pytorch-tabnet", "pytorch_tabnet")
def gen_tabnet(out: Path) -> None:
    import numpy as np
    from pytorch_tabnet.tab_model import TabNetClassifier, TabNetRegressor

    for i in range(6):
        seed(i)
        x = np.random.randn(64, 5).astype("float32")
        if i % 2:
            m: Any = TabNetRegressor(n_d=4, n_a=4, n_steps=2, seed=i, verbose=0)
            m.fit(x, np.random.randn(64, 1), max_epochs=1, batch_size=32, virtual_batch_size=16)
        else:
            m = TabNetClassifier(n_d=4, n_a=4, n_steps=2 + i % 3, seed=i, verbose=0)
            m.fit(
                x, np.random.randint(0, 2, 64), max_epochs=1, batch_size=32, virtual_batch_size=16
            )
        torch.save(m.network.state_dict(), out / f"network-{i}.pt")
        torch.save(m.network, out / f"network-{i}.whole.pt")
        m.save_model(str(out / f"tabnet-{i}"))  # a zip of model_params.json + network.pt
        import zipfile

        with zipfile.ZipFile(out / f"tabnet-{i}.zip") as z:
            (out / f"tabnet-{i}-network.pt").write_bytes(z.read("network.pt"))


@library("opacus", "opacus")
def gen_opacus(out: Path) -> None:
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    for i in range(6):
        seed(i)
        model = MLP(6, 4 + i, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = DataLoader(
            TensorDataset(torch.randn(16, 6), torch.randint(0, 2, (16,))), batch_size=8
        )
        pe = PrivacyEngine(accountant=["prv", "rdp", "gdp"][i % 3])
        model, opt, data = pe.make_private(
            module=model, optimizer=opt, data_loader=data, noise_multiplier=1.0, max_grad_norm=1.0
        )
        for xb, yb in data:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
        pe.save_checkpoint(
            path=str(out / f"private-{i}.pt"),
            module=model,
            optimizer=opt,
            checkpoint_dict={"epoch": 1},
        )
        torch.save(model._module.state_dict(), out / f"inner-{i}.pt")


@library("omegaconf", "omegaconf")
def gen_omegaconf(out: Path) -> None:
    from corpus_models import TrainConfig
    from omegaconf import OmegaConf

    for i in range(8):
        seed(i)
        cfg = (
            OmegaConf.structured(TrainConfig(hidden=8 + i))
            if i % 2
            else OmegaConf.create(
                {
                    "model": {"hidden": 8 + i, "act": "relu"},
                    "lr": 0.01 * i,
                    "seed": i,
                    "interp": "${lr}",
                    "list": [1, 2, {"x": i}],
                }
            )
        )
        net = MLP(6, 8, 2)
        torch.save(
            {
                "cfg": cfg,
                "state_dict": net.state_dict(),
                "resolved": OmegaConf.to_container(cfg, resolve=True),
            },
            out / f"cfg-{i}.pt",
        )


@library("hydra-core", "hydra")
def gen_hydra(out: Path) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.utils import instantiate

    conf = out / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "config.yaml").write_text(
        "model:\n  _target_: torch.nn.Linear\n  in_features: 4\n  out_features: 3\n"
        "optim:\n  lr: 0.01\n  name: sgd\nseed: 0\n"
    )
    for i in range(6):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(conf), version_base=None):
            cfg = compose("config", overrides=[f"seed={i}", f"model.out_features={2 + i}"])
        seed(i)
        model = instantiate(cfg.model)
        torch.save({"cfg": cfg, "model": model.state_dict(), "epoch": i}, out / f"hydra-{i}.pt")
    shutil.rmtree(conf)


@library("torch (plain save paths)", "torch")
def gen_torch(out: Path) -> None:
    for i in range(3 * SEEDS):
        seed(i)
        m = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 3))
        torch.jit.save(torch.jit.script(m), str(out / f"scripted-{i}.pt"))
        torch.save(m.state_dict(), out / f"legacy-{i}.pt", _use_new_zipfile_serialization=False)
        torch.save(
            {"m": m.state_dict(), "p": [1, 2.5, "x"]}, out / f"proto2-{i}.pt", pickle_protocol=2
        )
        torch.save(nn.LSTM(3, 4, 2).state_dict(), out / f"lstm-{i}.pt")


# ---- torch's view of each file ----------------------------------------------------------------


def _sha_leaves(obj: Any) -> tuple[list[list[Any]], list[list[Any]]]:
    from tests import _expected_names as en

    exp = en.expected_names(obj)
    leaves = [
        [name, leaf.kind, leaf.dtype, list(leaf.shape), leaf.sha256] for name, leaf in exp.leaves
    ]
    return leaves, [list(s) for s in exp.sets]


def _torch_view(path: Path, lib: str) -> dict[str, Any] | None:
    from skeleton import of_torch

    if path.is_dir() and (path / "latest").is_file():  # a DeepSpeed ZeRO checkpoint
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            weights = dict(get_fp32_state_dict_from_zero_checkpoint(str(path)))
        leaves, sets = _sha_leaves(weights)
        # torch has no one object for the directory (torchless.load assembles the model
        # states with the consolidated weights): no skeleton, the load column says n/a
        return {
            "library": lib,
            "kind": "zero",
            "leaves": leaves,
            "sets": sets,
            "skeleton": None,
            "size": _size(path),
        }
    if path.is_dir():
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as tmp:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dcp_to_torch_save(str(path), f"{tmp}/full.pt")
            obj = torch.load(f"{tmp}/full.pt", weights_only=False, map_location="cpu")
        kind = "dcp"
    else:
        try:
            with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
                warnings.simplefilter("ignore")
                obj = torch.load(path, weights_only=False, map_location="cpu")
        except Exception:
            return None
        kind = "file"
    leaves, sets = _sha_leaves(obj)
    return {
        "library": lib,
        "kind": kind,
        "leaves": leaves,
        "sets": sets,
        "skeleton": of_torch(obj),
        "size": _size(path),
    }


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def _candidates(lib_dir: Path) -> list[Path]:
    """Every file that may be a checkpoint, every DCP directory, and every DeepSpeed ZeRO
    checkpoint directory (stages 1-3: its optimizer partitions and ZeRO-3 model-states files
    are read through the directory, which is what they are part of; not one by one)."""
    found: list[Path] = []
    dcp_dirs = {p.parent for p in lib_dir.rglob(".metadata")}
    zero_dirs = {
        p.parent for p in lib_dir.rglob("latest") if any(p.parent.glob("*/*optim_states.pt"))
    }
    found += sorted(dcp_dirs) + sorted(zero_dirs)
    for p in sorted(lib_dir.rglob("*")):
        if (
            p.is_file()
            and p.suffix.lower() not in SKIP_EXT
            and not p.name.startswith(".")
            and not any(d in p.parents for d in dcp_dirs)
            and p.name != "latest"
            and not p.name.endswith("optim_states.pt")
            and not p.name.startswith("zero_pp_rank_")
        ):
            found.append(p)
    return found


def _version(module: str) -> str:
    from importlib import metadata

    top = module.split(".")[0]
    dist = {
        "torchcrf": "pytorch-crf",
        "pyro": "pyro-ppl",
        "hydra": "hydra-core",
        "torch_geometric": "torch-geometric",
        "sentence_transformers": "sentence-transformers",
    }.get(top, top.replace("_", "-"))
    try:
        return metadata.version(dist)
    except Exception:
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--only", default="", help="comma-separated library names")
    ap.add_argument(
        "--seeds",
        type=int,
        default=SEEDS,
        help="seeds per variant of the table-driven generators (default 2)",
    )
    args = ap.parse_args()
    globals()["SEEDS"] = args.seeds
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    out: Path = args.out
    manifest_path = out / "MANIFEST.json"
    manifest: dict[str, Any] = {
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "libraries": {},
        "files": {},
    }
    if manifest_path.exists() and only:
        manifest = json.loads(manifest_path.read_text())
    warnings.simplefilter("ignore")
    for name, why in NOT_USED.items():
        manifest["libraries"][name] = {"module": name, "status": "skipped", "why": why}
    for name, module, fn in GENERATORS:
        if only and name not in only:
            continue
        lib_dir = out / name.replace(" ", "_").replace("(", "").replace(")", "")
        shutil.rmtree(lib_dir, ignore_errors=True)
        for key in [k for k, v in manifest["files"].items() if v["library"] == name]:
            del manifest["files"][key]
        lib_dir.mkdir(parents=True)
        t0 = time.time()
        entry: dict[str, Any] = {"module": module}
        try:
            importlib.import_module(module)
            entry["version"] = _version(module)
        except Exception as e:
            entry.update(status="skipped", why=f"import failed: {type(e).__name__}: {e}"[:300])
            manifest["libraries"][name] = entry
            shutil.rmtree(lib_dir)
            print(f"{name}: skipped ({entry['why']})", flush=True)
            continue
        try:
            with contextlib.redirect_stdout(io.StringIO()) as captured:
                fn(lib_dir)
        except Exception as e:
            tb = traceback.format_exc(limit=3)
            entry.update(status="skipped", why=f"generator failed: {type(e).__name__}: {e}"[:300])
            manifest["libraries"][name] = entry
            shutil.rmtree(lib_dir)
            print(f"{name}: skipped ({entry['why']})\n{tb}", flush=True)
            continue
        for line in captured.getvalue().splitlines():
            if line.startswith("  "):
                print(line)
        n = 0
        for p in _candidates(lib_dir):
            view = _torch_view(p, name)
            if view is not None:
                manifest["files"][p.relative_to(out).as_posix()] = view
                n += 1
        entry.update(status="used", files=n, seconds=round(time.time() - t0, 1))
        manifest["libraries"][name] = entry
        print(f"{name}: {n} files ({entry['seconds']} s)", flush=True)
        manifest_path.write_text(json.dumps(manifest, indent=0))
    digest = hashlib.sha256(json.dumps(manifest["files"], sort_keys=True).encode()).hexdigest()
    manifest["digest"] = digest
    manifest_path.write_text(json.dumps(manifest, indent=0))
    used = [k for k, v in manifest["libraries"].items() if v["status"] == "used"]
    print(f"{len(manifest['files'])} files from {len(used)} libraries -> {manifest_path}")


if __name__ == "__main__":
    main()
