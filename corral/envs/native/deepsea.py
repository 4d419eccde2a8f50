"""DeepSea (bsuite's ``deep_sea``, ``corral.envs.deepsea.DeepSea``) as a torch-batched native env.

The deterministic version only (the stochastic one draws from Gymnasium's ``np_random``):
``N`` copies of the same ``size x size`` problem, with the same per-cell action mapping as
the Gymnasium env for the same ``mapping_seed`` (drawn the same way, with numpy), so the two
agree step for step (``tests/test_native_deepsea.py``). State: ``[row, column]`` per env;
the observation is the ``size x size`` grid with a 1 at ``(row, column)`` (all zeros as the
final observation of an episode); an episode terminates after ``size`` steps and is never
truncated. Ids: ``DeepSea<N>-v0`` (``native:DeepSea12-v0``) for the sizes Gymnasium's family
registers (``corral.envs.deepsea.SIZES``).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from corral.envs.native.core import NativeVecEnv


class DeepSea(NativeVecEnv):
    state_dim = 2

    def __init__(self, num_envs: int, device: str | torch.device = "cpu", seed: int | None = None,
                 dtype: torch.dtype = torch.float32, size: int = 10, move_cost: float = 0.01,
                 randomize_actions: bool = True, mapping_seed: int = 0):
        n = self.size = int(size)
        if n < 2:
            raise ValueError(f"DeepSea size={size}: the grid needs at least 2 rows")
        self.move_cost = float(move_cost)
        self.gym_id = f"DeepSea{n}-v0"
        self.max_episode_steps = n + 1  # never reached: every episode terminates after n steps
        if randomize_actions:  # as corral.envs.deepsea.DeepSea draws it
            mapping = np.random.RandomState(int(mapping_seed)).binomial(1, 0.5, [n, n])
        else:
            mapping = np.ones([n, n], dtype=np.int64)
        self._mapping = torch.as_tensor(mapping.reshape(-1), dtype=torch.long, device=torch.device(device))
        super().__init__(num_envs, device=device, seed=seed, dtype=dtype)

    def _spaces(self):
        n = self.size
        return gym.spaces.Box(0.0, 1.0, (n, n), np.float32), gym.spaces.Discrete(2)

    def _sample_initial(self, n):
        return torch.zeros(2, n, dtype=self.dtype, device=self.device)

    def _observe(self, s):
        n, m = self.size, s.shape[1]
        row, col = s[0].long(), s[1].long()
        inside = (row < n).to(torch.float32)
        obs = torch.zeros(m, n * n, dtype=torch.float32, device=self.device)
        obs.scatter_(1, (row * n + col).clamp(max=n * n - 1).unsqueeze(1), inside.unsqueeze(1))
        return obs.view(m, n, n)

    def _advance(self, s, action):
        n = self.size
        row, col = s[0], s[1]
        r, c = row.long(), col.long()
        right = action.long() == self._mapping[r * n + c]
        # float64 as Gymnasium's Python floats, then float32 as every native reward
        reward = (right & (c == n - 1)).double() - right.double() * (self.move_cost / n)
        col.copy_(torch.where(right, (c + 1).clamp(max=n - 1), (c - 1).clamp(min=0)).to(self.dtype))
        row.add_(1)
        return reward.float(), row.long() == n
