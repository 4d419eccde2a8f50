"""Generalized State-Dependent Exploration (gSDE; Raffin et al. 2021, "Smooth Exploration for
Robotic Reinforcement Learning"), the distribution part, as Stable-Baselines3 defines it.

The policy's exploration noise is a function of the state: ``eps(s) = phi(s) @ theta`` with
``phi(s)`` the policy's last hidden features ``[B, L]`` and ``theta`` an ``[L, A]`` matrix
drawn from ``N(0, sigma^2)``, held fixed between resamples. For a fixed state the action
``mean(s) + eps(s)`` is Gaussian with per-dimension variance ``(phi(s)^2) @ (sigma^2)`` (each
output a sum of independent Gaussians), which gives its log-prob and entropy; sigma is learned.

Conventions (SB3's ``StateDependentNoiseDistribution``, learn_features=False):

* ``phi`` is detached wherever it enters the noise or the variance: the exploration does not
  shape the features, only the mean does;
* ``sigma = exp(log_std)``, or with ``use_expln`` ``exp(log_std)`` below 0 and
  ``log1p(log_std) + 1`` above, which grows slowly instead of exponentially;
* ``full_std``: one log std per (feature, action) entry ``[L, A]``; otherwise one per feature
  ``[L, 1]``, shared by every action;
* the variance carries ``1e-6`` before its square root, so a zero feature vector is still a
  distribution.

Draws are kept as unit normals ``z`` (``theta = sigma * z``): between two resamples sigma does
not change in SB3's cadences (its learners step after a rollout, and a rollout starts with a
resample), so the noise is the one SB3's stored ``theta`` gives, and a gradient step's ``theta``
carries the gradient to ``log_std`` (the reparametrisation)."""

from __future__ import annotations

import torch
from torch import nn

from corral.nets.heads import DiagGaussianHead

VARIANCE_EPS = 1e-6


class StateDependentNoise(nn.Module):
    """The learned log std of gSDE's exploration matrix, with the distribution it gives. As a
    policy head it reads ``params(mean, phi)`` as ``DiagGaussianHead`` reads its own."""

    log_prob = staticmethod(DiagGaussianHead.log_prob)
    entropy = staticmethod(DiagGaussianHead.entropy)
    mode = staticmethod(DiagGaussianHead.mode)
    sample = staticmethod(DiagGaussianHead.sample)  # independent draws per row (acting outside training)

    def __init__(self, latent_dim: int, act_dim: int, log_std_init: float = -2.0, full_std: bool = True,
                 use_expln: bool = False):
        super().__init__()
        self.latent_dim, self.act_dim = int(latent_dim), int(act_dim)
        self.full_std, self.use_expln = bool(full_std), bool(use_expln)
        self.log_std = nn.Parameter(torch.full((self.latent_dim, self.act_dim if full_std else 1),
                                               float(log_std_init)))

    def std(self) -> torch.Tensor:
        """sigma, ``[L, A]`` (expanded over actions without ``full_std``)."""
        log_std = self.log_std
        if self.use_expln:
            # expln: exp below 0, log1p(x) + 1 above (continuous at 0, where both are 1)
            above = log_std > 0
            std = torch.where(above, torch.log1p(log_std.clamp(min=0.0)) + 1.0, log_std.clamp(max=0.0).exp())
        else:
            std = log_std.exp()
        return std.expand(self.latent_dim, self.act_dim)

    def draw(self, n: int | None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Unit normals for ``n`` exploration matrices ``[n, L, A]`` (``None``: one, ``[L, A]``)."""
        shape = (self.latent_dim, self.act_dim) if n is None else (n, self.latent_dim, self.act_dim)
        return torch.randn(shape, generator=generator, device=self.log_std.device)

    def noise(self, phi: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """``phi(s) @ theta`` with ``theta = sigma * z``: ``z`` one matrix ``[L, A]`` for every row
        (a gradient step's), or one per row ``[B, L, A]`` (each env's own while collecting). A
        ``[B, L, A]`` that is one matrix expanded over rows is taken as that one matrix."""
        phi = phi.detach()
        if z.dim() == 3 and z.stride(0) == 0:
            z = z[0]
        theta = self.std() * z
        if z.dim() == 2:
            return phi @ theta
        return torch.bmm(phi.unsqueeze(1), theta).squeeze(1)

    def log_std_of(self, phi: torch.Tensor) -> torch.Tensor:
        """The per-dimension log std of ``mean + phi @ theta`` over theta, ``[B, A]``:
        ``0.5 log((phi^2) @ (sigma^2) + 1e-6)``."""
        variance = phi.detach().square() @ self.std().square()
        return 0.5 * torch.log(variance + VARIANCE_EPS)

    def params(self, mean: torch.Tensor, phi: torch.Tensor) -> torch.Tensor:
        """``cat([mean, log std])``: ``DiagGaussianHead``'s layout, so its ``log_prob``, ``entropy``,
        ``mode`` and ``sample`` (one independent draw per row) read it as they read their own."""
        return torch.cat([mean, self.log_std_of(phi)], dim=-1)
