"""The in-process backend: N Gymnasium envs stepped by one loop in this process."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import torch

from corral.envs.group import EnvGroup
from corral.envs.host import HostVecEnv, tree_to_numpy, tree_to_torch
from corral.envs.make import EnvFactory, check_env


class SyncVecEnv(HostVecEnv):
    """N envs in this process. See :mod:`corral.envs.base` for the semantics.

    ``strict``: reject out-of-bounds Box actions instead of clipping and counting them.
    ``on_error``: ``"raise"`` (an ``EnvError`` naming env, index and step) or
    ``"restart"`` (rebuild the env from its factory, drop the broken episode, count it
    in ``restarts`` and go on).
    """

    def __init__(
        self,
        factories: Sequence[EnvFactory],
        env_id: str = "env",
        device: str | torch.device = "cpu",
        check_finite: bool = True,
        strict: bool = False,
        on_error: str = "raise",
        max_restarts: int = 100,
    ):
        self.group = EnvGroup(factories, env_id, 0, on_error, max_restarts)
        first = self.group.envs[0]
        check_env(first, env_id)
        self._init_front(len(self.group.envs), first.observation_space, first.action_space, env_id, device,
                         check_finite, strict)
        self.copyable = self.group.copyable
        self._restart_messages = self.group.messages  # the group appends, step() warns and clears

    @property
    def envs(self) -> list[gym.Env]:
        return self.group.envs

    @property
    def restarts(self) -> int:
        return self.group.restarts

    def _reset_arrays(self, seed):
        return self.group.reset(seed)

    def _step(self, acts):
        return self.group.step(acts, self.steps)

    def state_dict(self) -> dict[str, Any]:
        g = self.group.get_state()
        state: dict[str, Any] = {"copyable": self.copyable, "steps": self.steps, "ep_ret": g["ep_ret"], "ep_len": g["ep_len"]}
        if "envs" in g:
            state["envs"] = g["envs"]
        return tree_to_torch(state)

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore; returns True when env internals were restored (episodes continue)."""
        self.steps = int(state.get("steps", 0))
        if not (state.get("copyable") and self.copyable):
            return False
        return self.group.set_state(tree_to_numpy(state))

    def close(self) -> None:
        self.group.close()
