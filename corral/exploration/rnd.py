"""Random Network Distillation (Burda, Edwards, Storkey, Klimov 2018, "Exploration by Random
Network Distillation"): the novelty of an observation is how badly a trained *predictor*
network matches a fixed, randomly initialised *target* network on it. Observations seen
often are predicted well, so their novelty falls; new ones are not.

Two reusable parts (``ppo_rnd`` uses both; NGU's life-long novelty multiplier uses ``RND``):

``RND(obs_space, hidden=(64, 64), features=64, clip=5.0, frames=1, generator=None)``, an
``nn.Module`` holding ``target`` (frozen: ``requires_grad=False``, never stepped),
``predictor`` and ``obs_norm`` (a running mean / std of the observations,
``corral.actors.normalizer.RunningNormalizer`` clipped to ``[-clip, clip]``):

* ``prepare(obs) -> x``: raw observations ``[B, *obs_shape]`` -> the networks' input:
  image observations (uint8, Nature-CNN sized: ``corral.nets.is_image_space``) keep their
  last ``frames`` channels (the paper uses the newest frame of the stack; ``frames=0``: all),
  then everything is normalised by the running statistics and clipped. Flat observations
  are flattened first.
* ``update_obs_norm(obs)``: fold raw observations into the running statistics (no-op in
  ``eval()`` mode, as every corral normaliser).
* ``errors(obs) -> [B]``: per-sample prediction error, the mean over the ``features`` outputs
  of ``(predictor(x) - target(x))^2``, with gradient into the predictor only.
* ``novelty(obs) -> [B]``: the same without gradient (the intrinsic reward before scaling).
* ``mask(batch, fraction) -> [B] bool``: which samples train the predictor: each one with
  probability ``fraction``, drawn from ``generator`` (the caller's stream, e.g.
  ``RNGStreams["rnd"]``; the same generator state gives the same mask).
* ``loss(obs, fraction) -> (loss, trained)``: the predictor loss, the mean of ``errors`` over
  the masked samples (0 when none is drawn), and how many were.
* ``state_dict()`` / ``load_state_dict()``: target, predictor and the observation statistics
  (the generator's state belongs to its owner's stream set).

Encoders are the project's (``corral.nets``): flat observations go through ``MLP``s of
``hidden`` (the predictor one layer deeper than the target, as the paper gives it more
capacity); images through the Nature-CNN conv stack (``NatureCNN.conv``) fed the normalised
floats (not the ``/255`` of ``NatureCNN.forward``), then a linear layer for the target and an
MLP of two ``features``-wide hidden layers for the predictor (the paper's shapes).

``IntrinsicReturnNormalizer(num_envs, gamma)``: the paper's reward-forward filter. Intrinsic
rewards are divided by a running std of *intrinsic returns* computed along time, per env:
``R_t[n] = gamma R_{t-1}[n] + r_t[n]`` with no cut at episode ends (the intrinsic stream is
non-episodic). ``step(r [N]) -> R [N]`` advances the filter one vector step; ``forward_filter(r
[T, N])`` runs it over a rollout; ``update(R)`` folds returns into the statistics; ``std``;
``normalize(r) = r / std``. (CleanRL's ``ppo_rnd_envpool.py`` iterates the filter over the
transposed ``[N, T]`` array, so each "step" is one env's whole rollout and the filter mixes
envs; ``tests/test_rnd.py`` shows that variant gives other, wrong statistics.)
"""

from __future__ import annotations

import math

import gymnasium as gym
import torch
from torch import nn

from corral.actors.normalizer import RunningNormalizer
from corral.nets import MLP, NatureCNN, is_image_space


class RND(nn.Module):
    def __init__(self, obs_space: gym.Space, hidden: tuple[int, ...] = (64, 64), features: int = 64,
                 clip: float = 5.0, frames: int = 1, generator: torch.Generator | None = None):
        super().__init__()
        if not isinstance(obs_space, gym.spaces.Box):
            raise ValueError(f"RND needs Box observations (flat vectors or uint8 images), got {obs_space}")
        shape = tuple(obs_space.shape)
        self.image = is_image_space(obs_space)
        self.generator = generator
        if self.image:
            self.channels_last = shape[-1] <= 4 < shape[0]  # as NatureCNN reads it
            c, h, w = (shape[2], shape[0], shape[1]) if self.channels_last else shape
            self.frames = c if frames <= 0 else min(frames, c)
            in_shape = (self.frames, h, w)
            target_cnn, predictor_cnn = NatureCNN(in_shape, features), NatureCNN(in_shape, features)
            with torch.no_grad():
                flat = target_cnn.conv(torch.zeros(1, *in_shape)).shape[1]
            self.target = nn.Sequential(target_cnn.conv, MLP(flat, (), out_dim=features))
            self.predictor = nn.Sequential(predictor_cnn.conv, MLP(flat, (features, features), "relu",
                                                                   out_dim=features))
        else:
            self.frames = 0
            self.channels_last = False
            in_shape = (int(math.prod(shape)),)
            self.target = MLP(in_shape[0], tuple(hidden), "relu", out_dim=features)
            self.predictor = MLP(in_shape[0], (*hidden, hidden[-1]) if hidden else (features,), "relu",
                                 out_dim=features)
        self.in_shape = in_shape
        self.target.requires_grad_(False)
        self.obs_norm = RunningNormalizer(in_shape, clip=clip)

    def select(self, obs: torch.Tensor) -> torch.Tensor:
        """The part of raw observations the networks see (last ``frames`` channels of an image,
        channels first; a flat vector), before normalisation. Observations already in that shape
        (``in_shape``) are returned as they are, so a buffer of selected observations can be
        passed to every method."""
        if tuple(obs.shape[1:]) == self.in_shape:
            return obs
        if not self.image:
            return obs.reshape(obs.shape[0], -1)
        if self.channels_last:
            obs = obs.permute(0, 3, 1, 2)
        return obs[:, obs.shape[1] - self.frames:]

    def update_obs_norm(self, obs: torch.Tensor) -> None:
        self.obs_norm.update(self.select(obs))

    def prepare(self, obs: torch.Tensor) -> torch.Tensor:
        return self.obs_norm(self.select(obs))

    def errors(self, obs: torch.Tensor) -> torch.Tensor:
        """Per-sample prediction error ``[B]`` (gradient reaches the predictor only)."""
        x = self.prepare(obs)
        with torch.no_grad():
            target = self.target(x)
        return (self.predictor(x) - target).square().mean(-1)

    @torch.no_grad()
    def novelty(self, obs: torch.Tensor) -> torch.Tensor:
        return self.errors(obs)

    def mask(self, batch: int, fraction: float, device: torch.device | None = None) -> torch.Tensor:
        """``[batch]`` bool: each sample kept with probability ``fraction`` (from ``generator``)."""
        device = device if device is not None else self.obs_norm.mean.device
        return torch.rand(batch, generator=self.generator, device=device) < fraction

    def loss(self, obs: torch.Tensor, fraction: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss, trained)``: the mean prediction error over a ``fraction`` of ``obs`` drawn
        by ``mask`` (every sample when ``fraction >= 1``, no draw), and how many samples that is."""
        err = self.errors(obs)
        if fraction >= 1.0:
            return err.mean(), torch.tensor(float(err.shape[0]), device=err.device)
        keep = self.mask(err.shape[0], fraction, err.device).float()
        trained = keep.sum()
        return (err * keep).sum() / trained.clamp(min=1.0), trained


class IntrinsicReturnNormalizer(nn.Module):
    """Running std of intrinsic returns filtered along time per env (see the module doc)."""

    def __init__(self, num_envs: int, gamma: float, eps: float = 1e-8):
        super().__init__()
        self.gamma = gamma
        self.register_buffer("ret", torch.zeros(num_envs))  # R_{t-1} per env
        self.stats = RunningNormalizer((), eps=eps)

    def step(self, reward: torch.Tensor) -> torch.Tensor:
        """Advance every env's filter by one step: ``R = gamma R + r``; returns a copy of ``R``."""
        self.ret.mul_(self.gamma).add_(reward)
        return self.ret.clone()

    def forward_filter(self, rewards: torch.Tensor) -> torch.Tensor:
        """``[T, N]`` rewards -> ``[T, N]`` filtered returns, along time, each env its own."""
        return torch.stack([self.step(r) for r in rewards])

    def update(self, returns: torch.Tensor) -> None:
        """Fold filtered returns (any shape) into the running statistics."""
        self.stats.update(returns.reshape(-1))

    @property
    def std(self) -> torch.Tensor:
        return (self.stats.var + self.stats.eps).sqrt().float()

    def normalize(self, reward: torch.Tensor) -> torch.Tensor:
        return reward / self.std
