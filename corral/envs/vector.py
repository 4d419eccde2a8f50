"""In-process vector env: N Gymnasium envs stepped in a loop, torch in and out.

Follows the contract in :mod:`corral.envs.base`. Written directly on top of
``gym.Env`` (not ``gymnasium.vector``) so the per-step cost stays close to raw
Gymnasium: preallocated numpy buffers, one host->torch copy per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from corral.envs.base import EnvError
from corral.envs.make import EnvFactory, check_env

# Env modules whose whole state is plain attributes (arrays, numbers, RNGs), so a
# checkpoint can hold it and a resumed run continues the same episodes.
_COPYABLE_MODULES = ("gymnasium.envs.classic_control", "gymnasium.envs.toy_text")


def _is_copyable(env: gym.Env) -> bool:
    unwrapped = env.unwrapped
    return bool(getattr(unwrapped, "corral_copyable", False)) or type(unwrapped).__module__.startswith(_COPYABLE_MODULES)


def _plain_state(obj: Any) -> dict[str, Any]:
    """Attributes of one env layer that a weights-only checkpoint can hold."""
    out: dict[str, Any] = {}
    for k, v in vars(obj).items():
        if isinstance(v, (bool, int, float, str, type(None))):
            out[k] = v
        elif isinstance(v, np.ndarray):
            out[k] = {"__ndarray__": torch.from_numpy(np.array(v))}
        elif isinstance(v, np.generic):
            out[k] = {"__npscalar__": v.item(), "dtype": str(v.dtype)}
        elif isinstance(v, np.random.Generator):
            out[k] = {"__rng__": v.bit_generator.state}
        elif isinstance(v, tuple) and all(isinstance(x, (int, float, bool)) for x in v):
            out[k] = {"__tuple__": list(v)}
    return out


def _restore_plain_state(obj: Any, state: dict[str, Any]) -> None:
    for k, v in state.items():
        if isinstance(v, dict) and "__ndarray__" in v:
            v = v["__ndarray__"].numpy().copy()
        elif isinstance(v, dict) and "__npscalar__" in v:
            v = np.array(v["__npscalar__"], dtype=v["dtype"])[()]
        elif isinstance(v, dict) and "__rng__" in v:
            rng = getattr(obj, k, None)
            if not isinstance(rng, np.random.Generator):
                rng = np.random.Generator(np.random.PCG64())
            rng.bit_generator.state = v["__rng__"]
            v = rng
        elif isinstance(v, dict) and "__tuple__" in v:
            v = tuple(v["__tuple__"])
        setattr(obj, k, v)


def _layers(env: gym.Env) -> list[Any]:
    layers = [env]
    while hasattr(layers[-1], "env"):
        layers.append(layers[-1].env)
    return layers


class SyncVecEnv:
    """N envs in this process. See :mod:`corral.envs.base` for the semantics."""

    def __init__(
        self,
        factories: Sequence[EnvFactory],
        env_id: str = "env",
        device: str | torch.device = "cpu",
        check_finite: bool = True,
    ):
        self.envs = [f() for f in factories]
        self.num_envs = len(self.envs)
        self.env_id = env_id
        self.device = torch.device(device)
        self.check_finite = check_finite
        first = self.envs[0]
        check_env(first, env_id)
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.copyable = all(_is_copyable(e) for e in self.envs)
        obs_space = self.single_observation_space
        self._obs = np.zeros((self.num_envs, *obs_space.shape), dtype=obs_space.dtype)
        self._final = np.zeros_like(self._obs)
        self._rew = np.zeros(self.num_envs, dtype=np.float32)
        self._term = np.zeros(self.num_envs, dtype=bool)
        self._trunc = np.zeros(self.num_envs, dtype=bool)
        self._ep_ret = np.zeros(self.num_envs, dtype=np.float64)
        self._ep_len = np.zeros(self.num_envs, dtype=np.int64)
        self._done_ret = np.zeros(self.num_envs, dtype=np.float32)
        self._done_len = np.zeros(self.num_envs, dtype=np.int64)
        self.steps = 0  # vector steps since construction, for error messages
        self._discrete = isinstance(self.single_action_space, gym.spaces.Discrete)
        self._act_shape = (self.num_envs, *self.single_action_space.shape)

    def _to_torch(self, arr: np.ndarray) -> torch.Tensor:
        # One copy: the numpy buffers are reused next step.
        return torch.tensor(arr, device=self.device)

    def _check(self, what: str, arr: np.ndarray) -> None:
        if not np.isfinite(arr).all():
            bad = np.nonzero(~np.isfinite(arr.reshape(self.num_envs, -1)).all(axis=1))[0]
            raise EnvError(
                f"env {self.env_id!r} (index {int(bad[0])}) returned a non-finite {what} at vector step "
                f"{self.steps}; fix the env or wrap it to keep values finite"
            )

    def reset(self, seed: int | None = None) -> torch.Tensor:
        for i, env in enumerate(self.envs):
            obs, _ = env.reset(seed=None if seed is None else seed + i)
            self._obs[i] = obs
        self._ep_ret[:] = 0.0
        self._ep_len[:] = 0
        if self.check_finite and self._obs.dtype.kind == "f":
            self._check("observation", self._obs)
        return self._to_torch(self._obs)

    def step(self, action: torch.Tensor):
        if tuple(action.shape) != self._act_shape and not (self._discrete and tuple(action.shape) == (self.num_envs, 1)):
            raise EnvError(
                f"env {self.env_id!r}: action has shape {tuple(action.shape)}, expected {self._act_shape} "
                f"(one action per env for {self.num_envs} envs)"
            )
        actions = action.detach().cpu().numpy()
        if self._discrete:
            actions = actions.reshape(self.num_envs)
        obs_buf, final, rew, term, trunc = self._obs, self._final, self._rew, self._term, self._trunc
        for i, env in enumerate(self.envs):
            try:
                o, r, te, tr, _ = env.step(actions[i])
            except Exception as e:
                raise EnvError(
                    f"env {self.env_id!r} (index {i}) raised at vector step {self.steps}: {type(e).__name__}: {e}"
                ) from e
            rew[i] = r
            term[i] = te
            trunc[i] = tr
            final[i] = o
            if te or tr:
                o, _ = env.reset()
            obs_buf[i] = o
        if self.check_finite:
            if obs_buf.dtype.kind == "f":
                self._check("observation", final)
                self._check("observation", obs_buf)
            self._check("reward", rew)
        self.steps += 1
        self._ep_ret += rew
        self._ep_len += 1
        done = term | trunc
        np.copyto(self._done_ret, self._ep_ret, where=done, casting="unsafe")
        np.copyto(self._done_len, self._ep_len, where=done)
        self._ep_ret[done] = 0.0
        self._ep_len[done] = 0
        info = {
            "final_obs": self._to_torch(final),
            "episode_return": self._to_torch(self._done_ret),
            "episode_length": self._to_torch(self._done_len),
        }
        return (
            self._to_torch(obs_buf),
            self._to_torch(rew),
            self._to_torch(term),
            self._to_torch(trunc),
            info,
        )

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "copyable": self.copyable,
            "ep_ret": torch.from_numpy(self._ep_ret.copy()),
            "ep_len": torch.from_numpy(self._ep_len.copy()),
            "steps": self.steps,
        }
        if self.copyable:
            state["envs"] = [[_plain_state(layer) for layer in _layers(env)] for env in self.envs]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore; returns True when env internals were restored (episodes continue)."""
        self.steps = int(state.get("steps", 0))
        if not (state.get("copyable") and self.copyable and "envs" in state and len(state["envs"]) == self.num_envs):
            return False
        for env, layer_states in zip(self.envs, state["envs"]):
            layers = _layers(env)
            if len(layers) != len(layer_states):
                return False
            for layer, ls in zip(layers, layer_states):
                _restore_plain_state(layer, ls)
        self._ep_ret[:] = state["ep_ret"].numpy()
        self._ep_len[:] = state["ep_len"].numpy()
        return True

    def close(self) -> None:
        for env in self.envs:
            env.close()


def make_vec_env(
    spec: Any,
    num_envs: int,
    kwargs: dict | None = None,
    device: str | torch.device = "cpu",
    backend: str = "sync",
) -> "SyncVecEnv":
    """Build N envs for ``spec`` on ``backend``; the one entry point every caller uses."""
    from corral.envs.make import env_name, make_factory
    from corral.errors import UserError

    if num_envs < 1:
        raise UserError(f"env.num_envs must be >= 1, got {num_envs}")
    name = env_name(spec)
    if isinstance(spec, str) and (spec.startswith("native:") or backend == "native"):
        from corral.envs.native import make_native

        return make_native(spec, num_envs, device=device)
    if backend != "sync":
        raise UserError(f"unknown env backend {backend!r}; choose one of: sync, native")
    factory = make_factory(spec, kwargs)
    return SyncVecEnv([factory] * num_envs, env_id=name, device=device)
