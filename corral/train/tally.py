"""Episode ends of a device-resident run, tallied on the device (the Learner's stream reads them
back in one go)."""

from __future__ import annotations

import torch


class EpisodeTally:
    """Episode ends of a device-resident run, kept on the device: each step's flags, returns
    and lengths go into preallocated rows, read back in one go (in the order they ended, as
    the per-step path reports them)."""

    def __init__(self, num_envs: int, device: torch.device, rows: int = 256):
        self.done = torch.zeros(rows, num_envs, dtype=torch.bool, device=device)
        self.ret = torch.zeros(rows, num_envs, device=device)
        self.len = torch.zeros(rows, num_envs, device=device)
        self.rows, self.t = rows, 0

    def add(self, done: torch.Tensor, returns: torch.Tensor, lengths: torch.Tensor) -> bool:
        """Book one step; True when the rows are full (flush now)."""
        self.done[self.t].copy_(done)
        self.ret[self.t].copy_(returns)
        self.len[self.t].copy_(lengths)
        self.t += 1
        return self.t == self.rows

    def flush(self) -> tuple[list[float], list[float]]:
        t, self.t = self.t, 0
        if t == 0:
            return [], []
        done = self.done[:t]
        return self.ret[:t][done].tolist(), self.len[:t][done].tolist()
