"""Checkpointing of the replay ring: ``state_dict`` (views of the live storage, loadable with
``weights_only=True``) and ``load_state_dict`` (checked against the buffer's settings; a
whole-observation state loads into a frame-stack buffer)."""

from __future__ import annotations

from typing import Any

import torch

from corral.rng import set_generator_state
from corral.storage.replay_parts import _NO_KEY, _STATE_VERSION


class ReplayStateParts:
    """``ReplayBuffer``'s checkpoint state (a part of it)."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue: filled rows, side store, counters, RNG.

        Tensors are views of the live storage, so a 5M-transition buffer is not
        copied in memory; save them before the next ``add``. (``torch.save``
        writes a view's whole storage, so the file has the full capacity.)
        Holds only tensors, ints, floats, strs and lists: loadable with
        ``torch.load(..., weights_only=True)``.
        """
        filled = self._rows_filled
        frames = {}
        if self.frame_stack > 1:
            filled_obs = min(self._steps, self._obs_rows)
            frames = {"starts": self._starts[:filled_obs], **self._heads.state("heads")}
        else:
            filled_obs = filled
        return {
            "version": _STATE_VERSION,
            "kind": type(self).__name__,
            "capacity": self.capacity,
            "num_envs": self.num_envs,
            "n_step": self.n_step,
            "gamma": self.gamma,
            "obs_shape": list(self.obs_shape),
            "action_shape": list(self.action_shape),
            "frame_stack": self.frame_stack,
            "steps": self._steps,
            "obs": self._obs[:filled_obs],
            "action": self._action[:filled],
            "reward": self._reward[:filled],
            "flags": self._flags[:filled],
            **self._final.state("final"),
            **frames,
            "generator": self._generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, mine in (
            ("kind", type(self).__name__),
            ("capacity", self.capacity),
            ("num_envs", self.num_envs),
            ("n_step", self.n_step),
            ("obs_shape", list(self.obs_shape)),
            ("action_shape", list(self.action_shape)),
        ):
            theirs = state.get(key)
            if theirs != mine:
                raise ValueError(
                    f"replay checkpoint has {key}={theirs!r} but this {type(self).__name__} has {key}={mine!r}; "
                    "build the buffer with the same settings as the run that saved it"
                )
        version = int(state.get("version", -1))
        if version not in (1, _STATE_VERSION):
            raise ValueError(f"replay checkpoint version {state.get('version')!r} is not 1 or {_STATE_VERSION}")
        theirs, k = int(state.get("frame_stack", 1)), self.frame_stack
        if theirs != k and theirs != 1:
            raise ValueError(
                f"replay checkpoint stores frames of {theirs}-frame stacks but this {type(self).__name__} has "
                f"frame_stack={k}; build the buffer with frame_stack={theirs}"
            )
        if tuple(state["reward"].shape[2:]) != self.reward_shape:
            raise ValueError(f"replay checkpoint stores rewards of shape {tuple(state['reward'].shape[2:])} per slot but "
                             f"this {type(self).__name__} has reward_shape={self.reward_shape}; build it with the same "
                             "settings as the run that saved it")
        self._steps = int(state["steps"])
        filled = self._rows_filled
        for name in ("action", "reward", "flags"):
            getattr(self, f"_{name}")[:filled].copy_(state[name])
        self._final.load(state, "final")
        if k == 1:
            self._obs[:filled].copy_(state["obs"])
        elif theirs == k:
            filled_obs = min(self._steps, self._obs_rows)
            self._obs[:filled_obs].copy_(state["obs"])
            self._starts[:filled_obs].copy_(state["starts"])
            self._heads.load(state, "heads")
            if self._steps:
                last = torch.full((self.num_envs,), self._steps - 1, device=self.device)
                self._last_obs.copy_(self._stacks(last, self._env_ids))
        else:  # whole observations saved: keep the newest frame of each, in order (exact, once)
            steps, T = self._steps, self.capacity_per_env
            obs = state["obs"].to(self.device)
            self._heads.keys.fill_(_NO_KEY)
            self._heads.cursor = 0
            for step in range(steps - filled, steps):
                self._steps = step
                self._add_frames(obs[step % T], first=step == steps - filled)
            self._steps = steps
        self._young_cache = None
        set_generator_state(self._generator, state["generator"])  # reseeded if saved on another device type
        self.server_state = state.get("server")  # a replay server's own state (Ape-X), for start_replay
        # With a server's state, the generator is the server's sampling stream (a CPU one): a
        # learner's buffer on a GPU cannot hold it, so start_replay hands the server this copy.
        self.server_generator = state["generator"] if self.server_state is not None else None
