"""Rollout storage for on-policy algorithms: fixed [T, N] tensors, allocated once."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class RolloutBatch:
    """One batch type, leading dims [T, N] (or flattened [T*N] for minibatches)."""

    obs: torch.Tensor  # normalized observations the policy saw
    actions: torch.Tensor  # unit-space actions as sampled
    log_probs: torch.Tensor
    values: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    final_obs: torch.Tensor  # the normalized true next observation (what V(final_obs) reads on truncation)
    final_values: torch.Tensor  # V(final_obs) where truncated, else 0 (filled at update time)

    def flatten(self) -> "RolloutBatch":
        return RolloutBatch(**{f.name: getattr(self, f.name).flatten(0, 1) for f in fields(self)})


class RolloutStorage:
    def __init__(self, num_steps: int, num_envs: int, obs_dim: tuple[int, ...], act_shape: tuple[int, ...],
                 act_dtype: torch.dtype, device: torch.device, obs_dtype: torch.dtype = torch.float32):
        T, N = num_steps, num_envs
        self.num_steps, self.num_envs = T, N
        z = lambda *s, dtype=torch.float32: torch.zeros((T, N, *s), dtype=dtype, device=device)  # noqa: E731
        self.data = RolloutBatch(
            obs=z(*obs_dim, dtype=obs_dtype),
            actions=z(*act_shape, dtype=act_dtype),
            log_probs=z(),
            values=z(),
            rewards=z(),
            terminated=z(dtype=torch.bool),
            truncated=z(dtype=torch.bool),
            final_obs=z(*obs_dim, dtype=obs_dtype),
            final_values=z(),
        )
        self.step = 0
        # per-step views made once, so add() is one copy_ per field
        self._rows = [{f.name: getattr(self.data, f.name)[t] for f in fields(self.data)} for t in range(T)]

    @property
    def full(self) -> bool:
        return self.step >= self.num_steps

    def add(self, **values: torch.Tensor) -> None:
        row = self._rows[self.step]
        for k, v in values.items():
            row[k].copy_(v)
        self.step += 1

    def clear(self) -> None:
        self.step = 0

    def state_dict(self) -> dict:
        # Checkpoints are written at rollout boundaries, where the storage is empty.
        return {"step": self.step, **({f.name: getattr(self.data, f.name)[: self.step].clone() for f in fields(self.data)} if self.step else {})}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        for f in fields(self.data):
            if f.name in state:
                getattr(self.data, f.name)[: self.step] = state[f.name]
