#!/usr/bin/env python
"""Write the benign half of the labelled scan set: real output of the libraries checkpoints carry.

Run once with an interpreter that has torch, numpy, omegaconf, transformers and lightning
(``python make_benign.py OUT``); the files and ``manifest.json`` it writes are committed under
``tests/data/labelled/benign`` (the test suite does not need those libraries). Every file is
written by ``torch.save`` (Lightning: ``Trainer.save_checkpoint``), never by hand: each one
is what a real training script leaves on disk.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import pathlib
import re
import sys
import uuid
import zoneinfo
from pathlib import Path
from typing import Any


def _cases() -> dict[str, tuple[str, Any]]:
    import numpy as np
    import torch

    lin = torch.nn.Linear(3, 2)
    out: dict[str, tuple[str, Any]] = {}
    out["numpy2_rng_generator"] = ("NumPy 2 Generator (PCG64 + SeedSequence) in a checkpoint",
                                   {"rng": np.random.default_rng(1234), "w": lin.state_dict()})
    out["numpy_random_state"] = ("legacy NumPy RandomState", {"rs": np.random.RandomState(7)})
    out["numpy_dtype_class_ref"] = ("numpy.float32 kept as a class reference, and arrays",
                                    {"dtype": np.float32, "arr": np.arange(6.0).reshape(2, 3),
                                     "scalar": np.float32(1.5), "i": np.int64(3)})
    tz = zoneinfo.ZoneInfo("Europe/Paris")
    stamp = datetime.datetime(2025, 3, 1, 12, 0, tzinfo=tz)
    out["zoneinfo_datetime_p2"] = ("zoneinfo datetime, pickle protocol 2 (getattr on ZoneInfo)",
                                   ({"saved_at": stamp, "w": lin.state_dict()}, 2))
    out["zoneinfo_datetime_p4"] = ("zoneinfo datetime, pickle protocol 4", {"saved_at": stamp})
    out["stdlib_values"] = ("stdlib values: paths, uuid, regex, Namespace, timedelta, deque",
                            {"path": pathlib.Path("/data/run1"), "id": uuid.UUID(int=5),
                             "pat": re.compile(r"layer\.(\d+)", re.I),
                             "args": argparse.Namespace(lr=0.1, epochs=3),
                             "dt": datetime.timedelta(hours=1),
                             "dq": __import__("collections").deque([1, 2], maxlen=4),
                             "fs": frozenset({1, 2}), "c": complex(1, 2),
                             "odict": __import__("collections").OrderedDict(a=1)})
    out["plain_function_ref"] = ("a plain function reference never called (activation)",
                                 {"act": torch.nn.functional.gelu, "fn": torch.sigmoid,
                                  "w": lin.state_dict()})
    out["hydra_style_partial"] = ("Hydra-style partial config: functools.partial(AdamW, lr=…)",
                                  {"optimizer": functools.partial(torch.optim.AdamW, lr=1e-3,
                                                                  weight_decay=0.01),
                                   "sched": functools.partial(
                                       torch.optim.lr_scheduler.StepLR, step_size=10)})
    out["full_module"] = ("a whole nn.Module saved (torch.save(model))",
                          torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))
    opt = torch.optim.AdamW(lin.parameters(), lr=0.01)
    lin(torch.ones(1, 3)).sum().backward()
    opt.step()
    out["optimizer_state"] = ("optimizer state_dict and a generator state",
                              {"opt": opt.state_dict(), "gen": torch.Generator().manual_seed(3),
                               "rng": torch.get_rng_state()})
    out["re_regexflag_enum"] = ("a stdlib enum (re.RegexFlag) and an int enum",
                                {"flags": re.IGNORECASE | re.MULTILINE})
    try:
        import omegaconf

        cfg = omegaconf.OmegaConf.create({"model": {"dim": 8, "act": "gelu"},
                                          "lr": "${oc.env:LR,0.1}", "layers": [1, 2]})
        out["omegaconf_dictconfig"] = ("omegaconf DictConfig with an interpolation",
                                       {"cfg": cfg, "state_dict": lin.state_dict()})
    except ImportError:
        print("omegaconf not installed", file=sys.stderr)
    try:
        from transformers import BertConfig, GenerationConfig, TrainingArguments

        args = TrainingArguments(output_dir="/tmp/labelled-out", learning_rate=3e-5,
                                 report_to=[], save_strategy="epoch")
        out["transformers_training_args"] = ("transformers TrainingArguments (dataclass with "
                                             "enums) as Trainer saves training_args.bin", args)
        out["transformers_config"] = ("transformers BertConfig and GenerationConfig",
                                      {"config": BertConfig(hidden_size=32, num_hidden_layers=1,
                                                            num_attention_heads=2,
                                                            intermediate_size=8),
                                       "gen": GenerationConfig(max_new_tokens=4)})
    except ImportError as e:
        print(f"transformers not installed: {e}", file=sys.stderr)
    return out


def _lightning(out: Path, manifest: list[dict[str, str]]) -> None:
    try:
        import lightning as L
        import torch
    except ImportError as e:
        print(f"lightning not installed: {e}", file=sys.stderr)
        return

    class Tiny(L.LightningModule):
        def __init__(self, lr: float = 0.1, hidden: int = 4) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(2, hidden)

        def training_step(self, batch: Any, idx: int) -> Any:
            return self.layer(batch[0]).sum()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.ones(4, 2)), batch_size=2)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=True,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(out / "_lightning"), accelerator="cpu")
    trainer.fit(Tiny(), data)
    path = out / "lightning_checkpoint.ckpt"
    trainer.save_checkpoint(str(path))
    manifest.append({"file": path.name, "label": "benign",
                     "technique": "Lightning Trainer.save_checkpoint (hparams AttributeDict, "
                                  "callbacks, loops, optimizer state)"})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    manifest: list[dict[str, str]] = []
    for name, (what, obj) in _cases().items():
        protocol = 2
        if isinstance(obj, tuple) and len(obj) == 2 and obj[1] == 2:
            obj = obj[0]
        elif name.endswith("_p4"):
            protocol = 4
        path = args.out / f"{name}.pt"
        torch.save(obj, path, pickle_protocol=protocol)
        manifest.append({"file": path.name, "label": "benign", "technique": what})
    _lightning(args.out, manifest)
    import shutil

    shutil.rmtree(args.out / "_lightning", ignore_errors=True)
    versions = {}
    for mod in ("torch", "numpy", "omegaconf", "transformers", "lightning"):
        try:
            versions[mod] = __import__(mod).__version__
        except ImportError:
            versions[mod] = "not installed"
    (args.out / "manifest.json").write_text(json.dumps(
        {"written_by": versions, "python": sys.version.split()[0], "cases": manifest},
        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
