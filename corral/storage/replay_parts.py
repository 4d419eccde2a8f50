"""The pieces of the replay buffer (``corral.storage.replay``) that are not the ring itself: the
batch it returns, the memory probe and its error, the observation and action layouts of a
space, and the side store of whole observations (final observations; with frame stacks, the
stacks kept whole)."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

import gymnasium as gym
import numpy as np
import torch

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
                    return min(int(line.split()[1]) * 1024, _address_space_left())
    except (OSError, ValueError, IndexError):
        pass
    try:  # Not Linux, or an old kernel: free pages is a smaller, safe estimate.
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _address_space_left() -> int:
    """What an address-space limit (``ulimit -v``, RLIMIT_AS) leaves this process, else no bound:
    under one, an allocation past it fails however much memory the machine has free."""
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit == resource.RLIM_INFINITY:
            return 2**62
        with open("/proc/self/status") as f:
            used = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        return max(0, limit - used)
    except (ImportError, OSError, ValueError, StopIteration):
        return 2**62


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
