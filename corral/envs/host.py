"""Host vector envs (Gymnasium envs stepped on the CPU), torch in and out.

Follows the contract in :mod:`corral.envs.base`. ``HostVecEnv`` is the front end
shared by the in-process (:mod:`corral.envs.sync`), subprocess and EnvPool backends: action
checks (shape, dtype, bounds), finite checks, and turning numpy results into torch.
The envs themselves are stepped by :class:`corral.envs.group.EnvGroup` (in this
process or in workers) or by EnvPool.

Beyond the base contract, ``info["episode_done"]`` (bool ``[N]``) marks where a whole
episode ended and ``episode_return`` / ``episode_length`` are valid. It equals
``terminated | truncated`` except where a life was lost under Atari's episodic-life
wrapper (the episode is the whole game) and where a crashed env was restarted (the
broken episode is dropped). The tensors in ``info`` are read-only by convention: where
no episode ended, ``final_obs`` is ``obs`` itself and ``terminated``, ``truncated`` and the
episode tensors are shared all-false / zero constants.

Written directly on top of ``gym.Env`` (not ``gymnasium.vector``) so the per-step cost
stays close to raw Gymnasium (a vector step of 8 CartPoles is only ~50 us): the envs'
results go straight into one fresh numpy array per field, which torch shares without a
copy, and a step in which no episode ended returns shared constants for the fields that
only matter when one did.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from corral.envs.base import EnvError
from corral.envs.group import Ended, obs_dtype


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
    """Whether every value of a float array is finite."""
    # The sum of squares is one BLAS call, cheaper than isfinite + all at any size; inf and
    # nan propagate into it. Only a huge finite value can overflow it: then decide exactly.
    return math.isfinite(np.vdot(arr, arr)) or bool(np.isfinite(arr).all())


# Torch dtypes an integer action may come in.
_INT_DTYPES = frozenset({torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16,
                         torch.uint32, torch.uint64})


class HostVecEnv:
    """Front end of a vector env whose envs step on the host. Subclasses implement
    ``_reset_arrays(seed) -> obs`` and either ``_step(actions) -> (obs, rew, ended)``
    (fresh arrays, see :meth:`EnvGroup.step`) or ``_step_arrays(actions) -> (obs, finals,
    rew, term, trunc, episodes)`` (arrays or lists)."""

    num_envs: int
    env_id: str
    copyable: bool = False
    device_resident = False  # the envs step on the host: every step reads it
    _discrete_as_array = False  # Discrete actions as one numpy array (backends that hand the batch on)

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
        if isinstance(observation_space, gym.spaces.Box) and obs_dtype(observation_space) != observation_space.dtype:
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
        self._obs_dtype = obs_dtype(observation_space)
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
        if self._discrete:
            # What Gymnasium's sample() gives (numpy scalars of the space's dtype), made once
            # (which costs less than making them, and Gymnasium checks them faster than ints),
            # keyed by value: a lookup is the range check too.
            self._act_type = space.dtype.type
            n_act = self._act_hi - self._act_lo
            small = n_act <= 4096 and not self._discrete_as_array
            self._act_values = {v: self._act_type(v) for v in range(self._act_lo, self._act_hi)} if small else None
        elif not self._multi:
            # Bounds that are one number each (the usual [-1, 1]) take a min and a max to check.
            lo, hi = np.unique(self._low), np.unique(self._high)
            self._uniform_bounds = (float(lo[0]), float(hi[0])) if len(lo) == 1 and len(hi) == 1 else None
        n = num_envs
        self._on_cpu = self.device.type == "cpu"
        if self._on_cpu:
            self._tensor = torch.from_numpy  # one call fewer per tensor, five times a step
        dev = self.device
        # Shared constants for steps in which nothing ended (read-only, like everything a step returns)
        self._no_term = torch.zeros(n, dtype=torch.bool, device=dev)
        self._no_trunc = torch.zeros(n, dtype=torch.bool, device=dev)
        self._no_ep_ret = torch.zeros(n, dtype=torch.float32, device=dev)
        self._no_ep_len = torch.zeros(n, dtype=torch.int64, device=dev)
        self._no_ep_done = torch.zeros(n, dtype=torch.bool, device=dev)
        self._restart_messages: list[str] = []  # a backend's restart notices, warned after the step

    # --- the boundary
    def _actions(self, action: Any) -> Any:
        """Check one batch of actions and hand back what the envs get: a list of numpy
        integers for ``Discrete`` (as ``sample()`` gives them; an array where
        ``_discrete_as_array``), a numpy array otherwise."""
        if not isinstance(action, torch.Tensor):
            action = torch.as_tensor(np.asarray(action))
        shape = action.shape
        if shape != self._act_shape and not (self._discrete and shape == (self.num_envs, 1)):
            raise EnvError(
                f"env {self.env_id!r}: action has shape {tuple(shape)}, expected {self._act_shape} "
                f"(one action per env for {self.num_envs} envs)"
            )
        dtype = action.dtype
        if self._discrete:
            if dtype not in _INT_DTYPES:
                raise EnvError(
                    f"env {self.env_id!r}: actions for {self.single_action_space} must be integers, got {dtype}; "
                    "cast them with .long()"
                )
            values = action.tolist()
            if len(shape) == 2:
                values = [v for (v,) in values]
            lo, hi = self._act_lo, self._act_hi
            table = self._act_values
            if table is not None:
                try:
                    return [table[v] for v in values]
                except KeyError:  # some value is out of range: named below
                    pass
            elif lo <= min(values) and max(values) < hi:
                if self._discrete_as_array:
                    return np.array(values, dtype=self._act_type)
                return [self._act_type(v) for v in values]
            i = next(j for j, v in enumerate(values) if not lo <= v < hi)
            raise EnvError(
                f"env {self.env_id!r}: action {values[i]} for env index {i} is outside "
                f"{self.single_action_space} (valid: {lo} .. {hi - 1})"
            )
        try:
            acts = action.numpy()
        except (TypeError, RuntimeError):  # on a GPU, or part of a graph
            acts = action.detach().cpu().numpy()
        if self._multi:
            return self._multi_actions(acts, dtype)
        if dtype.is_complex or dtype == torch.bool:
            raise EnvError(f"env {self.env_id!r}: actions for {self.single_action_space} must be real numbers, got {dtype}")
        if acts.dtype != self._act_dtype:
            acts = acts.astype(self._act_dtype)
        # The common case in one pass; NaN and inf fail it too and are sorted out below.
        if self._uniform_bounds is not None and acts.size <= 512:
            # Python's min/max/sum over a list beat numpy's reductions at this size (and inf
            # and nan propagate through the sum, which min and max do not do reliably)
            values = acts.ravel().tolist()
            lo, hi = self._uniform_bounds
            ok = lo <= min(values) and max(values) <= hi and math.isfinite(sum(values))
        else:
            ok = (acts >= self._low).all() and (acts <= self._high).all() and np.isfinite(acts).all()
        return acts if ok else self._out_of_bounds(acts)

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
        obs, rew, ended = self._step(acts)  # fresh arrays each step: torch shares them, no copy
        # One test for both in the common case (see _all_finite); the exact ones name the culprit.
        if self.check_finite and not (self._check_obs and math.isfinite(float(np.vdot(obs, obs)) + sum(rew.tolist()))):
            if self._check_obs:
                self._check("observation", obs)
            self._check("reward", rew)
        tensor = self._tensor
        obs_t, rew_t = tensor(obs), tensor(rew)
        if ended:
            out = self._ended(obs, obs_t, rew_t, ended)
        else:  # the common case: nothing ended, so nothing else to make
            out = (obs_t, rew_t, self._no_term, self._no_trunc,
                   {"final_obs": obs_t, "episode_return": self._no_ep_ret, "episode_length": self._no_ep_len,
                    "episode_done": self._no_ep_done})
        self.steps += 1
        if self._restart_messages:
            self._warn_restarts()
        return out

    def _ended(self, obs: np.ndarray, obs_t: torch.Tensor, rew_t: torch.Tensor, ended: list[Ended]):
        """The step's tensors where some env ended an episode (or a life, or crashed).

        Flags nobody raised are the shared all-false constants, and where every env that
        ended closed a whole episode, ``episode_done`` is the ``terminated`` (or
        ``truncated``) tensor itself: a third of CartPole's vector steps come here."""
        n = self.num_envs
        final = obs.copy()
        term = trunc = ep_ret = None
        whole = True  # every env that ended closed an episode (no life lost, nothing restarted)
        for i, terminated, truncated, final_obs, episode in ended:
            final[i] = final_obs
            if terminated:
                if term is None:
                    term = np.zeros(n, dtype=bool)
                term[i] = True
            if truncated:
                if trunc is None:
                    trunc = np.zeros(n, dtype=bool)
                trunc[i] = True
            if episode is None:
                whole = False
                continue
            if ep_ret is None:
                ep_ret, ep_len = np.zeros(n, np.float32), np.zeros(n, np.int64)
            ret, ep_len[i] = episode
            if abs(ret) < 3e38:
                ep_ret[i] = ret
            else:
                with np.errstate(over="ignore"):  # a return past float32's range reads as inf, as it is
                    ep_ret[i] = ret
        if self._check_obs and not _all_finite(final):
            self._check("observation", final)
        tensor = self._tensor
        term_t = self._no_term if term is None else tensor(term)
        trunc_t = self._no_trunc if trunc is None else tensor(trunc)
        info = {"final_obs": tensor(final)}
        if ep_ret is None:
            info.update(episode_return=self._no_ep_ret, episode_length=self._no_ep_len, episode_done=self._no_ep_done)
        else:
            if whole and (term is None or trunc is None):
                done_t = term_t if trunc is None else trunc_t  # the same flags: one tensor for both
            else:
                ep_done = np.zeros(n, dtype=bool)
                for i, _, _, _, episode in ended:
                    ep_done[i] = episode is not None
                done_t = tensor(ep_done)
            info.update(episode_return=tensor(ep_ret), episode_length=tensor(ep_len), episode_done=done_t)
        return obs_t, rew_t, term_t, trunc_t, info

    def _step(self, acts: Any) -> tuple[np.ndarray, np.ndarray, list[Ended]]:
        """Step the envs: fresh observation and reward arrays, and the envs that ended (see
        :meth:`EnvGroup.step`). This default adapts backends that implement
        ``_step_arrays(acts) -> (obs, finals, rew, term, trunc, episodes)`` instead."""
        if isinstance(acts, list):
            acts = np.asarray(acts)
        obs_all, finals, rew_all, term, trunc, episodes = self._step_arrays(acts)
        obs = np.array(self._obs_array(obs_all))  # a copy: the backend may reuse its buffers
        rew = np.array(rew_all, dtype=np.float32)
        term, trunc = np.asarray(term, dtype=bool), np.asarray(trunc, dtype=bool)
        eps = {i: (ret, length) for i, ret, length in episodes}
        return obs, rew, [(int(i), bool(term[i]), bool(trunc[i]), finals[int(i)], eps.get(int(i)))
                          for i in np.nonzero(term | trunc)[0]]

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
