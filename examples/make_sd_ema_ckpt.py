"""Writes examples/sd-ema.ckpt: a tiny checkpoint laid out as a Stable Diffusion (ldm)
training checkpoint with its EMA copy: ``model.diffusion_model.*`` (the UNet),
``model_ema.*`` (ldm's ``LitEma``: one buffer per trainable parameter, named by the
parameter's name with the dots removed, plus ``decay`` and ``num_updates``),
``first_stage_model.*`` and ``cond_stage_model.*`` (frozen), under ``state_dict`` as
Lightning saves it. Needs torch; deterministic. Run: python examples/make_sd_ema_ckpt.py"""

from __future__ import annotations

import pathlib

import torch
from torch import nn


class UNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.time_embed = nn.Sequential(nn.Linear(4, 8), nn.SiLU(), nn.Linear(8, 8))
        self.input_blocks = nn.ModuleList([nn.Sequential(nn.Conv2d(4, 8, 3, padding=1))])
        self.out = nn.Sequential(nn.GroupNorm(2, 8), nn.SiLU(), nn.Conv2d(8, 4, 1))


class DiffusionWrapper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.diffusion_model = UNet()


class LitEma(nn.Module):
    """As ldm/modules/ema.py builds and updates it."""

    def __init__(self, model: nn.Module, decay: float = 0.9999) -> None:
        super().__init__()
        self.register_buffer("decay", torch.tensor(decay, dtype=torch.float32))
        self.register_buffer("num_updates", torch.tensor(0, dtype=torch.int))
        for name, p in model.named_parameters():
            self.register_buffer(name.replace(".", ""), p.clone().detach().data)

    def forward(self, model: nn.Module) -> None:
        self.num_updates += 1
        decay = min(self.decay, (1 + self.num_updates) / (10 + self.num_updates))
        shadow = dict(self.named_buffers())
        with torch.no_grad():
            for name, p in model.named_parameters():
                s = shadow[name.replace(".", "")]
                s.sub_((1.0 - decay) * (s - p))


class LatentDiffusion(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = DiffusionWrapper()
        self.model_ema = LitEma(self.model)
        self.first_stage_model = nn.Conv2d(3, 4, 1)
        self.cond_stage_model = nn.Embedding(10, 8)


def main() -> None:
    torch.manual_seed(0)
    ld = LatentDiffusion()
    for _ in range(3):  # training steps, each followed by the EMA update
        with torch.no_grad():
            for p in ld.model.parameters():
                p.add_(0.1 * torch.randn_like(p))
        ld.model_ema(ld.model)
    ckpt = {"epoch": 0, "global_step": 3, "pytorch-lightning_version": "1.4.2",
            "state_dict": ld.state_dict()}
    torch.save(ckpt, pathlib.Path(__file__).with_name("sd-ema.ckpt"))


if __name__ == "__main__":
    main()
