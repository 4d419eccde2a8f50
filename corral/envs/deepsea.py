"""DeepSea (Osband et al. 2019, bsuite's ``deep_sea``): a hard-exploration chain in an
``N x N`` grid, built in and cheap.

The agent starts at the top-left cell and falls one row per step; each step it moves one
column left or right (clipped at the walls), so an episode lasts exactly ``N`` steps. The
treasure (+1) is only reached by going right at every one of the ``N`` steps; each "right"
costs ``move_cost / N`` (bsuite's ``unscaled_move_cost``, 0.01), so the optimal return is
``1 - move_cost`` and every policy that does not find the treasure prefers "left". Which of
the two actions means "right" is drawn per cell from a fixed seed (``mapping_seed``), as
bsuite does with ``randomize_actions``: the same problem in every env copy and in the
evaluation env, and no action that is "right" everywhere. The observation is the ``N x N``
grid with a 1 at (row, column) (zeros after the last step), as bsuite's.

Registered with Gymnasium when corral is imported: ``DeepSea-v0`` (``size`` 10 unless
``env.kwargs.size`` says otherwise) and ``DeepSea<N>-v0`` for the sizes in ``SIZES`` (so a
preset can be keyed by size). ``deterministic=False`` is bsuite's stochastic version: a
"right" fails with probability ``1/N`` and the reward in the bottom corners is noisy.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from corral.errors import UserError

SIZES = (5, 8, 10, 12, 15, 20, 25, 30, 40, 50)


class DeepSea(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, size: int = 10, deterministic: bool = True, move_cost: float = 0.01,
                 randomize_actions: bool = True, mapping_seed: int = 0):
        if int(size) < 2:
            raise UserError(f"DeepSea size={size}: the grid needs at least 2 rows; set env.kwargs.size >= 2")
        self.size = n = int(size)
        self.deterministic, self.move_cost = bool(deterministic), float(move_cost)
        if randomize_actions:
            self.action_mapping = np.random.RandomState(int(mapping_seed)).binomial(1, 0.5, [n, n])
        else:
            self.action_mapping = np.ones([n, n], dtype=np.int64)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (n, n), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.row = self.column = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros((self.size, self.size), dtype=np.float32)
        if self.row < self.size:
            obs[self.row, self.column] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.row = self.column = 0
        return self._obs(), {}

    def step(self, action):
        n = self.size
        right = int(action) == int(self.action_mapping[self.row, self.column])
        reward = 0.0
        if self.column == n - 1 and right:
            reward += 1.0
        if not self.deterministic and self.row == n - 1 and self.column in (0, n - 1):
            reward += float(self.np_random.standard_normal())
        if right:
            if self.deterministic or self.np_random.random() > 1.0 / n:
                self.column = min(self.column + 1, n - 1)
            reward -= self.move_cost / n
        else:
            self.column = max(self.column - 1, 0)
        self.row += 1
        return self._obs(), reward, self.row == n, False, {}

    def right_action(self, row: int, column: int) -> int:
        """The action that moves right in cell (row, column) (for tests and demonstrations)."""
        return int(self.action_mapping[row, column])


def register_deepsea() -> None:
    if "DeepSea-v0" not in gym.registry:
        gym.register("DeepSea-v0", entry_point=DeepSea, kwargs={"size": 10})
    for n in SIZES:
        if f"DeepSea{n}-v0" not in gym.registry:
            gym.register(f"DeepSea{n}-v0", entry_point=DeepSea, kwargs={"size": n})
