"""Writes examples/lightning.ckpt: a small checkpoint with the keys PyTorch Lightning 2.x
saves (a two-block transformer, AdamW state, a cosine scheduler, callbacks, hyper-parameters
and loop progress). Needs torch; deterministic. Run: python examples/make_lightning_ckpt.py"""

from __future__ import annotations

import pathlib

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 64, d: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def main() -> None:
    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)
    for _ in range(3):
        idx = torch.randint(0, 64, (4, 8))
        loss = nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    ckpt = {
        "epoch": 2, "global_step": 1500, "pytorch-lightning_version": "2.6.0",
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "loops": {"fit_loop": {"epoch_progress": {"total": {"ready": 3, "completed": 2}}}},
        "callbacks": {
            "ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min', 'every_n_train_steps': 0}": {
                "monitor": "val_loss", "best_model_score": torch.tensor(2.731),
                "best_model_path": "checkpoints/epoch=1-step=1000.ckpt"},
            "EarlyStopping{'monitor': 'val_loss', 'mode': 'min'}": {
                "wait_count": 0, "stopped_epoch": 0, "best_score": torch.tensor(2.731),
                "patience": 3}},
        "optimizer_states": [opt.state_dict()], "lr_schedulers": [sched.state_dict()],
        "hparams_name": "kwargs",
        "hyper_parameters": {"vocab_size": 64, "d_model": 16, "n_layers": 2, "lr": 3e-4,
                             "weight_decay": 0.1, "max_steps": 1000},
    }
    torch.save(ckpt, pathlib.Path(__file__).with_name("lightning.ckpt"))


if __name__ == "__main__":
    main()
