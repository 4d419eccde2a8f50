"""The one vector-env contract every backend in corral follows.

A ``VecEnv`` holds N environments and speaks torch tensors with a leading env
dimension. Semantics shared by every backend (in-process, subprocess, native
torch-batched, Ray workers):

* ``reset(seed)`` returns ``obs[N, *obs_shape]``. Env ``i`` is seeded with
  ``seed + i`` when a seed is given.
* ``step(action[N, *act_shape])`` returns ``(obs, reward, terminated, truncated, info)``.
  ``reward`` is float32 ``[N]``; ``terminated`` / ``truncated`` are bool ``[N]``.
* Autoreset happens in the same step: where an episode ended, ``obs`` is already
  the first observation of the next episode and ``info["final_obs"][i]`` holds the
  true last observation of the finished one. For envs that did not finish,
  ``info["final_obs"][i] == obs[i]``. Value targets therefore bootstrap from
  ``final_obs`` on truncation and not at all on termination.
* ``info["episode_return"]`` (float32 ``[N]``) and ``info["episode_length"]``
  (int64 ``[N]``) hold the undiscounted return and length of the episode that
  just ended, valid where ``info["episode_done"]`` (bool ``[N]``). That flag marks
  whole episodes: an Atari life lost under episodic life is ``terminated`` for the
  value targets but not a finished episode, and an env restarted after a crash is
  ``truncated`` without one. Backends without such cases may omit it; readers use
  ``episode_done(info, terminated, truncated)`` (below).
* Everything a step returns is read-only for its consumers. ``obs`` and ``reward``
  are fresh tensors each step (never overwritten later); in a step where no episode
  ended, ``info["final_obs"]`` is ``obs`` itself, and ``terminated``, ``truncated``
  and the episode tensors may be shared all-false / zero constants.
* ``state_dict()`` / ``load_state_dict()`` capture everything needed to continue
  bit-for-bit (env internals, RNGs, running episode statistics) when
  ``copyable`` is True; otherwise they hold only the episode statistics and a
  resumed run starts fresh episodes.
* ``device_resident`` (optional, default False): stepping needs no host read (the env's
  tensors live on ``device``, as ``native:`` envs' do). The Learner then books episodes
  and checks normalizer inputs once per update instead of once per step.

Observations from Gymnasium come back as float32 tensors (uint8 images stay
uint8); the actor owns normalization.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import gymnasium as gym
import torch


@runtime_checkable
class VecEnv(Protocol):
    num_envs: int
    single_observation_space: gym.Space
    single_action_space: gym.Space
    device: torch.device
    env_id: str
    copyable: bool
    device_resident: bool

    def reset(self, seed: int | None = None) -> torch.Tensor: ...

    def step(
        self, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class EnvError(RuntimeError):
    """An env misbehaved (non-finite values, raised mid-episode, bad action)."""


def episode_done(info: dict, terminated: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """Where a whole episode ended in this step, as the contract says: ``info["episode_done"]``
    where the backend reports it (a lost Atari life or a restarted env's dropped episode is
    not one), else ``terminated | truncated``. The Learner, collectors and evaluation all ask
    this one function."""
    done = info.get("episode_done")
    return terminated | truncated if done is None else done
