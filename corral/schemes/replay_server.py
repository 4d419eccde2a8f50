"""A replay buffer as a service (Ape-X): collectors' fragments go in with the priorities
the collectors computed, the learner samples batches and sends back new priorities.

``ReplayServer`` is a plain object; the Ray scheme runs it in an actor, ``LocalReplay``
calls it in-process. The buffer is the same ``PrioritizedReplayBuffer`` an in-process
run uses, with the same layout (one column per env of a collector), so its
``state_dict`` goes into checkpoints unchanged and a run resumes in either mode.
"""

from __future__ import annotations

import dataclasses

import torch

from corral.schemes.collector import FragmentData
from corral.storage.replay import PrioritizedReplayBuffer, ReplayBatch, ReplayBuffer


def batch_to(batch: ReplayBatch, device) -> ReplayBatch:
    return ReplayBatch(**{f.name: getattr(batch, f.name).to(device, non_blocking=True)
                          for f in dataclasses.fields(batch)})


class ReplayServer:
    def __init__(self, algo_cfg, num_envs: int, obs_space, act_space, seed: int):
        torch.set_num_threads(1)
        c = algo_cfg
        kw = dict(device="cpu", seed=seed, n_step=c.n_step, gamma=c.gamma)
        if c.prioritized:
            self.buffer = PrioritizedReplayBuffer(c.buffer_size, num_envs, obs_space, act_space, alpha=c.per_alpha,
                                                  beta=c.per_beta, eps=c.per_eps, **kw)
        else:
            self.buffer = ReplayBuffer(c.buffer_size, num_envs, obs_space, act_space, **kw)
        self.num_envs = num_envs

    def add(self, data: FragmentData, rows: int | None = None) -> int:
        """Append a fragment (or its first ``rows`` steps; the last one is a boundary) and
        set its initial priorities."""
        if rows is not None:
            data = data.head(rows)
        buf = self.buffer
        start = buf.steps_added
        final = data.true_next_obs()
        trunc = data.boundary_truncated()
        action = data.extras["action"]
        T = data.length
        for t in range(T):
            buf.add(data.obs[t], action[t], data.reward[t], data.terminated[t], trunc[t], final[t])
        if data.priorities is not None and isinstance(buf, PrioritizedReplayBuffer) and T <= buf.capacity_per_env:
            rows = (start + torch.arange(T)) % buf.capacity_per_env
            idx = (rows[:, None] * self.num_envs + torch.arange(self.num_envs)).reshape(-1)
            buf.update_priorities(idx, data.priorities.reshape(-1))
        return len(buf)

    def sample(self, batch_size: int, step: int, beta_steps: int) -> ReplayBatch:
        if isinstance(self.buffer, PrioritizedReplayBuffer):
            self.buffer.step, self.buffer.beta_steps = step, beta_steps
        return self.buffer.sample(batch_size)

    def sample_many(self, batch_size: int, count: int, step: int, beta_steps: int) -> list[ReplayBatch]:
        return [self.sample(batch_size, step + i, beta_steps) for i in range(count)]

    def update_priorities(self, indices, td_errors) -> None:
        if isinstance(self.buffer, PrioritizedReplayBuffer):
            self.buffer.update_priorities(indices, td_errors)

    def size(self) -> int:
        return len(self.buffer)

    def state_dict(self) -> dict:
        return self.buffer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.buffer.load_state_dict(state)

    @staticmethod
    def check_td(td: torch.Tensor) -> None:
        """The learner checks what it sends (a remote failure would surface late)."""
        if not bool(torch.isfinite(td).all()):
            raise ValueError("update_priorities got non-finite TD errors; the loss has diverged: check the "
                             "learning rate, reward scale and target network update.")


class LocalReplay:
    """A ``ReplayServer`` in this process, behind the interface the learner uses."""

    def __init__(self, server: ReplayServer, device, capacity: int):
        self.server, self.device, self.capacity = server, device, capacity
        self.step = 0
        self.beta_steps = 1
        self.size = 0

    def add(self, data: FragmentData, rows: int, num_envs: int) -> None:
        self.size = self.server.add(data, rows)

    def can_sample(self, batch_size: int) -> bool:
        return self.size >= batch_size

    def __len__(self) -> int:
        return self.size

    def sample(self, batch_size: int) -> ReplayBatch:
        return batch_to(self.server.sample(batch_size, self.step, self.beta_steps), self.device)

    def update_priorities(self, indices, td_errors) -> None:
        ReplayServer.check_td(td_errors)
        self.server.update_priorities(indices.cpu(), td_errors.detach().cpu())

    def state_dict(self) -> dict:
        return self.server.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.server.load_state_dict(state)
