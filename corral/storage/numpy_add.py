"""``ReplayBuffer.add`` on CPU storage through numpy views of the same memory: a numpy row
assignment costs ~1 us against ~5 us for a torch indexing op, and an add is a handful of
them. The same writes as the torch path (the final-observation store is rare and stays torch)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from corral.storage.replay_parts import TERMINATED


class NumpyAddParts:
    """``ReplayBuffer``'s numpy write path and the views it writes through (a part of it)."""

    def _numpy_views(self) -> tuple[np.ndarray, ...] | None:
        if self.device.type != "cpu":
            return None
        return (self._obs.numpy(), self._action.numpy(), self._reward.numpy(), self._flags.numpy())

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_np"] = None  # views: pickled they would be copies, detached from the tensors
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._np = self._numpy_views()

    def _as_array(self, x: Any, name: str) -> np.ndarray:
        """``_as_input`` for the numpy path: a CPU array of the expected shape (no copy for CPU tensors)."""
        if isinstance(x, torch.Tensor):
            try:
                x = x.numpy()  # a view; ~0.5 us, where detach() alone costs more
            except (RuntimeError, TypeError):  # needs grad, another device, or a dtype numpy lacks
                x = x.detach().cpu().numpy()
        elif not isinstance(x, np.ndarray):
            x = np.asarray(x)
        return self._shaped(x, name)

    def _add_numpy(self, obs, action, reward, terminated, truncated, next_obs) -> None:
        """``add`` for CPU storage: the same writes as the torch path, through numpy views."""
        obs_np, action_np, reward_np, flags_np = self._np
        row = self._steps % self.capacity_per_env
        if self.frame_stack > 1:
            self._add_frames(self._as_input(obs, "obs"))
        else:
            obs_np[row] = self._as_array(obs, "obs")  # numpy casts as torch's copy_ does (e.g. float64 -> float32)
        action_np[row] = self._as_array(action, "action")
        reward_np[row] = self._as_array(reward, "reward")
        flags = flags_np[row]
        truncated, terminated = self._as_array(truncated, "truncated"), self._as_array(terminated, "terminated")
        flags[:] = truncated if truncated.dtype == np.bool_ else truncated != 0  # TRUNCATED == 1
        flags[terminated if terminated.dtype == np.bool_ else terminated != 0] = TERMINATED
        global_step = self._steps
        self._steps += 1
        if flags.any():
            ended = torch.from_numpy(flags.nonzero()[0])
            next_obs = self._as_input(next_obs, "next_obs")
            final = next_obs[ended.to(next_obs.device)].to(self.device)
            self._store_final(global_step * self.num_envs + ended, final)
