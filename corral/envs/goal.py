"""Goal-conditioned envs (Gymnasium-Robotics' ``GoalEnv``): where the goals lie in corral's
flat observation, and the env's reward function, carried by the observation space.

A ``GoalEnv`` observes a ``Dict`` with ``observation``, ``achieved_goal`` and ``desired_goal``
and has ``compute_reward(achieved_goal, desired_goal, info)``, vectorised over a leading batch
dim. corral flattens the ``Dict`` (``corral.envs.spaces.FlattenParts``); there the flat ``Box``
also gets ``corral_goal``, a :class:`GoalSpec`: the two goal parts' columns and the env's
``compute_reward``. Hindsight relabelling (``replay=her``, ``corral/storage/her.py``) reads it
from the space the algorithm is built with, so no algorithm or storage touches an env.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import torch

ACHIEVED, DESIRED = "achieved_goal", "desired_goal"


class GoalSpec:
    """The goal parts of a flat observation (``achieved``, ``desired``: column slices, each
    goal of ``shape``) and ``compute_reward``, the env's (``None`` after a pickle that could
    not carry it: a Ray worker that only acts needs no reward function)."""

    def __init__(self, achieved: slice, desired: slice, shape: tuple[int, ...],
                 compute_reward: Callable[..., Any] | None, env: str = "env"):
        self.achieved, self.desired, self.shape = achieved, desired, tuple(shape)
        self.compute_reward, self.env = compute_reward, env

    def reward(self, achieved: torch.Tensor, desired: torch.Tensor) -> torch.Tensor:
        """``compute_reward`` of ``[B, goal width]`` goals, one call for the batch: ``[B]`` float32
        on ``achieved``'s device. ``info`` is one empty dict per row (corral keeps no infos)."""
        if self.compute_reward is None:
            raise ValueError(f"the goal env {self.env!r}'s compute_reward did not travel with its observation "
                             "space (it could not be pickled); relabel in the process that made the env")
        B = achieved.shape[0]
        ag = achieved.detach().cpu().numpy().reshape(B, *self.shape)
        dg = desired.detach().cpu().numpy().reshape(B, *self.shape)
        r = np.asarray(self.compute_reward(ag, dg, [{} for _ in range(B)]), dtype=np.float32)
        if r.shape != (B,):
            r = r.reshape(-1)
            if r.shape != (B,):
                raise ValueError(f"{self.env}: compute_reward(achieved_goal, desired_goal, info) given {B} goals "
                                 f"returned shape {r.shape}; it must be vectorised (one reward per row), as "
                                 "Gymnasium-Robotics' GoalEnv's is")
        return torch.from_numpy(r).to(achieved.device)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        try:  # an env's bound method pickles with its env: fine for pure-Python envs, not for every simulator
            pickle.dumps(state["compute_reward"])
        except Exception:
            state["compute_reward"] = None
        return state

    def __repr__(self) -> str:
        return f"GoalSpec(achieved={self.achieved}, desired={self.desired}, shape={self.shape}, env={self.env!r})"


def _compute_reward(env: gym.Env) -> Callable[..., Any] | None:
    try:
        fn = env.get_wrapper_attr("compute_reward")
    except AttributeError:
        fn = getattr(getattr(env, "unwrapped", env), "compute_reward", None)
    return fn if callable(fn) else None


def attach_goal(env: gym.Env, box: gym.spaces.Box, label: str = "env") -> None:
    """Give ``box`` (``env``'s flattened observation space, with ``corral_layout``) a
    ``corral_goal`` when ``env`` is a goal env: ``achieved_goal`` and ``desired_goal`` parts of
    the same size and a callable ``compute_reward``. Anything else is left alone."""
    parts = {p.key: p for p in getattr(box, "corral_layout", None) or ()}
    if ACHIEVED not in parts or DESIRED not in parts:
        return
    a, d = parts[ACHIEVED], parts[DESIRED]
    fn = _compute_reward(env)
    if fn is None or a.stop - a.start != d.stop - d.start:
        return
    box.corral_goal = GoalSpec(slice(a.start, a.stop), slice(d.start, d.stop), a.shape or (a.stop - a.start,), fn,
                               label)


def goal_of(space: gym.Space) -> GoalSpec | None:
    """The :class:`GoalSpec` a flattened goal env's observation space carries, or None."""
    return getattr(space, "corral_goal", None)
