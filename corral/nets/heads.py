"""The policy heads: distributions over actions from a network's raw outputs (logits, means)."""

from __future__ import annotations

import math

import torch
from torch import nn


class CategoricalHead(nn.Module):
    """Log-probabilities from logits for a Discrete action space. Sampling takes an
    explicit generator so action sampling has its own random stream."""

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits, dim=-1)

    @staticmethod
    def sample(logp: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        # Exponential race (Gumbel-max with -log E, E ~ Exp(1), as the Gumbel noise): one
        # draw per logit, argmax_i p_i / E_i is distributed as p, no host sync.
        e = torch.empty_like(logp).exponential_(generator=generator)
        return (logp - e.log_()).argmax(-1)

    @staticmethod
    def mode(logp: torch.Tensor) -> torch.Tensor:
        return logp.argmax(-1)

    @staticmethod
    def log_prob(logp: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return logp.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)

    @staticmethod
    def entropy(logp: torch.Tensor) -> torch.Tensor:
        return -(logp.exp() * logp).sum(-1)


class MultiCategoricalHead(nn.Module):
    """Independent categoricals for MultiDiscrete (and MultiBinary as nvec=[2]*n).

    ``forward`` takes the concatenated logits ``[B, sum(nvec)]`` and returns the
    per-branch log-probabilities in the same layout; actions are ``[B, len(nvec)]``.
    """

    def __init__(self, nvec: list[int]):
        super().__init__()
        self.nvec = [int(n) for n in nvec]

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.log_softmax(x, -1) for x in logits.split(self.nvec, -1)], -1)

    def _branches(self, logp: torch.Tensor):
        return logp.split(self.nvec, -1)

    def sample(self, logp: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return torch.stack([CategoricalHead.sample(x, generator) for x in self._branches(logp)], -1)

    def mode(self, logp: torch.Tensor) -> torch.Tensor:
        return torch.stack([x.argmax(-1) for x in self._branches(logp)], -1)

    def log_prob(self, logp: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return sum(CategoricalHead.log_prob(x, action[..., i]) for i, x in enumerate(self._branches(logp)))

    def entropy(self, logp: torch.Tensor) -> torch.Tensor:
        return sum(CategoricalHead.entropy(x) for x in self._branches(logp))


class DiagGaussianHead(nn.Module):
    """Diagonal Gaussian with a state-independent log-std, in the policy's unit space.

    ``forward(mean)`` returns ``cat([mean, log_std])``. Actions are sampled unbounded;
    the actor maps them to the env's bounds so log-probs stay those of the sampled value.
    """

    def __init__(self, act_dim: int, log_std_init: float = 0.0):
        super().__init__()
        self.log_std = nn.Parameter(torch.full((act_dim,), float(log_std_init)))

    def forward(self, mean: torch.Tensor) -> torch.Tensor:
        return torch.cat([mean, self.log_std.expand_as(mean)], dim=-1)

    @staticmethod
    def sample(params: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        mean, log_std = params.chunk(2, dim=-1)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device)
        return mean + log_std.exp() * noise

    @staticmethod
    def mode(params: torch.Tensor) -> torch.Tensor:
        return params.chunk(2, dim=-1)[0]

    @staticmethod
    def log_prob(params: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        mean, log_std = params.chunk(2, dim=-1)
        z = (action - mean) * torch.exp(-log_std)
        return (-0.5 * z.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    @staticmethod
    def entropy(params: torch.Tensor) -> torch.Tensor:
        log_std = params.chunk(2, dim=-1)[1]
        return (log_std + 0.5 * (1.0 + math.log(2 * math.pi))).sum(-1)
