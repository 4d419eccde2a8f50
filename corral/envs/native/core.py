"""What every torch-batched env shares: autoreset, episode statistics, seeding, checkpoints.

A subclass only writes the physics (:meth:`NativeVecEnv._advance`), the initial-state
distribution (:meth:`NativeVecEnv._sample_initial`) and the observation
(:meth:`NativeVecEnv._observe`); this class turns that into the VecEnv contract of
:mod:`corral.envs.base`.

Layout: the physical state is held component-major, ``[state_dim, N]``, so each
component (cart position, pole angle, ...) is one contiguous vector and the physics is
a handful of whole-vector ops. ``get_state`` / ``set_state`` / ``state_dict`` speak the
usual ``[N, state_dim]``.

Randomness: one ``torch.Generator`` on the device serves the whole batch (initial
states of every episode). ``reset(seed)`` seeds it with ``seed``. The streams are not
Gymnasium's ``np_random`` and env ``i`` does not get ``seed + i`` as in the other
backends: the same seed gives the same batch of episodes on the same device, and
equivalence with Gymnasium is tested by setting states, not by seeding.
"""

from __future__ import annotations

import numbers
from typing import Any, ClassVar

import gymnasium as gym
import torch

from corral.envs.base import EnvError
from corral.rng import set_generator_state


class NativeVecEnv:
    """N copies of one classic-control env, stepped as tensors on ``device``.

    ``step`` never syncs with the device on CUDA: ends of episodes are handled with
    ``torch.where`` over the whole batch. On CPU, where a sync costs nothing, only the
    envs that finished draw new initial states (drawing random numbers for all N every
    step would cost more than the physics).

    The physics runs in ``dtype`` (float32 by default; float64 reproduces Gymnasium's
    numpy arithmetic, in the side-by-side test to the bit on CPU). Observations are
    float32 whatever ``dtype`` is, as Gymnasium's are.

    Action values are not range-checked (that would need a device sync); shapes and
    dtypes are.
    """

    gym_id: ClassVar[str]
    max_episode_steps: ClassVar[int]
    state_dim: ClassVar[int]
    copyable = True
    device_resident = True  # steps with no host read: the Learner keeps it that way

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int | None = None,
        dtype: torch.dtype = torch.float32,
    ):
        if isinstance(num_envs, bool) or not isinstance(num_envs, numbers.Integral) or num_envs < 1:
            raise ValueError(f"{self.gym_id}: num_envs must be an int >= 1, got {num_envs!r}")
        num_envs = int(num_envs)
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"{self.gym_id}: dtype must be torch.float32 or torch.float64, got {dtype}")
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.dtype = dtype
        self.env_id = "native:" + self.gym_id
        self.single_observation_space, self.single_action_space = self._spaces()
        self._discrete = isinstance(self.single_action_space, gym.spaces.Discrete)
        self._act_dim = None if self._discrete else int(self.single_action_space.shape[0])
        self._sparse_reset = self.device.type == "cpu"
        self._scratch_bufs: dict[str, torch.Tensor] = {}
        self._bounds: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

        self._s = torch.zeros(self.state_dim, num_envs, dtype=dtype, device=self.device)
        self._elapsed = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        # Returns add up in float64 as SyncVecEnv's do (MPS has no float64).
        ret_dtype = torch.float32 if self.device.type == "mps" else torch.float64
        self._ep_ret = torch.zeros(num_envs, dtype=ret_dtype, device=self.device)
        self._gen = torch.Generator(device=self.device)
        if seed is None:
            self._gen.seed()  # nondeterministic, like gymnasium without a seed
        self.reset(seed)

    # ------------------------------------------------------------------ subclass hooks
    def _spaces(self) -> tuple[gym.Space, gym.Space]:
        raise NotImplementedError

    def _sample_initial(self, n: int) -> torch.Tensor:
        """``[state_dim, n]`` fresh initial states in ``self.dtype``."""
        raise NotImplementedError

    def _advance(self, s: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Step ``s`` (``[state_dim, N]``) in place; return (reward float32 [N], terminated bool [N])."""
        raise NotImplementedError

    def _observe(self, s: torch.Tensor) -> torch.Tensor:
        """A fresh float32 ``[n, obs_dim]`` observation of ``s`` (``[state_dim, n]``)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ helpers for subclasses
    def _uniform(self, n: int, low: list[float], high: list[float]) -> torch.Tensor:
        """``[len(low), n]`` uniform draws, ``low + (high - low) * u`` as numpy's ``uniform``."""
        u = torch.rand(len(low), n, generator=self._gen, device=self.device, dtype=self.dtype)
        key = (tuple(low), tuple(high))
        bounds = self._bounds.get(key)
        if bounds is None:  # made once: a host-to-device copy per step would cost more than the draw
            lo = torch.tensor(low, dtype=self.dtype, device=self.device).unsqueeze(1)
            hi = torch.tensor(high, dtype=self.dtype, device=self.device).unsqueeze(1)
            bounds = self._bounds[key] = (lo, hi - lo)
        lo, width = bounds
        return u.mul_(width).add_(lo)

    def _scratch(self, name: str, rows: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``[rows, N]`` work space named ``name``, allocated on first use and then reused.

        On CPU a fresh N-sized temporary is fresh memory from the OS each step (glibc
        maps big blocks and unmaps them on free), and the page faults cost more than
        the arithmetic. Returned tensors are still fresh: callers may keep them.
        """
        dtype = dtype or self.dtype
        buf = self._scratch_bufs.get(name)
        if buf is None:
            buf = self._scratch_bufs[name] = torch.empty(rows, self.num_envs, dtype=dtype, device=self.device)
        return buf

    @staticmethod
    def _columns(cols: list[torch.Tensor]) -> torch.Tensor:
        """Stack per-component vectors into float32 ``[n, len(cols)]``.

        Column copies: about 3x faster on CPU than ``torch.stack(cols, 1)``, which
        copies element by element, and they cast to float32 on the way.
        """
        out = torch.empty(cols[0].shape[0], len(cols), dtype=torch.float32, device=cols[0].device)
        for i, c in enumerate(cols):
            out[:, i].copy_(c)
        return out

    # ------------------------------------------------------------------ VecEnv contract
    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Start new episodes in every env; ``seed`` reseeds the batch generator."""
        if seed is not None:
            self._gen.manual_seed(int(seed))
        self._s.copy_(self._sample_initial(self.num_envs))
        self._elapsed.zero_()
        self._ep_ret.zero_()
        return self._observe(self._s)

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        action = self._check_action(action)
        s = self._s
        reward, terminated = self._advance(s, action)
        self._elapsed += 1
        # As Gymnasium's TimeLimit: truncated at the limit even when the env also
        # terminated on that step (consumers bootstrap only where truncated & ~terminated).
        truncated = self._elapsed >= self.max_episode_steps
        done = torch.bitwise_or(terminated, truncated, out=self._scratch("done", 1, torch.bool)[0])
        final_obs = self._observe(s)
        self._ep_ret += reward
        episode_return = self._ep_ret.to(torch.float32)
        episode_length = self._elapsed.clone()

        if self._sparse_reset:
            # CPU: only finished envs draw new states; nonzero() is free of device syncs here.
            idx = done.nonzero().squeeze(1)
            obs = final_obs.clone()
            if idx.numel() > 0:
                fresh = self._sample_initial(idx.numel())
                s[:, idx] = fresh
                obs[idx] = self._observe(fresh)
                self._elapsed[idx] = 0
                self._ep_ret[idx] = 0.0
        else:
            # Accelerators: no host sync, draw for all and select.
            fresh = self._sample_initial(self.num_envs)
            s.copy_(torch.where(done, fresh, s))
            obs = torch.where(done.unsqueeze(1), self._observe(fresh), final_obs)
            self._elapsed.masked_fill_(done, 0)
            self._ep_ret.masked_fill_(done, 0.0)

        info = {"final_obs": final_obs, "episode_return": episode_return, "episode_length": episode_length}
        return obs, reward, terminated, truncated, info

    def _check_action(self, action: Any) -> torch.Tensor:
        if not isinstance(action, torch.Tensor):
            action = torch.as_tensor(action)
        action = action.to(self.device)
        n = self.num_envs
        if self._discrete:
            if action.shape == (n, 1):
                action = action.view(n)
            if action.shape != (n,):
                raise EnvError(
                    f"env {self.env_id!r}: action has shape {tuple(action.shape)}, expected ({n},) "
                    f"(one integer action per env for {n} envs)"
                )
            if action.is_floating_point() or action.is_complex() or action.dtype == torch.bool:
                raise EnvError(
                    f"env {self.env_id!r}: actions must be integers in [0, {self.single_action_space.n}), "
                    f"got dtype {action.dtype}; sample from a categorical head or cast with .long()"
                )
            return action
        if self._act_dim == 1 and action.shape == (n,):
            action = action.view(n, 1)
        if action.shape != (n, self._act_dim):
            raise EnvError(
                f"env {self.env_id!r}: action has shape {tuple(action.shape)}, expected ({n}, {self._act_dim})"
            )
        if action.dtype not in (torch.float32, torch.float64):
            # Integer or half-precision actions: compute as Gymnasium would with its float32 Box.
            action = action.to(torch.float32)
        return action

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit-for-bit: states, clocks, returns, generator."""
        return {
            "env_id": self.env_id,
            "num_envs": self.num_envs,
            "copyable": True,
            "state": self.get_state(),
            "elapsed_steps": self._elapsed.clone(),
            "episode_return": self._ep_ret.clone(),
            "rng_state": self._gen.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore a :meth:`state_dict`; returns True (episodes continue where they were)."""
        if state.get("env_id") != self.env_id or state.get("num_envs") != self.num_envs:
            raise ValueError(
                f"state of {state.get('env_id')!r} with {state.get('num_envs')} envs cannot be loaded into "
                f"{self.env_id!r} with {self.num_envs} envs; build the env with the same id and num_envs"
            )
        self.set_state(state["state"], state["elapsed_steps"])
        self._ep_ret.copy_(state["episode_return"])
        # saved on another device type (a CPU run resumed on CUDA): reseeded from the saved state
        set_generator_state(self._gen, state["rng_state"])
        return True

    def get_state(self) -> torch.Tensor:
        """The raw physical state, ``[N, state_dim]`` in ``dtype`` (Gymnasium's ``env.unwrapped.state``)."""
        return self._s.T.contiguous()

    @property
    def elapsed_steps(self) -> torch.Tensor:
        """Steps taken in each env's current episode (int64 ``[N]``)."""
        return self._elapsed.clone()

    def set_state(self, state: torch.Tensor, elapsed_steps: torch.Tensor | int | None = None) -> None:
        """Overwrite the physical state (``[N, state_dim]``) and, if given, the episode clocks."""
        state = torch.as_tensor(state)
        if state.shape != (self.num_envs, self.state_dim):
            raise ValueError(
                f"{self.env_id}: state must have shape ({self.num_envs}, {self.state_dim}), got {tuple(state.shape)}"
            )
        self._s.copy_(state.T)
        if elapsed_steps is not None:
            self._elapsed.copy_(torch.as_tensor(elapsed_steps))

    def close(self) -> None:
        """Nothing to release: the envs are tensors."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.env_id}, num_envs={self.num_envs}, device={self.device}, dtype={self.dtype})"
