"""Replay storage for off-policy algorithms: uniform, n-step and prioritized.

Layout. Every field is one tensor of shape ``[T, N, ...]`` allocated once, with
``T = capacity // num_envs`` rows and one column per env. ``add`` writes one row
(one transition per env) and the row cursor moves on, so the oldest row is the
one overwritten. The slot of env ``e`` at row ``t`` has the flat index ``t * N + e``;
that is what ``ReplayBatch.indices`` holds and what ``update_priorities`` takes.

Observations are stored once. The next observation of slot ``(t, e)`` is
``obs[t + 1, e]`` -- the observation the next ``add`` writes -- except where the
episode ended at ``t``. There the env has already reset, so the true final
observation is kept in a small side store, a ring of ``(key, final_obs)`` entries
where ``key = global_step * N + env``. Keys are handed out in increasing order, so
the ring is two sorted runs and a look-up is a ``searchsorted``. Entries die in
the order they were written (their rows are overwritten oldest first), so the
ring only has to grow when more episode ends are live than it holds; it then
doubles, which happens a handful of times at most.

Validity. A slot can be sampled when everything its target needs is written:
with n-step returns the ``n`` rows after it and the observation ``n`` rows on,
unless the episode ended inside that window, in which case the final
observation is already in the side store. Only the newest ``n`` rows can fall
short of that, so the sampler draws uniformly from "every row at least ``n``
old" plus the few newer slots whose episode already ended, with no rejection
loop and no per-sample Python.

Episode ends are one byte per slot (``TRUNCATED`` or ``TERMINATED``; a
termination wins where an env reports both).

Targets. For a slot that starts at ``t`` the window runs until the first episode
end at ``t + m`` (``m < n``) or for ``n`` steps::

    reward   = sum_{k<L} gamma^k r_{t+k}           L = m + 1 or n
    next_obs = final_obs[t + m] or obs[t + n]
    discount = gamma^L * (1 - terminated)

so a target is ``reward + discount * Q(next_obs)``: it stops at a termination
and bootstraps from the true final observation at a truncation.

Frame stacks. With ``frame_stack=k`` (observations ``[k * c, ...]`` holding an env's
last ``k`` frames, oldest first, as Atari's are) a row holds only the newest frame of
each observation: a quarter of the memory for Atari. The frame ring has ``k - 1`` rows
more than the slot ring, so the frames behind the oldest slot are still there. A
stack is rebuilt by gathering the frames of the ``k`` rows up to it in its column,
stopping at the nearest row whose stack does not continue the one before: ``add``
compares each stack with its column's previous one shifted by a frame, and marks one
that differs as a start, either ``_PADDED`` (its newest frame repeated: a reset as
Gymnasium's ``FrameStackObservation`` and EnvPool pad) or ``_KEPT`` whole in a second
side store (anything else). Positions before a start hold the start's own frame or
its kept stack, shifted. So a rebuilt stack is the one the env produced, whatever it
pads with and whichever flags it sets. Final observations stay whole stacks.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch

from corral.storage.frames import FrameStackParts
from corral.storage.numpy_add import NumpyAddParts
from corral.storage.replay_parts import (  # noqa: F401 (re-exported: where callers have always found them)
    _CONTINUES,
    _KEPT,
    _NO_KEY,
    _PADDED,
    _STATE_VERSION,
    TERMINATED,
    TRUNCATED,
    ReplayBatch,
    ReplayCapacityError,
    _action_spec,
    _element_bytes,
    _gib,
    _obs_spec,
    _SideStore,
    _torch_dtype,
    available_memory,
)
from corral.storage.replay_state import ReplayStateParts


def _rows_per_env(capacity: int, num_envs: int, n_step: int, gamma: float) -> int:
    """The ring's rows per env for these settings, or a clear error."""
    if num_envs < 1:
        raise ValueError(f"num_envs must be at least 1, got {num_envs}")
    if n_step < 1:
        raise ValueError(f"n_step must be at least 1, got {n_step}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    rows = capacity // num_envs
    if rows <= n_step:
        raise ValueError(
            f"buffer_size={capacity} gives {rows} rows per env for num_envs={num_envs}; "
            f"n_step={n_step} needs more than {n_step} rows, so use buffer_size >= {(n_step + 1) * num_envs}"
        )
    return rows


class ReplayBuffer(ReplayStateParts, FrameStackParts, NumpyAddParts):
    """Uniform replay over ``num_envs`` parallel envs, with n-step targets.

    Args:
        capacity: transitions kept in total (``capacity // num_envs`` rows per env).
        num_envs: envs that ``add`` receives one transition from per call.
        obs_space, action_space: single-env Gymnasium spaces.
        device: where the storage lives and batches come out.
        seed: seeds the sampling generator (a fresh random seed when None).
        n_step: length of the return window; 1 is the one-step TD target.
        gamma: discount inside the window, and ``gamma^k`` in ``discount``.
        final_obs_capacity: initial entries of the side store of final
            observations (default ``max(2 * num_envs, capacity // 100)``); it
            grows if more episode ends are live at once.
        frame_stack: ``k > 1``: each observation is a stack of the env's last
            ``k`` frames on its first axis (shape ``[k * c, ...]``, as corral's
            Atari envs declare with ``corral.envs.spaces.frame_stack_of``), and
            only the newest frame of each is stored (see "Frame stacks" above).
            The stacks can come from any env: ``add`` checks which ones continue
            the previous one and keeps the others whole.
    """

    def __init__(
        self,
        capacity: int,
        num_envs: int,
        obs_space: gym.Space,
        action_space: gym.Space,
        device: torch.device | str = "cpu",
        seed: int | None = None,
        n_step: int = 1,
        gamma: float = 0.99,
        final_obs_capacity: int | None = None,
        frame_stack: int = 1,
        reward_shape: tuple[int, ...] = (),
    ):
        capacity, num_envs, n_step, k = int(capacity), int(num_envs), int(n_step), int(frame_stack)
        self.reward_shape = tuple(int(d) for d in reward_shape)  # per-slot reward dims (per-agent rewards: (A,))
        rows = _rows_per_env(capacity, num_envs, n_step, gamma)
        self.num_envs = num_envs
        self.capacity_per_env = rows
        self.capacity = rows * num_envs
        self.n_step = n_step
        self.gamma = float(gamma)
        self.device = torch.device(device)
        self.obs_space, self.action_space = obs_space, action_space
        self.obs_shape, self.obs_dtype = _obs_spec(obs_space)
        self.action_shape, self._action_dtype, self._action_out_dtype = _action_spec(action_space)
        if k < 1:
            raise ValueError(f"frame_stack must be at least 1, got {k}")
        if k > 1 and (not isinstance(obs_space, gym.spaces.Box) or len(self.obs_shape) < 2
                      or self.obs_shape[0] % k):
            raise ValueError(
                f"frame_stack={k} needs observations that stack {k} frames on their first axis "
                f"(shape [{k} * channels, ...]), but the observation space is {obs_space}; use frame_stack=1"
            )
        self.frame_stack = k
        # Rows of observations kept: whole ones, one per slot; or the newest frame of each,
        # with k - 1 rows more so the oldest slot's stack is still there.
        self.frame_shape = (self.obs_shape[0] // k, *self.obs_shape[1:]) if k > 1 else self.obs_shape
        self._obs_rows = rows + k - 1

        final_cap = max(2 * num_envs, self.capacity // 100) if final_obs_capacity is None else int(final_obs_capacity)
        final_cap = max(final_cap, num_envs)  # one add can end every env's episode
        self._check_fits(self._bytes_needed(final_cap), what=f"ReplayBuffer(buffer_size={capacity})")
        self._allocate(final_cap)
        self._target_tables()
        self._generator = torch.Generator(device=self.device)
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(int(seed))

    def _allocate(self, final_cap: int) -> None:
        """The ring's tensors (and their flat and numpy views) and the side stores."""
        T, N, R, k = self.capacity_per_env, self.num_envs, self._obs_rows, self.frame_stack
        kw = dict(device=self.device)
        self._obs = torch.zeros((R, N, *self.frame_shape), dtype=self.obs_dtype, **kw)
        self._action = torch.zeros((T, N, *self.action_shape), dtype=self._action_dtype, **kw)
        self._reward = torch.zeros((T, N, *self.reward_shape), dtype=torch.float32, **kw)
        self._flags = torch.zeros((T, N), dtype=torch.uint8, **kw)
        name = f"ReplayBuffer(buffer_size={self.capacity})"
        self._final = _SideStore(final_cap, self.obs_shape, self.obs_dtype, self.device, self._check_fits,
                                 what=f"final-observation store of {name}")
        if k > 1:
            # _starts[r, e]: how that slot's stack begins (_CONTINUES, _PADDED or _KEPT whole
            # in _heads); _last_obs: the stacks of the last add.
            self._starts = torch.zeros((R, N), dtype=torch.uint8, **kw)
            self._starts_flat = self._starts.view(R * N)
            self._heads = _SideStore(self._heads_capacity(final_cap), self.obs_shape, self.obs_dtype, self.device, self._check_fits,
                                     what=f"episode-start store of {name}")
            self._last_obs = torch.zeros((N, *self.obs_shape), dtype=self.obs_dtype, **kw)
            self._stack_lags = torch.arange(k - 1, -1, -1, device=self.device)  # position p holds lag k-1-p
            self._start_lags = torch.arange(k - 1, device=self.device)
        self._steps = 0  # add() calls so far; row of the next add is _steps % T

        # Flat views: slot (t, e) is element t * N + e, so one index gathers a batch.
        self._obs_flat = self._obs.view(R * N, *self.frame_shape)
        self._action_flat = self._action.view(T * N, *self.action_shape)
        self._reward_flat = self._reward.view(T * N, *self.reward_shape)
        self._flags_flat = self._flags.view(T * N)
        self._young_cache: tuple[int, torch.Tensor] | None = None
        # On CPU, ``add`` writes through numpy views of the same memory: a numpy row
        # assignment costs ~1 us against ~5 us for a torch indexing op, and an add is
        # a handful of them. (The final-observation store is rare and stays torch.)
        self._np = self._numpy_views()

    def _target_tables(self) -> None:
        """What n-step targets and ``add``'s checks read: window offsets, powers of gamma, the
        window weights, the shapes an add expects."""
        N, n_step = self.num_envs, self.n_step
        ages = torch.arange(n_step + 1, dtype=torch.float64, device=self.device)
        self._ages = torch.arange(n_step, device=self.device)
        self._window_offsets = self._ages * N  # slots of the same env in the next n rows
        self._gamma_pow = (self.gamma**ages).to(torch.float32)
        # _return_weights[m, k] = gamma^k for k <= m: the window weights when it stops at offset m.
        self._return_weights = torch.tril(self._gamma_pow[:n_step].expand(n_step, n_step))
        self._env_ids = torch.arange(N, device=self.device)
        self._add_shapes = {
            "obs": (N, *self.obs_shape),
            "action": (N, *self.action_shape),
            "reward": (N, *self.reward_shape),
            "terminated": (N,),
            "truncated": (N,),
            "next_obs": (N, *self.obs_shape),
        }

    # -- sizes -----------------------------------------------------------------------------------

    def _bytes_needed(self, final_obs_capacity: int) -> int:
        """Bytes the storage tensors take for this capacity (what the memory check compares)."""
        obs = _element_bytes(self.obs_shape, self.obs_dtype)
        per_slot = _element_bytes(self.action_shape, self._action_dtype) + _element_bytes(self.reward_shape, torch.float32) + 1  # + reward, flags
        needed = self.capacity * per_slot + final_obs_capacity * (obs + 8) + self._extra_bytes()
        per_row = _element_bytes(self.frame_shape, self.obs_dtype)  # a whole observation, or one frame
        if self.frame_stack > 1:
            per_row += 1  # _starts
            needed += self._heads_capacity(final_obs_capacity) * (obs + 8) + self.num_envs * obs  # _heads, _last_obs
        return needed + self._obs_rows * self.num_envs * per_row

    def _extra_bytes(self) -> int:
        return 0

    def _heads_capacity(self, final_obs_capacity: int) -> int:
        # Stacks kept whole are rare (zero padding, fragments of several collectors in one
        # column): start small, the store grows if needed.
        return max(2 * self.num_envs, final_obs_capacity // 8)

    def _check_fits(self, needed: int, what: str) -> None:
        free = available_memory(self.device)
        if free is None or needed <= free:
            return
        per_transition = max(1, needed // self.capacity)
        fits = int(free * 0.8) // per_transition
        raise ReplayCapacityError(
            f"{what} needs {needed} bytes ({_gib(needed)}) for {self.capacity} transitions on {self.device}, "
            f"but only {free} bytes ({_gib(free)}) are free. Pass a smaller buffer_size "
            f"(about {fits} transitions fit at {per_transition} bytes each) or free some memory.",
            capacity=self.capacity,
            bytes_needed=needed,
            bytes_free=free,
        )

    @property
    def nbytes(self) -> int:
        """Bytes held by the storage tensors now."""
        tensors = (self._obs, self._action, self._reward, self._flags)
        total = sum(t.nbytes for t in tensors) + self._final.nbytes + self._extra_bytes()
        if self.frame_stack > 1:
            total += self._starts.nbytes + self._heads.nbytes + self._last_obs.nbytes
        return total

    @property
    def _final_obs(self) -> torch.Tensor:
        return self._final.values

    @property
    def _final_keys(self) -> torch.Tensor:
        return self._final.keys

    @property
    def steps_added(self) -> int:
        """Number of ``add`` calls so far (each adds ``num_envs`` transitions)."""
        return self._steps

    @property
    def _rows_filled(self) -> int:
        return min(self._steps, self.capacity_per_env)

    # -- adding ----------------------------------------------------------------------------------

    def _shaped(self, x, name: str):
        """``x`` (tensor or array) in the shape ``add`` expects for ``name``, or a clear error."""
        want = self._add_shapes[name]
        if x.shape != want:
            if x.shape == (*want, 1):
                return x.reshape(want)  # discrete actions often come as [N, 1]
            raise ValueError(
                f"ReplayBuffer.add: {name} has shape {tuple(x.shape)}, expected {want} "
                f"(num_envs={self.num_envs}, one entry per env)"
            )
        return x

    def _as_input(self, x: Any, name: str) -> torch.Tensor:
        return self._shaped(x if isinstance(x, torch.Tensor) else torch.as_tensor(x), name)

    def add(self, obs, action, reward, terminated, truncated, next_obs) -> None:
        """Add one transition per env.

        ``next_obs`` is the true next observation: for an env whose episode just
        ended it is the final observation (``info["final_obs"]``), not the reset
        one. Only those rows of it are read; elsewhere the next observation is
        the ``obs`` of the next ``add``.
        """
        if self._np is not None:
            self._add_numpy(obs, action, reward, terminated, truncated, next_obs)
            return
        row = self._steps % self.capacity_per_env
        if self.frame_stack > 1:
            self._add_frames(self._as_input(obs, "obs"))
        else:
            self._obs[row] = self._as_input(obs, "obs")
        self._action[row] = self._as_input(action, "action")
        self._reward[row] = self._as_input(reward, "reward")
        terminated = self._as_input(terminated, "terminated")
        if terminated.dtype != torch.bool:
            terminated = terminated != 0
        flags = self._flags[row]
        truncated = self._as_input(truncated, "truncated")
        flags.copy_(truncated if truncated.dtype == torch.bool else truncated != 0)  # TRUNCATED == 1
        flags.masked_fill_(terminated.to(flags.device), TERMINATED)
        global_step = self._steps
        self._steps += 1

        if flags.count_nonzero():  # cheaper than nonzero() in the common case of no episode end
            ended = flags.nonzero().squeeze(1)
            next_obs = self._as_input(next_obs, "next_obs")
            final = next_obs[ended.to(next_obs.device)].to(self.device)
            self._store_final(global_step * self.num_envs + ended, final)

    def _store_final(self, keys: torch.Tensor, final: torch.Tensor) -> None:
        # (after the add has counted itself) entries of overwritten rows are dead: live keys are >= this
        self._final.put(keys, final, max(0, self._steps - self.capacity_per_env) * self.num_envs)

    # -- which slots can be sampled --------------------------------------------------------------

    def _young(self) -> torch.Tensor:
        """Flat indices of the sampleable slots among the newest n rows (cached per add)."""
        if self._young_cache is not None and self._young_cache[0] == self._steps:
            return self._young_cache[1]
        T, N, n = self.capacity_per_env, self.num_envs, self.n_step
        rows_back = min(n, self._rows_filled)
        if rows_back == 0:
            young = torch.empty(0, dtype=torch.long, device=self.device)
        elif n == 1:
            row = (self._steps - 1) % T
            young = self._flags[row].nonzero().squeeze(1) + row * N
        else:
            rows = (self._steps - 1 - self._ages[:rows_back]) % T  # newest first
            # A young slot is complete once its episode ended there or at a newer row.
            complete = ((self._flags[rows] != 0).cumsum(0) > 0).flip(0)  # oldest first
            row, env = complete.nonzero().unbind(1)
            young = rows.flip(0)[row] * N + env
        self._young_cache = (self._steps, young)
        return young

    def _num_old(self) -> int:
        """Slots at least n rows old: always complete."""
        return max(0, self._rows_filled - self.n_step) * self.num_envs

    def _oldest_slot(self) -> int:
        return ((self._steps - self._rows_filled) % self.capacity_per_env) * self.num_envs

    def __len__(self) -> int:
        """Number of transitions that can be sampled now."""
        return self._num_old() + self._young().numel()

    def can_sample(self, batch_size: int) -> bool:
        return len(self) >= batch_size

    @property
    def obs_nbytes(self) -> int:
        """Bytes of one observation as sampled, a whole stack (a sampled row holds two: obs and
        next_obs); storage holds one frame of it per slot when ``frame_stack > 1``."""
        return _element_bytes(self.obs_shape, self.obs_dtype)

    def valid_indices(self) -> torch.Tensor:
        """Flat indices of every sampleable slot, oldest first (for tests and inspection)."""
        old = (self._oldest_slot() + torch.arange(self._num_old(), device=self.device)) % self.capacity
        return torch.cat([old, self._young()])

    def _sample_indices(self, batch_size: int) -> torch.Tensor:
        young = self._young()
        num_old = self._num_old()
        total = num_old + young.numel()
        if total == 0:
            raise ValueError(
                "ReplayBuffer.sample: nothing can be sampled yet "
                f"({self._steps} adds; the newest {self.n_step} step(s) of each env wait for their next "
                "observation). Check can_sample(batch_size) or start learning later (learning_starts)."
            )
        u = torch.randint(total, (batch_size,), generator=self._generator, device=self.device)
        # Old slots are contiguous (mod capacity) from the oldest row; the young ones follow.
        indices = (u + self._oldest_slot()) % self.capacity
        if young.numel():
            indices = torch.where(u >= num_old, young[(u - num_old).clamp_(0, young.numel() - 1)], indices)
        return indices

    def _slot_keys(self, indices: torch.Tensor) -> torch.Tensor:
        """Side-store key ``global_step * N + env`` of flat slot indices."""
        N = self.num_envs
        env = indices % N
        age_times_n = ((self._steps - 1) % self.capacity_per_env * N + env - indices) % self.capacity
        return (self._steps - 1) * N + env - age_times_n

    # -- sampling --------------------------------------------------------------------------------

    def sample(self, batch_size: int) -> ReplayBatch:
        """Sample ``batch_size`` transitions uniformly (with replacement) from the valid slots."""
        indices = self._sample_indices(batch_size)
        return self._gather(indices, torch.ones(batch_size, device=self.device))

    def get(self, indices: torch.Tensor, weights: torch.Tensor | None = None) -> ReplayBatch:
        """The transitions at flat slot ``indices``, with their n-step targets.

        Indices must be valid (see ``valid_indices``); others give meaningless targets.
        """
        indices = torch.as_tensor(indices, dtype=torch.long, device=self.device).reshape(-1)
        if weights is None:
            weights = torch.ones(indices.numel(), device=self.device)
        return self._gather(indices, weights)

    def _gather(self, indices: torch.Tensor, weights: torch.Tensor) -> ReplayBatch:
        TN, N, n = self.capacity, self.num_envs, self.n_step
        if n == 1:
            flags = self._flags_flat[indices]
            reward = self._reward_flat[indices]
            ended = flags != 0
            terminated = flags == TERMINATED
            discount = torch.where(terminated, 0.0, self.gamma)
            stop_slots = indices
        else:
            window = (indices[:, None] + self._window_offsets) % TN  # [B, n]
            flags = self._flags_flat[window]
            ends = flags != 0
            ended = ends.any(1)
            # Offset of the first episode end inside the window, or n - 1 if none.
            stop = torch.where(ended, ends.to(torch.uint8).argmax(1), n - 1)
            w = self._return_weights[stop].view(*stop.shape, n, *([1] * len(self.reward_shape)))
            reward = (self._reward_flat[window] * w).sum(1)
            terminated = flags.gather(1, stop[:, None]).squeeze(1) == TERMINATED
            discount = torch.where(terminated, 0.0, self._gamma_pow[stop + 1])
            stop_slots = (indices + stop * N) % TN

        # Next observation: n rows on, or the stored final observation where the episode ended.
        if self.frame_stack > 1:
            step = self._slot_keys(indices) // N
            env = indices % N
            obs = self._stacks(step, env)
            next_obs = self._stacks(step + n, env)
        else:
            obs = self._obs_flat[indices]
            next_obs = self._obs_flat[(indices + n * N) % TN]
        ended_at = ended.nonzero().squeeze(1)
        if ended_at.numel():
            next_obs[ended_at] = self._final.get(self._slot_keys(stop_slots[ended_at]))

        return ReplayBatch(
            obs=obs,
            action=self._action_flat[indices].to(self._action_out_dtype),
            reward=reward,
            next_obs=next_obs,
            discount=discount,
            weights=weights,
            indices=indices,
            terminated=terminated,
        )
