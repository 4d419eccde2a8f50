"""The Intrinsic Curiosity Module (Pathak, Agrawal, Efros and Darrell 2017, "Curiosity-driven
Exploration by Self-supervised Prediction"), the exploration bonus of ``ppo_icm``.

``ICM(obs_space, act_space, hidden, features, beta, eta, clip)``:

* **Encoder** ``phi(s)``: observations normalised by a running mean / std and clipped to
  ``+-clip`` (as RND reads them, ``corral.exploration.rnd``), then an MLP of ``hidden`` to
  ``features`` outputs (flat observations), or the Nature-CNN conv stack and a linear layer
  (uint8 images, every stacked frame, channels first).
* **Inverse model** ``g(phi(s_t), phi(s_t+1))`` predicts ``a_t``: logits for a Discrete action
  (one set per dimension for MultiDiscrete), the action itself for a Box. Its loss ``L_I`` is the
  cross-entropy (summed over MultiDiscrete dimensions, mean over the batch) or the mean squared
  error (mean over batch and action dimensions).
* **Forward model** ``f(phi(s_t), a_t)`` predicts ``phi(s_t+1)``; the action enters one-hot
  (Discrete, MultiDiscrete: one one-hot per dimension, concatenated) or as it is (Box). Its loss
  ``L_F = mean_b 1/2 ||f(phi(s_t), a_t) - phi(s_t+1)||^2`` (squares summed over features).
  **The features are detached in the forward loss**: the encoder is shaped by the inverse loss
  alone (the features only need to carry what the agent's action can change, the paper's
  argument), and the forward loss cannot shrink its own error by collapsing ``phi``.
* ``loss = (1 - beta) L_I + beta L_F`` (``beta`` 0.2, the paper's); trained with its own
  optimizer by its owner (``ppo_icm``), never summed into the policy's loss, so the paper's
  ``lambda`` (the policy loss's weight against the ICM's in one sum) is replaced by the two
  learning rates.
* **Intrinsic reward** ``r_t = eta / 2 ||f(phi(s_t), a_t) - phi(s_t+1)||^2``, computed without
  gradient (``reward``), the per-sample forward error times ``eta``.

Methods: ``select(obs)`` (the part the networks see: a flat vector, or channels-first frames;
already selected observations pass through), ``update_obs_norm(obs)``, ``encode(obs)``,
``action_input(actions)`` (one-hot / float), ``inverse_loss(phi, phi_next, actions)``,
``forward_errors(phi, phi_next, actions) -> [B]``, ``losses(obs, next_obs, actions) ->
(loss, inverse_loss, forward_loss)`` and ``reward(obs, next_obs, actions) -> [B]``. ``actions``
are the policy's actions as PPO's rollout stores them (indices for Discrete / MultiDiscrete;
for a Box, the Gaussian's sample before clipping).
"""

from __future__ import annotations

import math

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

from corral.actors.normalizer import RunningNormalizer
from corral.nets import MLP, NatureCNN, is_image_space


class ICM(nn.Module):
    def __init__(self, obs_space: gym.Space, act_space: gym.Space, hidden: tuple[int, ...] = (64, 64),
                 features: int = 64, beta: float = 0.2, eta: float = 1.0, clip: float = 5.0):
        super().__init__()
        if not isinstance(obs_space, gym.spaces.Box):
            raise ValueError(f"ICM needs Box observations (flat vectors or uint8 images), got {obs_space}")
        if isinstance(act_space, gym.spaces.Discrete):
            self.nvec: tuple[int, ...] | None = (int(act_space.n),)
        elif isinstance(act_space, gym.spaces.MultiDiscrete):
            self.nvec = tuple(int(n) for n in act_space.nvec.reshape(-1))
        elif isinstance(act_space, gym.spaces.Box):
            self.nvec = None
        else:
            raise ValueError(f"ICM takes Discrete, MultiDiscrete or Box actions, got {act_space}")
        self.beta, self.eta = beta, eta
        self.act_dim = sum(self.nvec) if self.nvec is not None else int(math.prod(act_space.shape))
        shape = tuple(obs_space.shape)
        self.image = is_image_space(obs_space)
        if self.image:
            self.channels_last = shape[-1] <= 4 < shape[0]
            in_shape = (shape[2], shape[0], shape[1]) if self.channels_last else shape
            conv = NatureCNN(in_shape, features).conv
            with torch.no_grad():
                flat = conv(torch.zeros(1, *in_shape)).shape[1]
            self.encoder = nn.Sequential(conv, MLP(flat, (), out_dim=features))
        else:
            self.channels_last = False
            in_shape = (int(math.prod(shape)),)
            self.encoder = MLP(in_shape[0], tuple(hidden), "relu", out_dim=features)
        width = hidden[-1] if hidden else features
        self.inverse = MLP(2 * features, (width,), "relu", out_dim=self.act_dim)
        self.forward_model = MLP(features + self.act_dim, (width,), "relu", out_dim=features)
        self.in_shape = in_shape
        self.features = features
        self.obs_norm = RunningNormalizer(in_shape, clip=clip)

    # --- observations
    def select(self, obs: torch.Tensor) -> torch.Tensor:
        if tuple(obs.shape[1:]) == self.in_shape:
            return obs
        if not self.image:
            return obs.reshape(obs.shape[0], -1)
        return obs.permute(0, 3, 1, 2) if self.channels_last else obs

    def update_obs_norm(self, obs: torch.Tensor) -> None:
        self.obs_norm.update(self.select(obs))

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.obs_norm(self.select(obs)))

    # --- the two models
    def action_input(self, actions: torch.Tensor) -> torch.Tensor:
        if self.nvec is None:
            return actions.reshape(actions.shape[0], -1).float()
        a = actions.reshape(actions.shape[0], -1).long()
        return torch.cat([F.one_hot(a[:, i], n).float() for i, n in enumerate(self.nvec)], dim=-1)

    def inverse_loss(self, phi: torch.Tensor, phi_next: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        pred = self.inverse(torch.cat([phi, phi_next], dim=-1))
        if self.nvec is None:
            return F.mse_loss(pred, actions.reshape(pred.shape).float())
        a = actions.reshape(actions.shape[0], -1).long()
        return sum(F.cross_entropy(logits, a[:, i])
                   for i, logits in enumerate(torch.split(pred, list(self.nvec), dim=-1)))

    def forward_errors(self, phi: torch.Tensor, phi_next: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """``[B]``: ``1/2 ||f(phi, a) - phi_next||^2``; the gradient reaches the forward model only."""
        phi, phi_next = phi.detach(), phi_next.detach()
        pred = self.forward_model(torch.cat([phi, self.action_input(actions)], dim=-1))
        return 0.5 * (pred - phi_next).square().sum(-1)

    def losses(self, obs: torch.Tensor, next_obs: torch.Tensor, actions: torch.Tensor):
        """``(loss, inverse_loss, forward_loss)``: ``loss = (1 - beta) L_I + beta L_F``."""
        phi, phi_next = self.encode(obs), self.encode(next_obs)
        inv = self.inverse_loss(phi, phi_next, actions)
        fwd = self.forward_errors(phi, phi_next, actions).mean()
        return (1 - self.beta) * inv + self.beta * fwd, inv, fwd

    @torch.no_grad()
    def reward(self, obs: torch.Tensor, next_obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """``[B]``: ``eta / 2 ||f(phi(s), a) - phi(s')||^2``, no gradient."""
        return self.eta * self.forward_errors(self.encode(obs), self.encode(next_obs), actions)
