"""Hindsight Experience Replay (Andrychowicz et al. 2017) on corral's replay: goal relabelling
at sampling time, selected with ``replay=her`` by every replay algorithm (SAC, TD3, DDPG, DQN
and their variants), none of which changes.

:class:`HerReplayBuffer` is :class:`~corral.storage.replay.ReplayBuffer` (the same ring, the
same side store of final observations, the same checkpoint) plus two numbers per slot: the
global step where its episode began and the one where it ended. The env must be a goal env
(``GoalEnv``: ``observation`` / ``achieved_goal`` / ``desired_goal`` and a vectorised
``compute_reward``); its flattened observation space carries the goal columns and the reward
function (``corral/envs/goal.py``).

Which slots are sampled. As in SB3's ``HerReplayBuffer``, only transitions of episodes that
have ended and are still whole in the ring: an episode that is still running has no final goal
and only part of its future, and one whose first rows were overwritten (the ring wrapped into
it) has lost part of its episode. In each env column these slots are one run of global steps,
from the start of the oldest whole episode to the newest episode end, so a uniform draw over
them is one ``searchsorted`` over the columns' run lengths, with no rejection loop.

Relabelling. Each sampled transition is relabelled with probability ``k / (k + 1)``
(``k = n_sampled_goal``; SB3's ``her_ratio``), with a goal achieved in its own episode, in
its own env column: the achieved goal of the observation *after* step ``j``, where ``j`` is

* ``future``: uniform over ``t .. end`` (``t`` the transition's step, so the goal can be the
  very next achieved goal),
* ``final``: ``end`` (the episode's last achieved goal, the final observation's),
* ``episode``: uniform over ``start .. end``.

The new goal replaces ``desired_goal`` in both ``obs`` and ``next_obs`` and the reward is the
env's ``compute_reward(next achieved_goal, new goal, info)``, one call for the batch (``info``:
an empty dict per row; corral keeps no infos). The stored end flags stay as they are, as in
SB3: a truncation bootstraps from the true final observation (relabelled too) and a
termination does not. n-step returns, frame stacks and prioritized replay are refused.
"""

from __future__ import annotations

from typing import Any

import torch

from corral.storage.replay import ReplayBatch, ReplayBuffer

STRATEGIES = ("future", "final", "episode")


class HerReplayBuffer(ReplayBuffer):
    """Uniform replay over finished episodes with hindsight goal relabelling.

    Extra args (the rest as in ``ReplayBuffer``):
        strategy: ``future``, ``final`` or ``episode`` (see the module docstring).
        n_sampled_goal: ``k``, relabelled goals per real transition; a sample is relabelled
            with probability ``k / (k + 1)`` (0: never, plain replay of finished episodes).
        goal: the goal spec (default: ``obs_space.corral_goal``, set where corral flattens a
            goal env's ``Dict``): ``achieved`` / ``desired`` column slices and ``reward(ag, dg)``.
    """

    def __init__(self, capacity: int, num_envs: int, obs_space, action_space, device="cpu", seed=None,
                 strategy: str = "future", n_sampled_goal: int = 4, goal: Any = None, **kw):
        goal = goal if goal is not None else getattr(obs_space, "corral_goal", None)
        if goal is None:
            raise ValueError(
                f"HER needs a goal env: a Dict observation with 'achieved_goal' and 'desired_goal' and a "
                f"compute_reward(achieved_goal, desired_goal, info) method (Gymnasium-Robotics' GoalEnv); the "
                f"observation space {obs_space} has none. Try BitFlipping-v0 or PointReach-v0, or drop replay=her")
        if strategy not in STRATEGIES:
            raise ValueError(f"her_strategy={strategy!r}: choose one of {', '.join(STRATEGIES)}")
        if int(n_sampled_goal) < 0:
            raise ValueError(f"her_n_sampled_goal={n_sampled_goal} must be >= 0")
        if int(kw.get("n_step", 1)) != 1:
            raise ValueError(f"HER relabels one-step transitions; n_step={kw['n_step']} is not supported with "
                             "replay=her (set n_step=1)")
        if int(kw.get("frame_stack", 1)) != 1:
            raise ValueError("HER does not take frame-stacked observations (frame_stack > 1)")
        self.goal, self.strategy, self.n_sampled_goal = goal, strategy, int(n_sampled_goal)
        self.her_ratio = 1.0 - 1.0 / (self.n_sampled_goal + 1)
        super().__init__(capacity, num_envs, obs_space, action_space, device=device, seed=seed, **kw)
        T, N = self.capacity_per_env, self.num_envs
        # per slot: the global step its episode began at, and the one it ended at (-1: running)
        self._ep_start = torch.zeros((T, N), dtype=torch.int64, device=self.device)
        self._ep_end = torch.full((T, N), -1, dtype=torch.int64, device=self.device)
        self._cur_start = torch.zeros(N, dtype=torch.int64, device=self.device)  # each column's running episode
        self._last_end = torch.full((N,), -1, dtype=torch.int64, device=self.device)  # each column's newest end

    def _extra_bytes(self) -> int:
        return 16 * self.capacity  # _ep_start, _ep_end

    @property
    def nbytes(self) -> int:
        return super().nbytes + self._ep_start.nbytes + self._ep_end.nbytes

    # -- episodes --------------------------------------------------------------------------------

    def add(self, obs, action, reward, terminated, truncated, next_obs) -> None:
        super().add(obs, action, reward, terminated, truncated, next_obs)
        step, T = self._steps - 1, self.capacity_per_env
        row = step % T
        self._ep_start[row] = self._cur_start
        self._ep_end[row] = -1
        flags = self._flags[row]
        if not flags.count_nonzero():
            return
        envs = flags.nonzero().squeeze(1)
        # every live row of each ended episode learns where it ended (rows before the ring's
        # oldest are gone; the episode is no longer whole, and never sampled)
        first = self._cur_start[envs].clamp(min=step - T + 1)
        lengths = step - first + 1
        total = int(lengths.sum())
        offsets = torch.arange(total, device=self.device) - (lengths.cumsum(0) - lengths).repeat_interleave(lengths)
        steps = first.repeat_interleave(lengths) + offsets
        self._ep_end[steps % T, envs.repeat_interleave(lengths)] = step
        self._last_end[envs] = step
        self._cur_start[envs] = step + 1

    def _runs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per env column, ``(first, count)``: the sampleable slots are the global steps
        ``first .. first + count - 1`` of that column (whole, finished episodes)."""
        T = self.capacity_per_env
        filled = self._rows_filled
        if filled == 0:
            zeros = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
            return zeros, zeros
        oldest = self._steps - filled
        start, end = self._ep_start[oldest % T], self._ep_end[oldest % T]
        # the oldest row's episode is whole if it began there; otherwise the next one is the first whole one
        first = torch.where(start == oldest, torch.full_like(start, oldest),
                            torch.where(end >= 0, end + 1, torch.full_like(end, self._steps)))
        count = (self._last_end - first + 1).clamp(min=0)
        return first, count

    def __len__(self) -> int:
        """Transitions that can be sampled now: those of finished episodes still whole in the ring."""
        return int(self._runs()[1].sum())

    def valid_indices(self) -> torch.Tensor:
        """Flat indices of every sampleable slot, column by column (for tests and inspection)."""
        first, count = self._runs()
        env = torch.arange(self.num_envs, device=self.device).repeat_interleave(count)
        offsets = torch.arange(int(count.sum()), device=self.device) - (count.cumsum(0) - count).repeat_interleave(count)
        return ((first.repeat_interleave(count) + offsets) % self.capacity_per_env) * self.num_envs + env

    def _sample_indices(self, batch_size: int) -> torch.Tensor:
        first, count = self._runs()
        cum = count.cumsum(0)
        total = int(cum[-1])
        if total == 0:
            raise ValueError(
                f"HerReplayBuffer.sample: no episode has ended yet ({self._steps} adds); HER samples only finished "
                "episodes. Check can_sample(batch_size) or start learning later (learning_starts).")
        u = torch.randint(total, (batch_size,), generator=self._generator, device=self.device)
        env = torch.searchsorted(cum, u, right=True)
        step = first[env] + u - (cum[env] - count[env])
        return (step % self.capacity_per_env) * self.num_envs + env

    # -- relabelling -----------------------------------------------------------------------------

    def goal_steps(self, indices: torch.Tensor) -> torch.Tensor:
        """For sampleable slots ``indices``, the global step ``j`` whose next achieved goal is the
        new goal, by the strategy (draws from the replay stream unless ``final``)."""
        N = self.num_envs
        step = self._slot_keys(indices) // N
        end = self._ep_end.view(-1)[indices]
        if self.strategy == "final":
            return end
        low = step if self.strategy == "future" else self._ep_start.view(-1)[indices]
        u = torch.rand(indices.numel(), generator=self._generator, device=self.device, dtype=torch.float64)
        return torch.minimum(low + (u * (end - low + 1).double()).long(), end)

    def achieved_after(self, steps: torch.Tensor, env: torch.Tensor) -> torch.Tensor:
        """The achieved goal of the observation after global step ``steps`` in column ``env``: the
        next row's, or the stored final observation's where the episode ended at that step."""
        T, N = self.capacity_per_env, self.num_envs
        ended = self._ep_end.view(-1)[(steps % T) * N + env] == steps
        nxt = self._obs_flat[((steps + 1) % T) * N + env]
        at = ended.nonzero().squeeze(1)
        if at.numel():
            nxt[at] = self._final.get(steps[at] * N + env[at])
        return nxt[:, self.goal.achieved]

    def relabel(self, batch: ReplayBatch, rows: torch.Tensor) -> None:
        """Give ``batch``'s ``rows`` (in place) a goal by the strategy and the env's reward for it."""
        indices = batch.indices[rows]
        goal = self.achieved_after(self.goal_steps(indices), indices % self.num_envs)
        batch.obs[rows, self.goal.desired] = goal
        batch.next_obs[rows, self.goal.desired] = goal
        try:
            reward = self.goal.reward(batch.next_obs[rows, self.goal.achieved], goal)
        except Exception as e:  # the env's own code (or its output's shape): say where it failed
            if isinstance(e, ValueError) and str(e).startswith(self.goal.env):
                raise
            raise ValueError(f"HER: {self.goal.env}'s compute_reward raised {type(e).__name__}: {e}") from e
        batch.reward[rows] = reward.to(batch.reward.dtype)

    def sample(self, batch_size: int) -> ReplayBatch:
        """``batch_size`` transitions of finished episodes, uniformly; each relabelled with
        probability ``k / (k + 1)``."""
        indices = self._sample_indices(batch_size)
        batch = self._gather(indices, torch.ones(batch_size, device=self.device))
        if self.n_sampled_goal:
            her = torch.rand(batch_size, generator=self._generator, device=self.device) < self.her_ratio
            rows = her.nonzero().squeeze(1)
            if rows.numel():
                self.relabel(batch, rows)
        return batch

    # -- checkpointing ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        filled = self._rows_filled
        state.update({"her_strategy": self.strategy, "her_n_sampled_goal": self.n_sampled_goal,
                      "ep_start": self._ep_start[:filled], "ep_end": self._ep_end[:filled],
                      "cur_start": self._cur_start, "last_end": self._last_end})
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        filled = self._rows_filled
        self._ep_start[:filled].copy_(state["ep_start"])
        self._ep_end[:filled].copy_(state["ep_end"])
        self._cur_start.copy_(state["cur_start"])
        self._last_end.copy_(state["last_end"])


def replay_options(cls: type, cfg: Any) -> dict[str, Any]:
    """Constructor arguments a named replay class takes from an off-policy config beyond
    ``ReplayBuffer``'s: HER's options for ``HerReplayBuffer`` and its subclasses."""
    if not issubclass(cls, HerReplayBuffer):
        return {}
    if cfg.prioritized:
        raise ValueError("replay=her samples finished episodes uniformly; prioritized=true cannot be combined "
                         "with it (set prioritized=false)")
    return {"strategy": cfg.her_strategy, "n_sampled_goal": cfg.her_n_sampled_goal}
