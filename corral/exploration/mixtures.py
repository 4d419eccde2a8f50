"""NGU's family of ``N`` exploration mixtures (Badia et al. 2020a, appendix A):
``(beta_j, gamma_j)``, ``j = 0 .. N-1``, from the purely exploitative ``j = 0`` (``beta_0 = 0``,
the longest horizon ``gamma_max``) to the most exploratory ``j = N-1`` (``beta``, ``gamma_min``):

    beta_j  = 0                                              j = 0
              beta                                           j = N - 1
              beta * sigmoid(10 (2j - (N - 2)) / (N - 2))    otherwise
    gamma_j = 1 - exp(((N - 1 - j) log(1 - gamma_max) + j log(1 - gamma_min)) / (N - 1))

and how env columns are given mixtures: NGU's actor ``i`` runs mixture ``i mod N``; here
every env column of every collector is an actor, numbered across collectors.
"""

from __future__ import annotations

import math

import torch


def mixture_betas(n: int, beta: float) -> torch.Tensor:
    """``[n]`` intrinsic-reward weights beta_j (float64)."""
    if n == 1:
        return torch.tensor([0.0], dtype=torch.float64)
    j = torch.arange(n, dtype=torch.float64)
    if n == 2:
        return torch.tensor([0.0, beta], dtype=torch.float64)
    out = beta * torch.sigmoid(10.0 * (2.0 * j - (n - 2)) / (n - 2))
    out[0], out[-1] = 0.0, beta
    return out


def mixture_gammas(n: int, gamma_max: float, gamma_min: float) -> torch.Tensor:
    """``[n]`` discounts gamma_j, geometric in ``1 - gamma`` from ``gamma_max`` to ``gamma_min`` (float64)."""
    if n == 1:
        return torch.tensor([gamma_max], dtype=torch.float64)
    j = torch.arange(n, dtype=torch.float64)
    return 1.0 - torch.exp(((n - 1 - j) * math.log(1.0 - gamma_max) + j * math.log(1.0 - gamma_min)) / (n - 1))


def column_mixtures(worker: int, workers: int, num_envs: int, n: int, device=None) -> torch.Tensor:
    """``[num_envs]`` mixture index of each env column of collector ``worker`` of ``workers``:
    the column's global index (``worker * num_envs + i``) mod ``n``."""
    return (worker * num_envs + torch.arange(num_envs, device=device)) % n
