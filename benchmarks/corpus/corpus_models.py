"""The few model classes the corpus generator defines itself (a module, not ``__main__``, so
that whole-model saves name ``corpus_models.X`` as a user's project module would be named)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, i: int = 6, h: int = 8, o: int = 3) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(i, h), nn.ReLU(), nn.Linear(h, o))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ODEFunc(nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, h), nn.Tanh(), nn.Linear(h, 2))

    def forward(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.net(y)


class SDE(nn.Module):
    noise_type = "diagonal"
    sde_type = "ito"

    def __init__(self, h: int) -> None:
        super().__init__()
        self.mu = nn.Linear(2, 2)
        self.sigma = nn.Sequential(nn.Linear(2, h), nn.Softplus(), nn.Linear(h, 2))

    def f(self, t: Any, y: torch.Tensor) -> torch.Tensor:
        return self.mu(y)

    def g(self, t: Any, y: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.sigma(y))


try:
    import gpytorch

    class GP(gpytorch.models.ExactGP):  # type: ignore[misc]
        def __init__(self, x: Any, y: Any, lik: Any, kernel: Any) -> None:
            super().__init__(x, y, lik)
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(kernel)

        def forward(self, x: Any) -> Any:
            return gpytorch.distributions.MultivariateNormal(
                self.mean_module(x), self.covar_module(x)
            )
except ImportError:  # the gpytorch generator is then skipped
    pass


@dataclass
class OptimConfig:
    name: str = "adam"
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])


@dataclass
class TrainConfig:
    hidden: int = 8
    optim: OptimConfig = field(default_factory=OptimConfig)
    tags: list[str] = field(default_factory=lambda: ["a", "b"])
