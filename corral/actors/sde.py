"""The Gaussian policies with gSDE's state-dependent exploration (``corral.nets.sde``): the SAC
family's squashed actor and the on-policy actor-critic. Each exposes the features ``phi(s)``
the noise is built from (the policy's last hidden layer) and takes the unit-normal draws
``z`` of its exploration matrices from the algorithm, which owns when they are redrawn
(``corral.algos.sde``)."""

from __future__ import annotations

import math

import gymnasium as gym
import torch
from torch import nn

from corral.actors.actor_critic import ActorCritic
from corral.actors.offpolicy import ActionBox, ObsEncoder
from corral.nets import MLP, ParallelMLP, layer_init
from corral.nets.sde import StateDependentNoise


def tanh_log_det(pre: torch.Tensor) -> torch.Tensor:
    """``sum log(1 - tanh(pre)^2)`` over the action dims, in the stable form
    ``2 (log 2 - pre - softplus(-2 pre))`` (the squashed sample's change of variables)."""
    return (2.0 * (math.log(2.0) - pre - nn.functional.softplus(-2.0 * pre))).sum(-1)


class SDESquashedGaussianActor(nn.Module):
    """``tanh(mean(s) + phi(s) @ theta)``: SB3's SAC actor with ``use_sde``. ``phi`` is the last
    hidden layer, ``mean`` a linear layer on it clipped to ``[-clip_mean, clip_mean]`` (SB3's
    Hardtanh, 2 by default: it keeps the pre-tanh mean where tanh still has a gradient)."""

    def __init__(self, obs_space, act_space: gym.spaces.Box, hidden=(256, 256), activation="relu",
                 normalize_obs: bool = False, log_std_init: float = -3.0, full_std: bool = True,
                 use_expln: bool = False, clip_mean: float = 2.0):
        super().__init__()
        if not hidden:
            raise ValueError("gSDE builds its noise from the policy's last hidden layer: give hidden at least one layer")
        self.enc = ObsEncoder(obs_space, normalize_obs)
        self.box = ActionBox(act_space)
        self.net = MLP(self.enc.dim, hidden, activation)
        self.mu = layer_init(nn.Linear(self.net.out_dim, self.box.dim), gain=1.0)
        self.sde = StateDependentNoise(self.net.out_dim, self.box.dim, log_std_init, full_std, use_expln)
        self.clip_mean = float(clip_mean)

    def forward(self, x: torch.Tensor, generator=None, deterministic: bool = False, noise=None,
                log_prob: bool = True):
        """(action in [-1, 1], log-prob or None), as ``SquashedGaussianActor``'s; ``noise`` here is
        the exploration matrices' unit-normal draw, ``[L, A]`` or ``[B, L, A]`` (None: a fresh
        matrix per row from ``generator``)."""
        phi = self.net(x)
        mean = self.mu(phi)
        if self.clip_mean > 0:
            mean = mean.clamp(-self.clip_mean, self.clip_mean)
        if deterministic:
            return torch.tanh(mean), None
        if noise is None:
            noise = self.sde.draw(x.shape[0], generator)
        pre = mean + self.sde.noise(phi, noise)
        action = torch.tanh(pre)
        if not log_prob:
            return action, None
        logp = self.sde.log_prob(self.sde.params(mean, phi), pre) - tanh_log_det(pre)
        return action, logp

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True, generator=None) -> torch.Tensor:
        return self.box.to_env(self(self.enc(obs), generator, deterministic, log_prob=False)[0])


class SDEActorCritic(ActorCritic):
    """``ActorCritic`` with gSDE: the policy member's last hidden layer is ``phi``, the mean a
    linear layer on it (SB3's ``action_net``, gain 0.01), the value another on the value
    member's (gain 1); the action distribution is ``N(mean, (phi^2) @ (sigma^2))`` per
    dimension (not squashed: actions are clipped to the bounds, as with the plain head)."""

    def __init__(self, obs_space, act_space: gym.Space, hidden=(64, 64), activation="tanh",
                 normalize_obs: bool = True, log_std_init: float = 0.0, extractor: nn.Module | None = None,
                 init: str = "orthogonal", full_std: bool = True, use_expln: bool = False):
        if not isinstance(act_space, gym.spaces.Box):
            raise ValueError(f"gSDE explores in continuous actions (a Box space), got {act_space}")
        if not hidden:
            raise ValueError("gSDE builds its noise from the policy's last hidden layer: give hidden at least one layer")
        super().__init__(obs_space, act_space, hidden, activation, normalize_obs, log_std_init,
                         extractor=extractor, init=init)
        act_dim = int(math.prod(act_space.shape))
        self.head = StateDependentNoise(hidden[-1], act_dim, log_std_init, full_std, use_expln)

    def make_body(self, in_dim: int, hidden: tuple[int, ...], activation: str, pi_out: int) -> nn.Module:
        """The two hidden stacks ``[2, B, H]``; the mean and value layers beside them."""
        keep = (lambda layer, gain: layer) if self.init == "torch" else layer_init
        self.action_net = keep(nn.Linear(hidden[-1], pi_out), gain=0.01)
        self.value_net = keep(nn.Linear(hidden[-1], 1), gain=1.0)
        return ParallelMLP(2, in_dim, hidden, activation, init=self.init)

    def latent(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(phi, mean, value)`` for stored observations."""
        h = self.body(self.features(x))
        return h[0], self.action_net(h[0]), self.value_net(h[1])[:, 0]

    def heads(self, x: torch.Tensor, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(features)
        return self.action_net(h[0]), self.value_net(h[1])[:, 0]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cat([mean, per-dimension log std])`` and the value."""
        phi, mean, value = self.latent(x)
        return self.head.params(mean, phi), value

    def stored_action(self) -> tuple[tuple[int, ...], torch.dtype]:
        return (self.head.act_dim,), torch.float32

    def explore(self, obs: torch.Tensor, generator: torch.Generator | None = None, noise=None):
        """``ActorCritic.explore`` with the action ``mean + phi @ theta``; ``noise``: each row's
        exploration matrix draw ``[N, L, A]`` (None: a fresh one per row from ``generator``)."""
        x = self.normalize(obs, update=True)
        phi, mean, value = self.latent(x)
        if noise is None:
            noise = self.head.draw(x.shape[0], generator)
        action = mean + self.head.noise(phi, noise)
        log_prob = self.head.log_prob(self.head.params(mean, phi), action)
        return self.to_env(action), action, log_prob, value, x
