"""Two small goal-conditioned envs in Gymnasium-Robotics' ``GoalEnv`` shape, built in so HER
(``replay=her``) has tasks that need no simulator: a ``Dict`` observation with
``observation``, ``achieved_goal`` and ``desired_goal``, a vectorised
``compute_reward(achieved_goal, desired_goal, info)`` and ``info["is_success"]``.

* ``BitFlipping-v0`` (Andrychowicz et al. 2017, section 3.1; SB3's ``BitFlippingEnv``):
  ``n_bits`` bits (``env.kwargs.n_bits``, default 10; ``BitFlipping<N>-v0`` for the sizes in
  ``BIT_SIZES``), start and goal drawn at random, action ``i`` flips bit ``i``. Reward -1 each
  step the bits differ from the goal and 0 where they match; the episode *terminates* on a
  match and is *truncated* after ``n_bits`` steps. Without relabelling a random policy almost
  never sees a 0 once ``n_bits`` is past ~10.
* ``PointReach-v0``: a point in the square ``[-1, 1]^2`` moved by at most ``max_step`` per
  step along each axis (action ``Box(-1, 1, (2,))``), a goal drawn in the square, reward 0 within
  ``distance_threshold`` (0.05) of it and -1 elsewhere, 50 steps and never a termination (only a
  truncation), as FetchReach's task is: the continuous case for SAC / TD3 / DDPG.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

BIT_SIZES = (8, 10, 15, 20, 25, 30)


class BitFlipping(gym.Env):
    metadata = {"render_modes": []}
    corral_copyable = True  # plain numpy state: a checkpoint copies it, so a resumed run continues its episodes

    def __init__(self, n_bits: int = 10, max_steps: int | None = None):
        self.n_bits = n = int(n_bits)
        if n < 1:
            raise ValueError(f"BitFlipping n_bits={n_bits}: give at least 1 bit")
        self.max_steps = n if max_steps is None else int(max_steps)
        bits = gym.spaces.MultiBinary(n)
        self.observation_space = gym.spaces.Dict(
            {"observation": bits, "achieved_goal": gym.spaces.MultiBinary(n), "desired_goal": gym.spaces.MultiBinary(n)})
        self.action_space = gym.spaces.Discrete(n)

    def _obs(self) -> dict[str, np.ndarray]:
        return {"observation": self.state.copy(), "achieved_goal": self.state.copy(), "desired_goal": self.goal.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state = self.np_random.integers(0, 2, self.n_bits).astype(np.int8)
        self.goal = self.np_random.integers(0, 2, self.n_bits).astype(np.int8)
        self.t = 0
        return self._obs(), {"is_success": bool((self.state == self.goal).all())}

    def step(self, action):
        self.state[int(action)] ^= 1
        self.t += 1
        obs = self._obs()
        reward = float(self.compute_reward(obs["achieved_goal"], obs["desired_goal"], {}))
        success = reward == 0.0
        return obs, reward, success, self.t >= self.max_steps and not success, {"is_success": success}

    @staticmethod
    def compute_reward(achieved_goal: Any, desired_goal: Any, info: Any) -> np.ndarray:
        """-1 where the bits differ from the goal, 0 where they match; vectorised over leading dims."""
        differ = (np.asarray(achieved_goal) != np.asarray(desired_goal)).any(-1)
        return -differ.astype(np.float32)


class PointReach(gym.Env):
    metadata = {"render_modes": []}
    corral_copyable = True

    def __init__(self, distance_threshold: float = 0.05, max_step: float = 0.1):
        self.distance_threshold, self.max_step = float(distance_threshold), float(max_step)
        square = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_space = gym.spaces.Dict(
            {"observation": square, "achieved_goal": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
             "desired_goal": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)})
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def _obs(self) -> dict[str, np.ndarray]:
        return {"observation": self.pos.copy(), "achieved_goal": self.pos.copy(), "desired_goal": self.goal.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32)
        self.goal = self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32)
        return self._obs(), {"is_success": self._success()}

    def _success(self) -> bool:
        return bool(np.linalg.norm(self.pos - self.goal) < self.distance_threshold)

    def step(self, action):
        a = np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0)
        self.pos = np.clip(self.pos + self.max_step * a, -1.0, 1.0).astype(np.float32)
        obs = self._obs()
        reward = float(self.compute_reward(obs["achieved_goal"], obs["desired_goal"], {}))
        return obs, reward, False, False, {"is_success": self._success()}

    def compute_reward(self, achieved_goal: Any, desired_goal: Any, info: Any) -> np.ndarray:
        """-1 farther than ``distance_threshold`` from the goal, 0 within it; vectorised."""
        d = np.linalg.norm(np.asarray(achieved_goal, np.float32) - np.asarray(desired_goal, np.float32), axis=-1)
        return -(d >= self.distance_threshold).astype(np.float32)


def register_goal_envs() -> None:
    """``BitFlipping-v0`` (and ``BitFlipping<N>-v0``) and ``PointReach-v0``, with Gymnasium."""
    if "BitFlipping-v0" not in gym.registry:
        gym.register("BitFlipping-v0", entry_point=BitFlipping, kwargs={"n_bits": 10})
    for n in BIT_SIZES:
        if f"BitFlipping{n}-v0" not in gym.registry:
            gym.register(f"BitFlipping{n}-v0", entry_point=BitFlipping, kwargs={"n_bits": n})
    if "PointReach-v0" not in gym.registry:
        gym.register("PointReach-v0", entry_point=PointReach, max_episode_steps=50)
