"""Host vector envs (Gymnasium envs stepped on the CPU), torch in and out.

Follows the contract in :mod:`corral.envs.base`. ``HostVecEnv`` is the front end
shared by the in-process (``SyncVecEnv``), subprocess and EnvPool backends: action
checks (shape, dtype, bounds), finite checks, and turning numpy results into torch.
The envs themselves are stepped by :class:`corral.envs.group.EnvGroup` (in this
process or in workers) or by EnvPool.

Beyond the base contract, ``info["episode_done"]`` (bool ``[N]``) marks where a whole
episode ended and ``episode_return`` / ``episode_length`` are valid. It equals
``terminated | truncated`` except where a life was lost under Atari's episodic-life
wrapper (the episode is the whole game) and where a crashed env was restarted (the
broken episode is dropped). The tensors in ``info`` are read-only by convention: where
no episode ended, ``final_obs`` is ``obs`` itself and the episode tensors are shared.

Written directly on top of ``gym.Env`` (not ``gymnasium.vector``) so the per-step cost
stays close to raw Gymnasium: results are gathered in lists and become one fresh numpy
array per field, which torch then shares without a copy.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from corral.envs.base import EnvError
from corral.envs.group import EnvGroup
from corral.envs.make import EnvFactory, check_env

BACKENDS = ("sync", "subproc", "envpool", "native")


def tree_to_torch(x: Any) -> Any:
    """numpy arrays -> tensors in a nested state, so a weights-only checkpoint holds it."""
    if isinstance(x, np.ndarray):
        return torch.from_numpy(np.array(x))
    if isinstance(x, dict):
        return {k: tree_to_torch(v) for k, v in x.items()}
    if isinstance(x, list):
        return [tree_to_torch(v) for v in x]
    return x


def tree_to_numpy(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy().copy()
    if isinstance(x, dict):
        return {k: tree_to_numpy(v) for k, v in x.items()}
    if isinstance(x, list):
        return [tree_to_numpy(v) for v in x]
    return x


def _all_finite(arr: np.ndarray) -> bool:
    if arr.size <= 512:  # small arrays: a Python sum beats numpy's call overhead; inf/nan propagate
        if math.isfinite(sum(arr.ravel().tolist())):
            return True
    return bool(np.isfinite(arr).all())  # (a huge finite sum can overflow to inf: decide exactly)


class HostVecEnv:
    """Front end of a vector env whose envs step on the host. Subclasses implement
    ``_reset_arrays(seed) -> obs`` and ``_step_arrays(actions) -> (obs, finals, rew,
    term, trunc, episodes)`` (see :meth:`EnvGroup.step`; arrays or lists)."""

    num_envs: int
    env_id: str
    copyable: bool = False

    def _init_front(
        self,
        num_envs: int,
        observation_space: gym.Space,
        action_space: gym.Space,
        env_id: str,
        device: str | torch.device,
        check_finite: bool,
        strict: bool,
    ) -> None:
        self.num_envs = num_envs
        self.env_id = env_id
        self.device = torch.device(device)
        self.check_finite = check_finite
        self.strict = strict
        if isinstance(observation_space, gym.spaces.Box) and observation_space.dtype.kind == "f" and \
                observation_space.dtype != np.float32:
            # The contract: float observations are float32 (MuJoCo's float64 included).
            with np.errstate(over="ignore"):
                observation_space = gym.spaces.Box(
                    observation_space.low.astype(np.float32), observation_space.high.astype(np.float32),
                    observation_space.shape, np.float32,
                )
        self.single_observation_space = observation_space
        self.single_action_space = action_space
        self.steps = 0  # vector steps since construction, for error messages
        self.out_of_bounds_actions = 0  # env actions outside a Box's bounds, clipped
        self._obs_dtype = np.dtype(observation_space.dtype)  # after the float32 cast above
        self._obs_shape = tuple(observation_space.shape)
        self._check_obs = check_finite and self._obs_dtype.kind == "f"
        space = action_space
        self._discrete = isinstance(space, gym.spaces.Discrete)
        # MultiDiscrete / MultiBinary: integer vectors checked against per-component ranges
        self._multi = isinstance(space, (gym.spaces.MultiDiscrete, gym.spaces.MultiBinary))
        self._act_shape = (num_envs, *space.shape)
        if self._discrete:
            self._act_lo, self._act_hi = int(space.start), int(space.start) + int(space.n)
        else:
            self._act_dtype = np.dtype(space.dtype)
            if isinstance(space, gym.spaces.MultiDiscrete):
                self._low = np.asarray(space.start, dtype=self._act_dtype)
                self._high = np.asarray(space.start + space.nvec - 1, dtype=self._act_dtype)
            elif isinstance(space, gym.spaces.MultiBinary):
                self._low = np.zeros(space.shape, dtype=self._act_dtype)
                self._high = np.ones(space.shape, dtype=self._act_dtype)
            else:
                self._low = np.asarray(space.low, dtype=self._act_dtype)
                self._high = np.asarray(space.high, dtype=self._act_dtype)
        self._warned_oob = False
        n = num_envs
        self._no_ep_ret = torch.zeros(n, dtype=torch.float32, device=self.device)
        self._no_ep_len = torch.zeros(n, dtype=torch.int64, device=self.device)
        self._no_ep_done = torch.zeros(n, dtype=torch.bool, device=self.device)
        self._on_cpu = self.device.type == "cpu"
        self._restart_messages: list[str] = []  # a backend's restart notices, warned after the step

    # --- the boundary
    def _actions(self, action: Any) -> np.ndarray:
        """Check one batch of actions and hand back the numpy array the envs get."""
        if not isinstance(action, torch.Tensor):
            action = torch.as_tensor(np.asarray(action))
        shape = action.shape
        if shape != self._act_shape and not (self._discrete and shape == (self.num_envs, 1)):
            raise EnvError(
                f"env {self.env_id!r}: action has shape {tuple(shape)}, expected {self._act_shape} "
                f"(one action per env for {self.num_envs} envs)"
            )
        dtype = action.dtype
        try:
            acts = action.numpy()
        except (TypeError, RuntimeError):  # on a GPU, or part of a graph
            acts = action.detach().cpu().numpy()
        if self._discrete:
            if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
                raise EnvError(
                    f"env {self.env_id!r}: actions for {self.single_action_space} must be integers, got {dtype}; "
                    "cast them with .long()"
                )
            if acts.ndim != 1:
                acts = acts.reshape(self.num_envs)
            values = acts.tolist()
            lo, hi = self._act_lo, self._act_hi
            if min(values) < lo or max(values) >= hi:
                i = next(j for j, v in enumerate(values) if not lo <= v < hi)
                raise EnvError(
                    f"env {self.env_id!r}: action {values[i]} for env index {i} is outside "
                    f"{self.single_action_space} (valid: {lo} .. {hi - 1})"
                )
            return acts
        if self._multi:
            return self._multi_actions(acts, dtype)
        if dtype.is_complex or dtype == torch.bool:
            raise EnvError(f"env {self.env_id!r}: actions for {self.single_action_space} must be real numbers, got {dtype}")
        if acts.dtype != self._act_dtype:
            acts = acts.astype(self._act_dtype)
        # One comparison pass in the common case; NaN fails it too and is sorted out below.
        if not ((acts >= self._low).all() and (acts <= self._high).all()):
            acts = self._out_of_bounds(acts)
        return acts

    def _multi_actions(self, acts: np.ndarray, dtype: torch.dtype) -> np.ndarray:
        """MultiDiscrete / MultiBinary: integers (bools too for MultiBinary), each component in range."""
        binary = isinstance(self.single_action_space, gym.spaces.MultiBinary)
        if dtype.is_floating_point or dtype.is_complex or (dtype == torch.bool and not binary):
            raise EnvError(
                f"env {self.env_id!r}: actions for {self.single_action_space} must be integers, got {dtype}; "
                "cast them with .long()"
            )
        if not ((acts >= self._low).all() and (acts <= self._high).all()):
            bad = ((acts < self._low) | (acts > self._high)).reshape(self.num_envs, -1).any(axis=1)
            i = int(np.nonzero(bad)[0][0])
            raise EnvError(
                f"env {self.env_id!r}: action {acts[i].tolist()} for env index {i} is outside "
                f"{self.single_action_space} (valid: {self._low.tolist()} .. {self._high.tolist()})"
            )
        return acts if acts.dtype == self._act_dtype else acts.astype(self._act_dtype)

    def _out_of_bounds(self, acts: np.ndarray) -> np.ndarray:
        flat = acts.reshape(self.num_envs, -1)
        finite = np.isfinite(flat).all(axis=1)
        if not finite.all():
            i = int(np.nonzero(~finite)[0][0])
            raise EnvError(f"env {self.env_id!r}: action for env index {i} is not finite: {acts[i].tolist()}")
        bad = ((acts < self._low) | (acts > self._high)).reshape(self.num_envs, -1).any(axis=1)
        i = int(np.nonzero(bad)[0][0])
        where = (
            f"env {self.env_id!r}: action {acts[i].tolist()} for env index {i} is outside the action space "
            f"bounds [{self._low.tolist()}, {self._high.tolist()}]"
        )
        if self.strict:
            raise EnvError(where + " (strict=True; scale or clip actions in the policy)")
        self.out_of_bounds_actions += int(bad.sum())
        if not self._warned_oob:
            self._warned_oob = True
            warnings.warn(where + "; clipping it (and any later ones, counted in out_of_bounds_actions)", stacklevel=4)
        return np.clip(acts, self._low, self._high)

    def _check(self, what: str, arr: np.ndarray) -> None:
        """Raise naming the first env whose ``what`` is not finite."""
        if _all_finite(arr):
            return
        bad = np.nonzero(~np.isfinite(arr.reshape(len(arr), -1)).all(axis=1))[0]
        raise EnvError(
            f"env {self.env_id!r} (index {int(bad[0])}) returned a non-finite {what} at vector step "
            f"{self.steps}; fix the env or wrap it to keep values finite"
        )

    def _obs_array(self, obs: Any) -> np.ndarray:
        try:
            arr = np.asarray(obs, dtype=self._obs_dtype)
        except (ValueError, TypeError) as e:
            arr, err = None, e
        if arr is None or arr.shape[1:] != self._obs_shape:
            shapes = sorted({np.shape(o) for o in obs}, key=str)
            raise EnvError(
                f"env {self.env_id!r} returned observations of shape {', '.join(map(str, shapes))} at vector step "
                f"{self.steps}; its observation space says {self._obs_shape}"
                + (f" ({err})" if arr is None else "")
            )
        return arr

    def _tensor(self, arr: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(arr)
        return t if self._on_cpu else t.to(self.device, non_blocking=True)

    # --- the contract
    def reset(self, seed: int | None = None) -> torch.Tensor:
        obs = self._obs_array(self._reset_arrays(seed))
        if self._check_obs:
            self._check("observation", obs)
        return self._tensor(obs)

    def step(self, action: torch.Tensor):
        acts = self._actions(action)
        obs, finals, rew, term, trunc, episodes = self._step_arrays(acts)
        obs = self._obs_array(obs)
        rew = np.array(rew, dtype=np.float32)
        if self.check_finite:
            # One Python sum over both in the common small case (inf and nan propagate).
            if not (self._check_obs and obs.size <= 512 and math.isfinite(sum(obs.ravel().tolist()) + sum(rew.tolist()))):
                if self._check_obs:
                    self._check("observation", obs)
                self._check("reward", rew)
        if self._on_cpu:
            to_torch = torch.from_numpy  # the arrays are fresh: torch shares them, no copy
        else:
            to_torch = self._tensor
        obs_t = to_torch(obs)
        if finals:
            final = obs.copy()
            for i, fo in finals.items():
                final[i] = fo
            if self._check_obs and not math.isfinite(sum(final[list(finals)].ravel().tolist())):
                self._check("observation", final)
            final_t = to_torch(final)
        else:
            final_t = obs_t  # equal where it matters (nowhere: no episode ended)
        if episodes:
            n = self.num_envs
            ep_ret, ep_len, ep_done = [0.0] * n, [0] * n, [False] * n
            for i, ret, length in episodes:
                ep_ret[i], ep_len[i], ep_done[i] = ret, length, True
            if max(map(abs, ep_ret)) < 3e38:
                ep_ret = np.array(ep_ret, dtype=np.float32)
            else:
                with np.errstate(over="ignore"):  # a return past float32's range reads as inf, as it is
                    ep_ret = np.array(ep_ret, dtype=np.float32)
            info = {"final_obs": final_t, "episode_return": to_torch(ep_ret),
                    "episode_length": to_torch(np.array(ep_len, dtype=np.int64)),
                    "episode_done": to_torch(np.array(ep_done, dtype=bool))}
        else:
            info = {"final_obs": final_t, "episode_return": self._no_ep_ret,
                    "episode_length": self._no_ep_len, "episode_done": self._no_ep_done}
        self.steps += 1
        if self._restart_messages:
            self._warn_restarts()
        return (
            obs_t,
            to_torch(rew),
            to_torch(np.array(term, dtype=bool)),
            to_torch(np.array(trunc, dtype=bool)),
            info,
        )

    def _warn_restarts(self) -> None:
        for m in self._restart_messages:
            warnings.warn(m, stacklevel=3)
        self._restart_messages.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.env_id!r}, num_envs={self.num_envs})"


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

    def _step_arrays(self, acts):
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


def make_vec_env(
    spec: Any,
    num_envs: int,
    kwargs: dict | None = None,
    device: str | torch.device = "cpu",
    backend: str = "sync",
    *,
    atari_wrappers: Any = True,
    strict: bool = False,
    on_error: str = "raise",
    max_restarts: int = 100,
    num_workers: int | None = None,
    check_finite: bool = True,
) -> HostVecEnv:
    """Build N envs for ``spec`` on ``backend``; the one entry point every caller uses.

    ``backend``: ``"sync"`` (in this process), ``"subproc"`` (worker processes, each
    stepping a slice of the envs; ``num_workers`` of them, default one per CPU core up
    to N), ``"envpool"`` (EnvPool's C++ thread pool, for the ids it knows) or
    ``"native"`` (torch-batched classic control). Every backend follows
    :mod:`corral.envs.base`.

    ``atari_wrappers``: for ALE ids, ``True`` applies the training preprocessing (no-op
    reset, frame skip 4 with max-pool, 84x84 gray, frame stack 4, episodic life, reward
    clipping, fire on reset), ``"eval"`` the same without episodic life and clipping,
    a dict overrides single options (see :class:`corral.envs.atari.AtariOptions`),
    ``False`` none. ``info["episode_return"]`` is always the raw game score.

    ``strict``: reject out-of-bounds Box actions (default: clip them and count them in
    ``env.out_of_bounds_actions``). ``on_error``: ``"raise"`` or ``"restart"`` an env that
    raises (at most ``max_restarts`` times per env; counted in ``env.restarts``).
    """
    from corral.envs.make import env_name, make_factory
    from corral.errors import UserError

    if num_envs < 1:
        raise UserError(f"env.num_envs must be >= 1, got {num_envs}")
    if on_error not in ("raise", "restart"):
        raise UserError(f"on_error must be 'raise' or 'restart', got {on_error!r}")
    name = env_name(spec)
    if isinstance(spec, str) and (spec.startswith("native:") or backend == "native"):
        from corral.envs.native import make_native

        return make_native(spec, num_envs, device=device)
    if backend == "envpool":
        from corral.envs.envpool_backend import EnvPoolVecEnv

        return EnvPoolVecEnv(spec, num_envs, kwargs, device=device, atari_wrappers=atari_wrappers, strict=strict,
                             check_finite=check_finite)
    if backend not in ("sync", "subproc"):
        raise UserError(f"unknown env backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
    factory = make_factory(spec, kwargs, atari_wrappers=atari_wrappers)
    if backend == "subproc":
        from corral.envs.subproc import SubprocVecEnv

        return SubprocVecEnv(factory, num_envs, env_id=name, device=device, num_workers=num_workers, strict=strict,
                             on_error=on_error, max_restarts=max_restarts, check_finite=check_finite)
    return SyncVecEnv([factory] * num_envs, env_id=name, device=device, check_finite=check_finite, strict=strict,
                      on_error=on_error, max_restarts=max_restarts)
