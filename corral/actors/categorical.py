"""Networks of SAC for discrete actions: a categorical policy pi(. | s) and an ensemble of
Q(s, .) critics that output every action's value at once, evaluated as one batched module."""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn

from corral.actors.offpolicy import ObsEncoder
from corral.nets import MLP, ParallelMLP


class CategoricalActor(nn.Module):
    """log pi(. | s) over a Discrete space's actions; acting samples it or takes its argmax."""

    def __init__(self, obs_space, act_space: gym.spaces.Discrete, hidden=(256, 256), activation="relu",
                 normalize_obs: bool = False):
        super().__init__()
        self.enc = ObsEncoder(obs_space, normalize_obs)
        self.n = int(act_space.n)
        # a small last layer: the policy starts close to uniform, where its entropy is log|A|
        self.net = MLP(self.enc.dim, hidden, activation, out_dim=self.n, out_gain=0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, actions]`` log-probabilities from encoded observations."""
        return torch.log_softmax(self.net(x), dim=-1)

    def sample(self, log_probs: torch.Tensor, generator=None) -> torch.Tensor:
        """One action per row, by inverting the CDF at one uniform draw per row."""
        u = torch.rand(log_probs.shape[0], 1, generator=generator, device=log_probs.device)
        cdf = log_probs.exp().cumsum(-1)
        # the last action takes whatever rounding leaves above cdf[-1]
        return (cdf < u).sum(-1).clamp_(max=self.n - 1)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True, generator=None) -> torch.Tensor:
        log_probs = self(self.enc(obs))
        return log_probs.argmax(-1) if deterministic else self.sample(log_probs, generator)


class DiscreteCritics(nn.Module):
    """``n`` independent Q(s, .) networks as one batched module -> ``[n, B, actions]``.

    As ``corral.actors.offpolicy.Critics``: with ``obs_space`` the critics have an encoder
    of their own (pixels: a Nature CNN shared by the ``n`` heads, trained by the critic
    loss) and see raw observations; otherwise they see the actor encoder's output."""

    def __init__(self, obs_dim: int, n_actions: int, n: int = 2, hidden=(256, 256), activation="relu",
                 obs_space: gym.Space | None = None):
        super().__init__()
        self.n = n
        self.enc = ObsEncoder(obs_space, False) if obs_space is not None else None
        if self.enc is not None:
            obs_dim = self.enc.dim
        self.net = ParallelMLP(n, obs_dim, hidden, activation, out_dim=n_actions, out_gains=tuple([1.0] * n))

    def view(self, raw: torch.Tensor, encoded: torch.Tensor) -> torch.Tensor:
        """What ``forward`` takes: raw observations for an own encoder, else the actor encoder's output."""
        return raw if self.enc is not None else encoded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.enc is not None:
            x = self.enc(x)
        return self.net(x)
