"""Proportional prioritized replay (Schaul et al. 2016) on the replay ring and a ``SumTree``."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch

from corral.storage.replay import ReplayBatch, ReplayBuffer
from corral.storage.sumtree import SumTree


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay (Schaul et al. 2016) on a ``SumTree``.

    A slot is sampled with probability ``p_i / sum_j p_j`` where
    ``p_i = (|td_i| + eps)^alpha``; slots that are not complete yet hold 0. A slot
    gets the largest priority seen so far when it becomes sampleable. The batch
    is stratified: one draw from each of ``batch_size`` equal slices of the total.
    Importance weights are ``(N * P_i)^-beta / max_j (N * P_j)^-beta``, the max over
    every sampleable slot (it belongs to the smallest priority, kept by the min
    tree), which simplifies to ``(p_min / p_i)^beta``.

    ``add`` does not touch the tree; the next ``sample``, ``update_priorities``,
    ``priorities`` or ``state_dict`` brings it up to date for all adds since,
    in one batched tree update.

    Extra args (the rest as in ``ReplayBuffer``):
        alpha: how much priorities count (0 is uniform).
        beta, beta_final, beta_steps: the importance exponent goes linearly from
            ``beta`` to ``beta_final`` over ``beta_steps`` calls of ``sample``
            (the ``step`` counter, which a caller may also set).
        eps: added to ``|td|`` so no slot's priority is 0.
    """

    def __init__(
        self,
        capacity: int,
        num_envs: int,
        obs_space: gym.Space,
        action_space: gym.Space,
        device: torch.device | str = "cpu",
        seed: int | None = None,
        n_step: int = 1,
        gamma: float = 0.99,
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_final: float = 1.0,
        beta_steps: int = 100_000,
        eps: float = 1e-6,
        final_obs_capacity: int | None = None,
        frame_stack: int = 1,
        reward_shape: tuple[int, ...] = (),
    ):
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        if beta_steps < 0:
            raise ValueError(f"beta_steps must be >= 0, got {beta_steps}")
        if eps <= 0:
            raise ValueError(f"eps must be > 0 so every slot can be sampled, got {eps}")
        self.alpha, self.beta_initial, self.beta_final = float(alpha), float(beta), float(beta_final)
        self.beta_steps, self.eps = int(beta_steps), float(eps)
        self._tree_capacity = (int(capacity) // max(1, int(num_envs))) * int(num_envs)
        super().__init__(
            capacity, num_envs, obs_space, action_space, device=device, seed=seed, n_step=n_step, gamma=gamma,
            final_obs_capacity=final_obs_capacity, frame_stack=frame_stack, reward_shape=reward_shape,
        )
        self._tree = SumTree(self.capacity, device=self.device)
        self._max_priority = torch.ones((), dtype=torch.float64, device=self.device)
        self._tree_steps = 0  # adds the tree has caught up with (see _sync_tree)
        self.step = 0

    def _extra_bytes(self) -> int:
        return SumTree.bytes_needed(self._tree_capacity)

    @property
    def beta(self) -> float:
        if self.beta_steps == 0:
            return self.beta_final
        frac = min(1.0, self.step / self.beta_steps)
        return self.beta_initial + frac * (self.beta_final - self.beta_initial)

    def _sync_tree(self) -> None:
        """Bring the priorities up to date with the adds since the last sync.

        ``add`` leaves the tree alone, so that a run of adds between two samples
        costs one tree update, not one each. Rows written since the last sync
        (age < k) lose the priorities of the data they replaced; slots that became
        complete since then get the max priority: rows that reached age n, and
        young slots whose episode has ended. Older slots keep their priorities.
        """
        k = self._steps - self._tree_steps
        if k == 0:
            return
        T, N, n = self.capacity_per_env, self.num_envs, self.n_step
        rows_back = min(n + k, self._rows_filled)
        ages = torch.arange(rows_back, device=self.device)
        rows = (self._steps - 1 - ages) % T
        slots = (rows[:, None] * N + self._env_ids).reshape(-1)
        complete = (ages >= n)[:, None].expand(rows_back, N).clone()
        young = min(n, rows_back)
        complete[:young] = (self._flags[rows[:young]] != 0).cumsum(0) > 0
        leaves = self._tree.leaves[slots].view(rows_back, N)
        kept = torch.where((ages < k)[:, None], 0.0, leaves)
        fresh = torch.where(complete & (kept == 0), self._max_priority, kept)
        self._tree.update(slots, fresh.reshape(-1), unique=True)
        self._tree_steps = self._steps

    @property
    def priorities(self) -> torch.Tensor:
        """Priority of every slot (0 where it cannot be sampled), indexed by flat slot index."""
        self._sync_tree()
        return self._tree.leaves

    def sample(self, batch_size: int) -> ReplayBatch:
        """Stratified proportional sample, with importance weights at the current ``beta``."""
        self._sync_tree()
        total = self._tree.total
        if not bool(total > 0):
            raise ValueError(
                "PrioritizedReplayBuffer.sample: nothing can be sampled yet "
                f"({self._steps} adds). Check can_sample(batch_size) or start learning later (learning_starts)."
            )
        beta = self.beta
        self.step += 1
        u = torch.rand(batch_size, generator=self._generator, device=self.device, dtype=torch.float64)
        prefix = (torch.arange(batch_size, device=self.device, dtype=torch.float64) + u) * (total / batch_size)
        indices = self._tree.find(prefix)
        priorities = self._tree.get(indices)
        weights = (self._tree.min / priorities) ** beta
        return self._gather(indices, weights.to(torch.float32))

    def update_priorities(self, indices: torch.Tensor, td_errors: torch.Tensor) -> None:
        """Set the priorities of sampled slots from their TD errors: ``(|td| + eps)^alpha``.

        Slots that were overwritten since they were sampled (priority 0 until
        they are complete again) are left alone.
        """
        indices = torch.as_tensor(indices, dtype=torch.long, device=self.device).reshape(-1)
        td = torch.as_tensor(td_errors, device=self.device).detach().reshape(-1).to(torch.float64)
        if td.numel() != indices.numel():
            raise ValueError(
                f"update_priorities got {indices.numel()} indices but {td.numel()} TD errors; "
                "pass one TD error per sampled index"
            )
        finite = torch.isfinite(td)
        if not bool(finite.all()):
            bad = int((~finite).sum())
            first = float(td[~finite][0])
            raise ValueError(
                f"update_priorities got {bad} non-finite TD error(s) out of {td.numel()} (e.g. {first}); "
                "priorities must be finite. The loss has diverged: check the learning rate, reward scale "
                "and target network update."
            )
        priorities = (td.abs() + self.eps) ** self.alpha
        self._sync_tree()
        live = self._tree.get(indices) > 0
        self._tree.update(indices[live], priorities[live])
        if priorities.numel():
            self._max_priority = torch.maximum(self._max_priority, priorities.max())

    def state_dict(self) -> dict[str, Any]:
        self._sync_tree()
        state = super().state_dict()
        state["tree"] = self._tree.state_dict()
        state["max_priority"] = self._max_priority.clone()
        state["step"] = self.step
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._tree.load_state_dict(state["tree"])
        self._tree_steps = self._steps
        self._max_priority = state["max_priority"].to(self.device, torch.float64).clone()
        self.step = int(state["step"])
