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

import os
from dataclasses import dataclass, fields
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from corral.rng import set_generator_state
from corral.storage.sumtree import SumTree

# How a slot's episode ended, one byte per slot. Where an env reports both, termination wins.
TRUNCATED = 1
TERMINATED = 2

# How a slot's stack begins (frame stacks): it continues the previous row's, it is its own
# frame repeated (a reset padded as Gymnasium and EnvPool pad), or it is kept whole in _heads.
_CONTINUES, _PADDED, _KEPT = 0, 1, 2

_NO_KEY = torch.iinfo(torch.int64).max  # empty side-store entry; sorts after every real key
# 2: frame stacks (``frame_stack``, ``starts``, ``heads_*``; ``obs`` holds frames then). A
# version 1 state (whole observations) loads into either layout.
_STATE_VERSION = 2


class ReplayCapacityError(MemoryError):
    """The requested replay buffer does not fit in the memory that is free."""

    def __init__(self, message: str, capacity: int, bytes_needed: int, bytes_free: int):
        super().__init__(message)
        self.capacity = capacity
        self.bytes_needed = bytes_needed
        self.bytes_free = bytes_free


@dataclass
class ReplayBatch:
    """A batch of transitions, leading dim ``[B]``; a target is ``reward + discount * Q(next_obs)``."""

    obs: torch.Tensor  # [B, *obs_shape], stored dtype (uint8 images stay uint8)
    action: torch.Tensor  # [B, *act_shape]; float32 for Box, int64 for discrete spaces
    reward: torch.Tensor  # [B] float32 (``[B, *reward_shape]``), n-step discounted sum of rewards
    next_obs: torch.Tensor  # [B, *obs_shape], obs n steps later, or the true final obs of an ended episode
    discount: torch.Tensor  # [B] float32, gamma^k * (1 - terminated); 0 where the window ended in termination
    weights: torch.Tensor  # [B] float32 importance weights (ones for uniform sampling)
    indices: torch.Tensor  # [B] int64 flat slot indices, for update_priorities
    terminated: torch.Tensor  # [B] bool, the window ended in a termination (so discount == 0)

    def split(self, size: int) -> list[ReplayBatch]:
        """Consecutive batches of ``size`` rows (views, no copies)."""
        parts = [getattr(self, f.name).split(size) for f in fields(self)]
        return [ReplayBatch(*p) for p in zip(*parts)]


# ---------------------------------------------------------------------------------------------
# spaces and memory


def _torch_dtype(np_dtype: Any) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype=np_dtype)).dtype


def _obs_spec(space: gym.Space) -> tuple[tuple[int, ...], torch.dtype]:
    """Shape and storage dtype of one observation."""
    if isinstance(space, gym.spaces.Box):
        dtype = np.dtype(space.dtype)
        # Float observations arrive as float32 from corral's envs; images stay uint8.
        return tuple(space.shape), torch.float32 if dtype.kind == "f" else _torch_dtype(dtype)
    if isinstance(space, gym.spaces.Discrete):
        return (), torch.int64
    if isinstance(space, gym.spaces.MultiDiscrete):
        return tuple(space.shape), torch.int64
    if isinstance(space, gym.spaces.MultiBinary):
        return tuple(space.shape), torch.uint8
    raise TypeError(
        f"ReplayBuffer cannot store observations of space {space!r}; "
        "it supports Box, Discrete, MultiDiscrete and MultiBinary (flatten Dict/Tuple spaces first)"
    )


def _action_spec(space: gym.Space) -> tuple[tuple[int, ...], torch.dtype, torch.dtype]:
    """Shape, storage dtype and returned dtype of one action."""
    if isinstance(space, gym.spaces.Box):
        return tuple(space.shape), torch.float32, torch.float32
    # Discrete actions are stored in 4 bytes and widened to int64 for gather().
    if isinstance(space, gym.spaces.Discrete):
        return (), torch.int32, torch.int64
    if isinstance(space, gym.spaces.MultiDiscrete):
        return tuple(space.shape), torch.int32, torch.int64
    if isinstance(space, gym.spaces.MultiBinary):
        return tuple(space.shape), torch.uint8, torch.int64
    raise TypeError(
        f"ReplayBuffer cannot store actions of space {space!r}; "
        "it supports Box, Discrete, MultiDiscrete and MultiBinary"
    )


def _element_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()


def available_memory(device: torch.device | str = "cpu") -> int | None:
    """Bytes that can be allocated on ``device`` now, or None when that cannot be told."""
    device = torch.device(device)
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError):
            return None
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:  # Not Linux, or an old kernel: free pages is a smaller, safe estimate.
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


# ---------------------------------------------------------------------------------------------
# side stores


class _SideStore:
    """A ring of ``(key, value)`` entries for the few slots that need a whole observation
    of their own (the final observation of an ended episode; with frame stacks, the
    stack a slot starts from). Keys are ``global_step * N + env``, handed out in
    increasing order, so the ring is two sorted runs and a look-up is a
    ``searchsorted``. Entries die in the order they were written, so the ring only
    grows when more entries are live than it holds; it then doubles."""

    def __init__(self, capacity: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, check_fits,
                 what: str):
        self.shape, self.dtype, self.device = shape, dtype, device
        self._check_fits, self.what = check_fits, what
        self.keys = torch.full((capacity,), _NO_KEY, dtype=torch.int64, device=device)
        self.values = torch.zeros((capacity, *shape), dtype=dtype, device=device)
        self.cursor = 0

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes

    def put(self, keys: torch.Tensor, values: torch.Tensor, oldest_live: int) -> None:
        """Append entries; ``oldest_live``: keys below it belong to overwritten rows (dead)."""
        m, size, c = keys.numel(), self.keys.numel(), self.cursor
        wrap = c + m > size
        target = torch.arange(0, m, device=self.device) if wrap else torch.arange(c, c + m, device=self.device)
        old = self.keys[target]
        # Entries die oldest first, so if the ones at the target are dead, so is any
        # tail skipped by wrapping (it is older still).
        if bool(((old != _NO_KEY) & (old >= oldest_live)).any()):
            self._grow(m, oldest_live)
            c = self.cursor
        elif wrap:
            self.keys[c:] = _NO_KEY  # keep the ring two sorted runs
            c = 0
        self.keys[c : c + m] = keys.to(self.device)
        self.values[c : c + m] = values.to(self.device, self.dtype)
        self.cursor = c + m

    def _grow(self, incoming: int, oldest_live: int) -> None:
        size = self.keys.numel()
        new_size = max(2 * size, size + incoming)
        self._check_fits(new_size * (_element_bytes(self.shape, self.dtype) + 8),
                         what=f"Growing the {self.what} to {new_size} entries")
        live = (self.keys != _NO_KEY) & (self.keys >= oldest_live)
        keys, order = torch.sort(self.keys[live])
        values = self.values[live][order]
        n = keys.numel()
        self.keys = torch.full((new_size,), _NO_KEY, dtype=torch.int64, device=self.device)
        self.keys[:n] = keys
        self.values = torch.zeros((new_size, *self.shape), dtype=self.dtype, device=self.device)
        self.values[:n] = values
        self.cursor = n

    def positions(self, keys: torch.Tensor) -> torch.Tensor:
        """Position of each key (garbage for keys that are not stored)."""
        fk, c = self.keys, self.cursor
        size = fk.numel()
        # fk[:c] holds the newest keys, fk[c:] older ones then empty entries; both runs are sorted.
        if c == 0 or c == size:
            pos = torch.searchsorted(fk, keys)
        else:
            newer = torch.searchsorted(fk[:c], keys)
            older = c + torch.searchsorted(fk[c:], keys)
            pos = torch.where(keys >= fk[0], newer, older)
        return pos.clamp_(max=size - 1)

    def get(self, keys: torch.Tensor) -> torch.Tensor:
        return self.values[self.positions(keys)]

    def state(self, prefix: str) -> dict[str, Any]:
        return {f"{prefix}_obs": self.values, f"{prefix}_keys": self.keys, f"{prefix}_cursor": self.cursor}

    def load(self, state: dict[str, Any], prefix: str) -> None:
        self.keys = state[f"{prefix}_keys"].to(self.device, torch.int64).clone()
        self.values = state[f"{prefix}_obs"].to(self.device, self.dtype).clone()
        self.cursor = int(state[f"{prefix}_cursor"])


# ---------------------------------------------------------------------------------------------
# uniform replay


class ReplayBuffer:
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

        T, N, R = rows, num_envs, self._obs_rows
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
        self._generator = torch.Generator(device=self.device)
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(int(seed))

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

    def _add_frames(self, obs: torch.Tensor, first: bool = False) -> None:
        """Frame-stack ``add`` of ``obs [N, *obs_shape]``: the newest frame of each stack goes
        in the row. A stack that is not the column's previous one shifted by a frame starts
        a chain: it is its newest frame repeated (a reset, as Gymnasium and EnvPool pad), or
        it is kept whole in ``_heads`` (zero padding, another env's fragment, anything else)."""
        N, k, step = self.num_envs, self.frame_stack, self._steps
        obs = obs.to(self.device, self.obs_dtype)
        stacks = obs.reshape(N, k, -1)
        row = step % self._obs_rows
        self._obs[row] = stacks[:, -1].reshape(N, *self.frame_shape)
        if step == 0 or first:
            starts = torch.ones(N, dtype=torch.bool, device=self.device)
        else:
            starts = (stacks[:, :-1] != self._last_obs.view(N, k, -1)[:, 1:]).reshape(N, -1).any(1)
        self._last_obs.copy_(obs)
        if not starts.any():
            self._starts[row] = _CONTINUES
            return
        kept = starts & (stacks[:, :-1] != stacks[:, -1:]).reshape(N, -1).any(1)
        self._starts[row] = torch.where(kept, _KEPT, starts.to(torch.uint8))  # _PADDED == 1
        if kept.any():
            ids = kept.nonzero().squeeze(1)
            # a start's stack is read while slots up to k - 2 steps later are live; its frames' rows outlast that
            self._heads.put(step * N + ids, obs[ids], max(0, step + 1 - self._obs_rows) * N)

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

    def _stacks(self, step: torch.Tensor, env: torch.Tensor) -> torch.Tensor:
        """The observations (whole stacks) of columns ``env`` at global steps ``step``, both ``[B]``.

        Position ``p`` of a stack holds the frame ``j = k - 1 - p`` steps back. Going back
        stops at the nearest start ``d`` steps back (``d <= k - 2``; a stack ``k - 1`` back
        or more is not needed): positions with ``j <= d`` are frames of this episode, the
        others the start's own stack shifted by ``d``: its frame repeated (``_PADDED``) or
        the stack kept whole in ``_heads`` (``_KEPT``).
        """
        k, N, R = self.frame_stack, self.num_envs, self._obs_rows
        B = step.numel()
        kinds = self._starts_flat[((step[:, None] - self._start_lags) % R) * N + env[:, None]]  # [B, k-1]
        starts = kinds != _CONTINUES
        d = torch.where(starts.any(1), starts.to(torch.uint8).argmax(1), k)  # k: no start within reach
        lags = torch.minimum(self._stack_lags, d[:, None])  # [B, k]: a padded start repeats its own frame
        rows = (step[:, None] - lags) % R
        out = self._obs_flat[rows * N + env[:, None]]  # [B, k, *frame_shape]
        kept = kinds.gather(1, d.clamp(max=k - 2)[:, None]).squeeze(1) == _KEPT
        near = (kept & (d < k - 1)).nonzero().squeeze(1)
        if near.numel():
            dn = d[near]
            head = self._heads.get((step[near] - dn) * N + env[near]).view(-1, k, *self.frame_shape)
            src = (self._stack_lags.flip(0) + dn[:, None]).clamp_(max=k - 1)  # position p -> p + d of the head
            shifted = head[torch.arange(near.numel(), device=self.device)[:, None], src]
            before = (self._stack_lags > dn[:, None]).view(-1, k, *([1] * len(self.frame_shape)))
            out[near] = torch.where(before, shifted, out[near])
        return out.view(B, *self.obs_shape)

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

    # -- checkpointing ---------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# prioritized replay


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay (Schaul et al. 2016) on a ``SumTree``.

    A slot is sampled with probability ``p_i / sum_j p_j`` where
    ``p_i = (|td_i| + eps)^alpha``; slots that are not complete yet hold 0. A slot
    gets the largest priority seen so far when it becomes sampleable. The batch
    is stratified: one draw from each of ``batch_size`` equal slices of the total.
    Importance weights are ``(N * P_i)^-beta / max_j (N * P_j)^-beta``, the max over
    every sampleable slot (it belongs to the smallest priority, kept by the min
    tree), which simplifies to ``(p_min / p_i)^beta``.

    ``add`` does not touch the tree; the next ``sample``, ``update_priorities``,
    ``priorities`` or ``state_dict`` brings it up to date for all adds since,
    in one batched tree update.

    Extra args (the rest as in ``ReplayBuffer``):
        alpha: how much priorities count (0 is uniform).
        beta, beta_final, beta_steps: the importance exponent goes linearly from
            ``beta`` to ``beta_final`` over ``beta_steps`` calls of ``sample``
            (the ``step`` counter, which a caller may also set).
        eps: added to ``|td|`` so no slot's priority is 0.
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
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_final: float = 1.0,
        beta_steps: int = 100_000,
        eps: float = 1e-6,
        final_obs_capacity: int | None = None,
        frame_stack: int = 1,
        reward_shape: tuple[int, ...] = (),
    ):
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        if beta_steps < 0:
            raise ValueError(f"beta_steps must be >= 0, got {beta_steps}")
        if eps <= 0:
            raise ValueError(f"eps must be > 0 so every slot can be sampled, got {eps}")
        self.alpha, self.beta_initial, self.beta_final = float(alpha), float(beta), float(beta_final)
        self.beta_steps, self.eps = int(beta_steps), float(eps)
        self._tree_capacity = (int(capacity) // max(1, int(num_envs))) * int(num_envs)
        super().__init__(
            capacity, num_envs, obs_space, action_space, device=device, seed=seed, n_step=n_step, gamma=gamma,
            final_obs_capacity=final_obs_capacity, frame_stack=frame_stack, reward_shape=reward_shape,
        )
        self._tree = SumTree(self.capacity, device=self.device)
        self._max_priority = torch.ones((), dtype=torch.float64, device=self.device)
        self._tree_steps = 0  # adds the tree has caught up with (see _sync_tree)
        self.step = 0

    def _extra_bytes(self) -> int:
        return SumTree.bytes_needed(self._tree_capacity)

    @property
    def beta(self) -> float:
        if self.beta_steps == 0:
            return self.beta_final
        frac = min(1.0, self.step / self.beta_steps)
        return self.beta_initial + frac * (self.beta_final - self.beta_initial)

    def _sync_tree(self) -> None:
        """Bring the priorities up to date with the adds since the last sync.

        ``add`` leaves the tree alone, so that a run of adds between two samples
        costs one tree update, not one each. Rows written since the last sync
        (age < k) lose the priorities of the data they replaced; slots that became
        complete since then get the max priority: rows that reached age n, and
        young slots whose episode has ended. Older slots keep their priorities.
        """
        k = self._steps - self._tree_steps
        if k == 0:
            return
        T, N, n = self.capacity_per_env, self.num_envs, self.n_step
        rows_back = min(n + k, self._rows_filled)
        ages = torch.arange(rows_back, device=self.device)
        rows = (self._steps - 1 - ages) % T
        slots = (rows[:, None] * N + self._env_ids).reshape(-1)
        complete = (ages >= n)[:, None].expand(rows_back, N).clone()
        young = min(n, rows_back)
        complete[:young] = (self._flags[rows[:young]] != 0).cumsum(0) > 0
        leaves = self._tree.leaves[slots].view(rows_back, N)
        kept = torch.where((ages < k)[:, None], 0.0, leaves)
        fresh = torch.where(complete & (kept == 0), self._max_priority, kept)
        self._tree.update(slots, fresh.reshape(-1), unique=True)
        self._tree_steps = self._steps

    @property
    def priorities(self) -> torch.Tensor:
        """Priority of every slot (0 where it cannot be sampled), indexed by flat slot index."""
        self._sync_tree()
        return self._tree.leaves

    def sample(self, batch_size: int) -> ReplayBatch:
        """Stratified proportional sample, with importance weights at the current ``beta``."""
        self._sync_tree()
        total = self._tree.total
        if not bool(total > 0):
            raise ValueError(
                "PrioritizedReplayBuffer.sample: nothing can be sampled yet "
                f"({self._steps} adds). Check can_sample(batch_size) or start learning later (learning_starts)."
            )
        beta = self.beta
        self.step += 1
        u = torch.rand(batch_size, generator=self._generator, device=self.device, dtype=torch.float64)
        prefix = (torch.arange(batch_size, device=self.device, dtype=torch.float64) + u) * (total / batch_size)
        indices = self._tree.find(prefix)
        priorities = self._tree.get(indices)
        weights = (self._tree.min / priorities) ** beta
        return self._gather(indices, weights.to(torch.float32))

    def update_priorities(self, indices: torch.Tensor, td_errors: torch.Tensor) -> None:
        """Set the priorities of sampled slots from their TD errors: ``(|td| + eps)^alpha``.

        Slots that were overwritten since they were sampled (priority 0 until
        they are complete again) are left alone.
        """
        indices = torch.as_tensor(indices, dtype=torch.long, device=self.device).reshape(-1)
        td = torch.as_tensor(td_errors, device=self.device).detach().reshape(-1).to(torch.float64)
        if td.numel() != indices.numel():
            raise ValueError(
                f"update_priorities got {indices.numel()} indices but {td.numel()} TD errors; "
                "pass one TD error per sampled index"
            )
        finite = torch.isfinite(td)
        if not bool(finite.all()):
            bad = int((~finite).sum())
            first = float(td[~finite][0])
            raise ValueError(
                f"update_priorities got {bad} non-finite TD error(s) out of {td.numel()} (e.g. {first}); "
                "priorities must be finite. The loss has diverged: check the learning rate, reward scale "
                "and target network update."
            )
        priorities = (td.abs() + self.eps) ** self.alpha
        self._sync_tree()
        live = self._tree.get(indices) > 0
        self._tree.update(indices[live], priorities[live])
        if priorities.numel():
            self._max_priority = torch.maximum(self._max_priority, priorities.max())

    def state_dict(self) -> dict[str, Any]:
        self._sync_tree()
        state = super().state_dict()
        state["tree"] = self._tree.state_dict()
        state["max_priority"] = self._max_priority.clone()
        state["step"] = self.step
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._tree.load_state_dict(state["tree"])
        self._tree_steps = self._steps
        self._max_priority = state["max_priority"].to(self.device, torch.float64).clone()
        self.step = int(state["step"])
