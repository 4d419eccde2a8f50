"""What every algorithm exposes to the Learner loop and to schemes.

The loop is::

    env_action, extras = algo.explore(obs)           # actor, no grad
    next_obs, reward, term, trunc, info = env.step(env_action)
    algo.observe(obs, extras, reward, term, trunc, info["final_obs"], next_obs)   # storage
    if algo.ready(): stats = algo.update(progress)   # learner

An algorithm never steps an env and never logs; it owns its actor, storage,
optimizers and targets, and returns plain metrics from ``update``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import torch

from corral.rng import RNGStreams


class Algorithm:
    name: ClassVar[str]
    Config: ClassVar[type]
    actor: torch.nn.Module
    total_steps: int = 1  # the run's step budget, set by the Learner; drives schedules like epsilon

    def __init__(self, cfg: Any, obs_space: gym.Space, act_space: gym.Space, num_envs: int,
                 device: torch.device, rng: RNGStreams):
        self.cfg = cfg
        self.obs_space = obs_space
        self.act_space = act_space
        self.num_envs = num_envs
        self.device = device
        self.rng = rng

    # explore and observe run under torch.no_grad(), entered once per step by the Learner;
    # update runs with gradients enabled.
    def explore(self, obs: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError

    def observe(self, obs, extras, reward, terminated, truncated, final_obs, next_obs) -> None:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def update(self, progress: float) -> dict[str, float]:
        """One learning step; ``progress`` in [0, 1] drives schedules."""
        raise NotImplementedError

    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        return self.actor.act(obs, deterministic=deterministic, generator=self.rng["action"])

    @property
    def at_boundary(self) -> bool:
        """True where a checkpoint holds everything (e.g. an empty rollout)."""
        return True

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError
