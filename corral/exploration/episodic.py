"""NGU's episodic novelty (Badia et al. 2020a, "Never Give Up", Algorithm 1 of the appendix)
and the embedding it reads, trained by inverse dynamics.

:class:`EpisodicMemory` holds, for each of ``N`` env columns, the controllable-state
embeddings ``f(x_0) .. f(x_{t-1})`` of the current episode (a ring of ``capacity``
slots per column, all columns in one ``[N, capacity, D]`` tensor). For a new embedding
``f(x_t)`` of every column at once:

1. the squared Euclidean distances ``d_i^2`` to its ``k`` nearest neighbours in the memory;
2. ``d_m^2``, the running mean of those squared distances (per column, over the whole run),
   is updated with them;
3. ``d_n = d_i^2 / d_m^2``, then the cluster distance: ``d_n = max(d_n - xi, 0)``;
4. kernel values ``K_i = epsilon / (d_n + epsilon)``;
5. similarity ``s = sqrt(sum_i K_i) + c`` (the pseudo-count constant);
6. ``r = 0`` if ``s > s_max`` (the maximum similarity), else ``1 / s``;

then ``f(x_t)`` is written into the column's memory. ``reset(mask)`` empties the columns
that start an episode. A column whose memory holds fewer than ``k`` embeddings reads the
neighbours it has (short episodes, DeepSea's, would otherwise score 0 throughout: Deep RL
Zoo's module returns 0 until ``k`` are stored); an empty memory scores 0.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from corral.nets import NatureCNN, is_image_space


class EpisodicMemory:
    def __init__(self, num_envs: int, dim: int, capacity: int, k: int = 10, kernel_epsilon: float = 1e-4,
                 cluster_distance: float = 8e-3, pseudo_count: float = 1e-3, max_similarity: float = 8.0,
                 device="cpu"):
        if capacity < k:
            raise ValueError(f"episodic memory capacity {capacity} is smaller than k={k}")
        self.k, self.capacity = int(k), int(capacity)
        self.kernel_epsilon, self.cluster_distance = float(kernel_epsilon), float(cluster_distance)
        self.pseudo_count, self.max_similarity = float(pseudo_count), float(max_similarity)
        self.device = torch.device(device)
        self.memory = torch.zeros(num_envs, self.capacity, dim, device=self.device)
        self.size = torch.zeros(num_envs, dtype=torch.long, device=self.device)  # embeddings this episode
        self.dist_mean = torch.zeros(num_envs, device=self.device)  # d_m^2
        self.dist_count = torch.zeros(num_envs, device=self.device)
        self._slots = torch.arange(self.capacity, device=self.device)
        self._rows = torch.arange(num_envs, device=self.device)

    def reset(self, mask: torch.Tensor) -> None:
        """Empty the memory of the columns in ``mask`` (they start an episode)."""
        self.size = torch.where(mask.to(self.device), 0, self.size)

    def novelty(self, emb: torch.Tensor, write: bool = True) -> torch.Tensor:
        """``[N]`` episodic rewards of the embeddings ``emb [N, D]`` against each column's memory;
        with ``write`` the running mean is updated and ``emb`` stored."""
        k = self.k
        # only the slots some column has filled (one host read; episodes are mostly shorter than capacity)
        width = min(self.capacity, max(k, int(self.size.max())))
        d2 = (self.memory[:, :width] - emb.unsqueeze(1)).square().sum(-1)  # [N, width]
        filled = self._slots[:width].unsqueeze(0) < self.size.clamp(max=self.capacity).unsqueeze(1)
        d2 = d2.masked_fill(~filled, math.inf)
        knn = d2.topk(k, dim=1, largest=False).values  # [N, k]; inf where the memory holds fewer than k
        valid = torch.isfinite(knn)
        knn = torch.where(valid, knn, 0.0)  # (no inf in the arithmetic below)
        if write:
            n_new = valid.sum(1).to(self.dist_count.dtype)
            total = self.dist_count + n_new
            self.dist_mean = torch.where(n_new > 0, (self.dist_mean * self.dist_count + knn.sum(1))
                                         / total.clamp(min=1.0), self.dist_mean)
            self.dist_count = total
        d_n = knn / self.dist_mean.clamp(min=1e-8).unsqueeze(1)
        d_n = (d_n - self.cluster_distance).clamp(min=0.0)
        kernel = torch.where(valid, self.kernel_epsilon / (d_n + self.kernel_epsilon), 0.0)
        s = kernel.sum(1).sqrt() + self.pseudo_count
        reward = torch.where(valid[:, 0] & (s <= self.max_similarity), 1.0 / s, 0.0)
        if write:
            slot = self.size % self.capacity
            self.memory[self._rows, slot] = emb.to(self.memory.dtype)
            self.size = self.size + 1
        return reward

    def state_dict(self) -> dict[str, Any]:
        return {"memory": self.memory.clone(), "size": self.size.clone(), "dist_mean": self.dist_mean.clone(),
                "dist_count": self.dist_count.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k in ("memory", "size", "dist_mean", "dist_count"):
            getattr(self, k).copy_(state[k].to(self.device))


class InverseDynamics(nn.Module):
    """The controllable-state embedding ``f`` (an MLP, or a Nature CNN for images, to ``dim``
    units) trained only by predicting ``a_t`` from ``(f(x_t), f(x_{t+1}))`` (cross-entropy);
    NGU's episodic memory reads ``f``, so what the agent cannot influence is left out."""

    def __init__(self, obs_space: gym.spaces.Box, n_actions: int, dim: int = 32, hidden: int = 128):
        super().__init__()
        shape = tuple(obs_space.shape)
        if is_image_space(obs_space):
            cnn = NatureCNN(shape)
            self.embed = nn.Sequential(cnn, nn.Linear(cnn.out_dim, dim))
        else:
            self.embed = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), hidden), nn.ReLU(),
                                       nn.Linear(hidden, dim))
        self.classifier = nn.Sequential(nn.Linear(2 * dim, hidden), nn.ReLU(), nn.Linear(hidden, n_actions))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.embed(obs)

    def loss(self, obs: torch.Tensor, next_obs: torch.Tensor, action: torch.Tensor,
             mask: torch.Tensor | None = None) -> torch.Tensor:
        """Cross-entropy of the predicted ``action`` (``mask``: the pairs that are real transitions)."""
        logits = self.classifier(torch.cat([self(obs), self(next_obs)], -1))
        ce = nn.functional.cross_entropy(logits, action.long(), reduction="none")
        if mask is None:
            return ce.mean()
        m = mask.float()
        return (ce * m).sum() / m.sum().clamp(min=1.0)
