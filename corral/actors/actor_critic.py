"""Actor-critic for on-policy algorithms (PPO, A2C): policy and value networks plus
the observation normalizer, all in one ``state_dict``."""

from __future__ import annotations

import math

import gymnasium as gym
import torch
from torch import nn

from corral.actors.normalizer import RunningNormalizer
from corral.nets import (CategoricalHead, DiagGaussianHead, MultiCategoricalHead, NatureCNN, ParallelMLP,
                         is_image_space)


class ActionScaler(nn.Module):
    """Maps the policy's unit-space action to a Box's bounds.

    Finite bounds: ``low + (clip(a, -1, 1) + 1) / 2 * (high - low)``, so a unit
    Gaussian covers the whole range whatever its width. Infinite bounds: identity.
    """

    def __init__(self, space: gym.spaces.Box):
        super().__init__()
        low = torch.as_tensor(space.low, dtype=torch.float32)
        high = torch.as_tensor(space.high, dtype=torch.float32)
        self.bounded = bool(torch.isfinite(low).all() and torch.isfinite(high).all())
        self.register_buffer("low", torch.where(torch.isfinite(low), low, torch.zeros_like(low)))
        self.register_buffer("high", torch.where(torch.isfinite(high), high, torch.zeros_like(high)))

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        if not self.bounded:
            return a
        return self.low + (a.clamp(-1.0, 1.0) + 1.0) * 0.5 * (self.high - self.low)


class ActorCritic(nn.Module):
    def __init__(
        self,
        obs_space: gym.spaces.Box,
        act_space: gym.Space,
        hidden: tuple[int, ...] = (64, 64),
        activation: str = "tanh",
        normalize_obs: bool = True,
        log_std_init: float = 0.0,
    ):
        super().__init__()
        self.obs_shape = tuple(obs_space.shape)
        # Images go through a shared Nature CNN (scaled inside, stored as uint8); vectors
        # through the running normalizer, then separate policy and value MLPs.
        self.image = is_image_space(obs_space)
        self.obs_norm = RunningNormalizer(self.obs_shape, enabled=normalize_obs and not self.image)
        self.cnn = NatureCNN(self.obs_shape) if self.image else None
        in_dim = self.cnn.out_dim if self.image else int(math.prod(self.obs_shape))
        self.discrete = isinstance(act_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary))
        if isinstance(act_space, gym.spaces.Discrete):
            pi_out = int(act_space.n)
            self.head = CategoricalHead()
            self.scaler = None
        elif isinstance(act_space, (gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
            nvec = act_space.nvec.reshape(-1).tolist() if isinstance(act_space, gym.spaces.MultiDiscrete) \
                else [2] * int(math.prod(act_space.shape))
            pi_out = int(sum(nvec))
            self.head = MultiCategoricalHead(nvec)
            self.scaler = None
        elif isinstance(act_space, gym.spaces.Box):
            pi_out = int(math.prod(act_space.shape))
            self.head = DiagGaussianHead(pi_out, log_std_init)
            self.scaler = ActionScaler(act_space)
        else:
            raise ValueError(f"ActorCritic supports Discrete, MultiDiscrete, MultiBinary and Box actions, got {act_space}")
        # Member 0 is the policy (logits / mean, small init so the first policy is near
        # uniform), member 1 the value (column 0). Separate weights, one batched module.
        self.body = ParallelMLP(2, in_dim, hidden, activation, out_dim=pi_out, out_gains=(0.01, 1.0))
        self.act_shape = tuple(act_space.shape)

    # --- pieces the algorithm uses on stored (already normalized) observations
    def normalize(self, obs: torch.Tensor, update: bool = False) -> torch.Tensor:
        """What rollouts store: normalized flat vectors, or raw uint8 images."""
        if self.image:
            return obs
        if update:
            self.obs_norm.update(obs)
        return self.obs_norm(obs).flatten(1)

    def stored_action(self) -> tuple[tuple[int, ...], torch.dtype]:
        """Shape and dtype of one sampled (policy-space) action as rollouts store it."""
        if isinstance(self.head, CategoricalHead):
            return (), torch.long
        if isinstance(self.head, MultiCategoricalHead):
            return (len(self.head.nvec),), torch.long
        return (int(self.head.log_std.numel()),), torch.float32

    def stored_obs(self) -> tuple[tuple[int, ...], torch.dtype]:
        """Shape and dtype of one stored observation (see ``normalize``)."""
        if self.image:
            return self.obs_shape, torch.uint8
        return (int(math.prod(self.obs_shape)),), torch.float32

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Distribution parameters and value for normalized observations."""
        out = self.body(self.cnn(x) if self.cnn is not None else x)
        return self.head(out[0]), out[1, :, 0]

    def dist_params(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)[0]

    def value(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)[1]

    def evaluate_actions(self, x: torch.Tensor, action: torch.Tensor):
        params, value = self.forward(x)
        return self.head.log_prob(params, action), self.head.entropy(params), value

    def to_env(self, action: torch.Tensor) -> torch.Tensor:
        if self.discrete:
            return action.reshape(action.shape[0], *self.act_shape)
        return self.scaler(action).reshape(action.shape[0], *self.act_shape)

    def explore(self, obs: torch.Tensor, generator: torch.Generator | None = None):
        """Sample for training: (env_action, action, log_prob, value, normalized obs).
        Called under ``torch.no_grad()`` by the Learner (no decorator: it is the hot path)."""
        x = self.normalize(obs, update=True)
        params, value = self.forward(x)
        action = self.head.sample(params, generator)
        return self.to_env(action), action, self.head.log_prob(params, action), value, x

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True, generator: torch.Generator | None = None) -> torch.Tensor:
        """Env actions for a batch of raw observations; never updates the normalizer."""
        x = self.normalize(obs)
        params = self.dist_params(x)
        action = self.head.mode(params) if deterministic else self.head.sample(params, generator)
        return self.to_env(action)
