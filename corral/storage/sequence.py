"""Sequence replay for recurrent value methods (DRQN, R2D2).

A stored item is a fixed-length sequence of ``S`` consecutive steps of one env column with
the recurrent state that entered its first step. :class:`SequenceWindow` cuts the columns
into sequences as steps arrive: all columns step together, so every ``period`` vector steps
(once ``S`` have been seen) it hands over ``N`` sequences at once, the last ``S - period``
steps of each shared with the next (R2D2: 80-step sequences overlapping by 40).
Sequences run across episode boundaries; ``start`` flags mark where an episode begins (the
core resets there) and ``terminated`` / ``truncated`` where one ends, so targets stop there.

:class:`SequenceReplay` is a ring of such sequences, sampled uniformly or in proportion to
priorities (a :class:`~corral.storage.sumtree.SumTree`), with importance weights
``(p_min / p_i)^beta`` as :class:`~corral.storage.replay.PrioritizedReplayBuffer` gives.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from corral.storage.replay import ReplayCapacityError, _gib, available_memory
from corral.storage.sumtree import SumTree

SEQ_FIELDS = ("obs", "action", "reward", "terminated", "truncated", "start")


@dataclass
class SequenceBatch:
    """``B`` sequences of ``S`` steps: step fields ``[B, S, ...]``, ``state [B, state_dim]``."""

    obs: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    start: torch.Tensor  # the step's observation is the first of an episode (the state resets)
    state: torch.Tensor  # the recurrent state entering step 0 (as collected)
    weights: torch.Tensor  # [B] importance weights (ones when uniform)
    indices: torch.Tensor  # [B] slots, for update_priorities
    aux: torch.Tensor | None = None  # [B, S, aux_dim] per-step floats an algorithm stores (NGU's inputs), or None

    def split(self, size: int) -> list[SequenceBatch]:
        parts = [(None,) * -(-self.state.shape[0] // size) if getattr(self, f.name) is None
                 else getattr(self, f.name).split(size) for f in fields(self)]
        return [SequenceBatch(*p) for p in zip(*parts)]


class SequenceWindow:
    """The last ``S`` steps of each of ``N`` columns; ``add`` returns ``N`` finished sequences
    (a dict of ``[N, S, ...]`` tensors and ``state [N, D]``) every ``period`` steps, else None.
    ``aux_dim > 0``: each step also carries ``aux [N, aux_dim]`` floats (NGU's per-step inputs)."""

    def __init__(self, length: int, period: int, num_envs: int, obs_shape, obs_dtype, action_dtype,
                 state_dim: int, device, aux_dim: int = 0):
        if not 1 <= period <= length:
            raise ValueError(f"sequence period must be in 1..{length} (the sequence length), got {period}")
        S, N = length, num_envs
        self.length, self.period = S, period
        z = lambda *shape, dtype=torch.float32: torch.zeros((S, N, *shape), dtype=dtype, device=device)
        self.rows = {"obs": z(*obs_shape, dtype=obs_dtype), "action": z(dtype=action_dtype), "reward": z(),
                     "terminated": z(dtype=torch.bool), "truncated": z(dtype=torch.bool),
                     "start": z(dtype=torch.bool), "state": z(state_dim)}
        if aux_dim:
            self.rows["aux"] = z(aux_dim)
        self.filled = 0

    def add(self, **step: torch.Tensor) -> dict[str, torch.Tensor] | None:
        for k, buf in self.rows.items():
            buf[self.filled].copy_(step[k])
        self.filled += 1
        if self.filled < self.length:
            return None
        out = {k: v.transpose(0, 1).clone() for k, v in self.rows.items() if k != "state"}
        out["state"] = self.rows["state"][0].clone()
        keep = self.length - self.period
        for buf in self.rows.values():
            buf[:keep] = buf[self.period:].clone()
        self.filled = keep
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"filled": self.filled, **{k: v[: self.filled].clone() for k, v in self.rows.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.filled = int(state["filled"])
        for k, v in self.rows.items():
            v[: self.filled] = state[k].to(v.device)


class SequenceReplay:
    def __init__(self, capacity: int, length: int, obs_shape, obs_dtype, action_dtype, state_dim: int,
                 device, seed: int, prioritized: bool = False, alpha: float = 0.9, beta: float = 0.6,
                 beta_final: float = 0.6, eps: float = 1e-6, aux_dim: int = 0):
        self.capacity, self.length = int(capacity), int(length)
        self.device = torch.device(device)
        C, S = self.capacity, self.length
        specs = {"obs": ((*obs_shape,), obs_dtype), "action": ((), action_dtype), "reward": ((), torch.float32),
                 "terminated": ((), torch.bool), "truncated": ((), torch.bool), "start": ((), torch.bool)}
        if aux_dim:
            specs["aux"] = ((int(aux_dim),), torch.float32)
        per_seq = sum(S * int(torch.tensor([], dtype=dt).element_size()) * int(torch.Size(sh).numel())
                      for sh, dt in specs.values()) + 4 * state_dim
        needed = C * per_seq + (SumTree.bytes_needed(C) if prioritized else 0)
        free = available_memory(self.device)
        if free is not None and needed > 0.9 * free:
            raise ReplayCapacityError(
                f"sequence replay of {C:,} sequences x {S} steps needs {_gib(needed)} but {_gib(free)} is free; "
                f"lower buffer_size (it holds buffer_size / seq_period sequences)", C, needed, free)
        self.data = {k: torch.zeros((C, S, *sh), dtype=dt, device=self.device) for k, (sh, dt) in specs.items()}
        self.data["state"] = torch.zeros((C, state_dim), device=self.device)
        self.size = self.ptr = 0
        self.added = 0
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(seed))
        self.prioritized = prioritized
        self.alpha, self.beta_initial, self.beta_final, self.eps = float(alpha), float(beta), float(beta_final), eps
        self.step, self.beta_steps = 0, 1  # samples drawn; the samples over which beta anneals (set by the algorithm)
        self.tree = SumTree(C, device=self.device) if prioritized else None
        self.max_priority = 1.0

    def __len__(self) -> int:
        return self.size

    def can_sample(self, batch_size: int) -> bool:
        return self.size >= batch_size

    @property
    def beta(self) -> float:
        frac = min(1.0, self.step / max(1, self.beta_steps))
        return self.beta_initial + frac * (self.beta_final - self.beta_initial)

    def add(self, seqs: dict[str, torch.Tensor], priorities: torch.Tensor | None = None) -> torch.Tensor:
        """Store ``n`` sequences (``[n, S, ...]`` fields and ``state [n, D]``); new ones get the
        largest priority seen (or ``priorities``, e.g. a collector's). Returns their slots."""
        n = int(seqs["state"].shape[0])
        slots = (self.ptr + torch.arange(n, device=self.device)) % self.capacity
        for k, buf in self.data.items():
            buf[slots] = seqs[k].to(self.device, buf.dtype)
        self.ptr = (self.ptr + n) % self.capacity
        self.size = min(self.capacity, self.size + n)
        self.added += n
        if self.tree is not None:
            if priorities is None:
                values = torch.full((n,), self.max_priority, dtype=torch.float64, device=self.device)
            else:
                values = (priorities.to(self.device, torch.float64).abs() + self.eps) ** self.alpha
                self.max_priority = max(self.max_priority, float(values.max()))
            self.tree.update(slots, values)
        return slots

    def sample(self, batch_size: int) -> SequenceBatch:
        self.step += 1
        if self.tree is None:
            idx = torch.randint(self.size, (batch_size,), generator=self.generator, device=self.device)
            weights = torch.ones(batch_size, device=self.device)
        else:
            total = self.tree.total
            u = torch.rand(batch_size, generator=self.generator, device=self.device, dtype=torch.float64)
            idx = self.tree.find((torch.arange(batch_size, device=self.device, dtype=torch.float64) + u)
                                 * (total / batch_size))
            weights = ((self.tree.min / self.tree.get(idx)) ** self.beta).float()
        d = self.data
        return SequenceBatch(*(d[k][idx] for k in SEQ_FIELDS), d["state"][idx], weights, idx,
                             d["aux"][idx] if "aux" in d else None)

    def update_priorities(self, indices: torch.Tensor, priorities: torch.Tensor) -> None:
        """Sequence priorities (R2D2: ``eta max_t |td| + (1 - eta) mean_t |td|``) -> ``(p + eps)^alpha``."""
        p = priorities.detach().to(self.device, torch.float64).reshape(-1)
        if not bool(torch.isfinite(p).all()):
            raise ValueError("update_priorities got non-finite priorities: the loss has diverged (lower the "
                             "learning rate, check the rewards and the target network update)")
        values = (p.abs() + self.eps) ** self.alpha
        self.tree.update(indices.to(self.device), values)
        self.max_priority = max(self.max_priority, float(values.max()))

    def state_dict(self) -> dict[str, Any]:
        n = self.size
        state = {"size": n, "ptr": self.ptr, "added": self.added, "step": self.step,
                 "max_priority": self.max_priority, "generator": self.generator.get_state(),
                 **{k: v[:n].clone() for k, v in self.data.items()}}
        if self.tree is not None:
            state["tree"] = self.tree.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        n = int(state["size"])
        if n > self.capacity:
            raise ValueError(f"the checkpoint's sequence replay holds {n} sequences; this one has room for "
                             f"{self.capacity}: resume with the same buffer_size")
        self.size, self.ptr, self.added, self.step = n, int(state["ptr"]), int(state["added"]), int(state["step"])
        self.max_priority = float(state["max_priority"])
        self.generator.set_state(state["generator"])
        for k, v in self.data.items():
            v[:n] = state[k].to(self.device)
        if self.tree is not None:
            self.tree.load_state_dict(state["tree"])
