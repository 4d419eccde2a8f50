"""MaxCut as a batched RL environment (the RLSolver / S2V-DQN / ECO-DQN "flip" formulation).

Each of N envs holds a +-1 assignment of the same graph. An action names one node and
flips it; the reward is the change of the cut value. All envs step as tensors on one
device, and the best cut ever seen by any env (value and assignment) is kept on the
device throughout, without host syncs.

Notation: spins ``s_i = +-1``; the cut is ``sum_{(i,j)} w_ij (1 - s_i s_j) / 2``; the
local field ``h_i = sum_j w_ij s_j``. Flipping node i changes the cut by
``gain_i = s_i h_i`` and every neighbour's field by ``-2 w_ij s_i``, so a step costs
O(N * max_degree) for the state and O(N * n) for the observation.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from corral.envs.base import EnvError
from corral.problems.graphs import Graph

FEATURES = ("gain", "recently_flipped", "below_episode_best", "degree")
"""Per-node observation channels (``obs[:, f, i]``), each scaled to order one:
gain of flipping the node / mean weighted degree; a flip trace (1 at a flip, decaying by
``exp(-1 / age_scale)`` per step); how far the env's cut is below its episode's best
(the same for every node); the node's weighted degree / the mean."""


def spins(assignment: torch.Tensor) -> torch.Tensor:
    """+-1 float spins from a 0/1, bool or +-1 assignment (positive -> +1, else -1)."""
    return torch.where(assignment > 0, 1.0, -1.0)


def cut_value(graph: Graph, assignment: torch.Tensor) -> torch.Tensor:
    """Cut value of assignments ``[..., n]`` (0/1, bool or +-1), float64 ``[...]``."""
    s = spins(assignment.to(graph.device))
    differs = s[..., graph.u] != s[..., graph.v]
    return (differs.to(torch.float64) * graph.w.to(torch.float64)).sum(-1)


def brute_force_maxcut(graph: Graph, chunk: int = 1 << 16) -> tuple[float, torch.Tensor]:
    """Exact MaxCut by enumeration (node n-1 fixed to side 0): ``(value, 0/1 assignment)``.
    For tests; n <= 24."""
    n = graph.n
    if n > 24:
        raise ValueError(f"brute force over 2^{n - 1} cuts is too many; use n <= 24")
    if n == 1:
        return 0.0, torch.zeros(1, dtype=torch.int8)
    bits = torch.arange(n - 1)
    best, best_x = -math.inf, None
    total = 1 << (n - 1)
    for start in range(0, total, chunk):
        codes = torch.arange(start, min(total, start + chunk))
        x = torch.zeros(codes.numel(), n, dtype=torch.int8)
        x[:, : n - 1] = ((codes.unsqueeze(1) >> bits) & 1).to(torch.int8)
        vals = cut_value(graph.to("cpu"), x)
        i = int(vals.argmax())
        if float(vals[i]) > best:
            best, best_x = float(vals[i]), x[i].clone()
    return best, best_x


class MaxCutEnv:
    """N copies of one MaxCut instance under the VecEnv contract (``corral.envs.base``).

    * obs: float32 ``[N, len(FEATURES), n]``, feature-major: each channel (see ``FEATURES``) is
      one contiguous row, cheap to write and read as the right operand of a matrix product.
    * action: int ``[N]``, the node to flip. reward: float32 ``[N]``, the change of the cut
      (``reward="delta"``), or the rise of the episode's best cut above its previous best
      (``reward="best"``, ECO-DQN's reward: it sums to the episode's best minus its start).
    * Never terminates; every env truncates after ``episode_length`` steps and restarts in
      the same step (``info["final_obs"]`` holds the last observation). All envs step in
      lockstep, so the episode clock is a host-side counter and ends cost no device sync.
    * Restarts draw a uniform random assignment, or, after :meth:`start_from`, the given
      assignment with each node flipped with probability ``flip_prob``.
    * ``best_cut`` (float64 scalar tensor) and ``best_assignment`` (float32 +-1 ``[n]``)
      hold the best cut any env has been in since construction, ``env_best_cut`` /
      ``env_best_assignment`` (``[N]``, ``[N, n]``) each env's own; ``info["cut"]`` the cuts now.
    """

    copyable = True
    device_resident = True  # steps with no host read: the Learner keeps it that way

    def __init__(self, graph: Graph, num_envs: int, episode_length: int | None = None,
                 device: str | torch.device = "cpu", seed: int | None = None, reward: str = "delta",
                 age_scale: float | None = None):
        if reward not in ("delta", "best"):
            raise ValueError(f"reward must be 'delta' or 'best', got {reward!r}")
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.device = torch.device(device)
        self.graph = g = graph.to(self.device)
        n, N = g.n, int(num_envs)
        self.n, self.num_envs = n, N
        self.env_id = f"maxcut:{g.name}"
        self.reward_kind = reward
        self.max_episode_steps = int(episode_length or n)
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (len(FEATURES), n), np.float32)
        self.single_action_space = gym.spaces.Discrete(n)
        nbr, nbw = g.neighbor_table()
        # Padding entries point at the node itself with weight 0: a flip adds 0 to its own gain.
        self.nbr = torch.where(nbr == n, torch.arange(n + 1, device=self.device).unsqueeze(1), nbr)[:n]
        self.nbw = nbw[:n]
        wdeg = g.weighted_degree()
        self.scale = max(float(wdeg.mean()), 1e-6)
        self._degree_feature = (wdeg / self.scale).expand(N, n)
        self.age_scale = float(age_scale or max(4.0, n / 20))
        self._decay = math.exp(-1.0 / self.age_scale)
        self._offsets = torch.arange(N, device=self.device) * n  # flat index of (env, node 0)
        f32, f64 = dict(dtype=torch.float32, device=self.device), dict(dtype=torch.float64, device=self.device)
        self.s = torch.ones(N, n, **f32)
        self.gain = torch.zeros(N, n, **f32)  # cut change if the node flipped: s_i * h_i
        self.cut = torch.zeros(N, **f64)
        self.episode_best = torch.zeros(N, **f64)
        self.recent = torch.zeros(N, n, **f32)
        self._ep_ret = torch.zeros(N, **f64)
        self.elapsed = 0
        self.best_cut = torch.tensor(-math.inf, **f64)
        self.best_assignment = torch.ones(n, **f32)
        self.env_best_cut = torch.full((N,), -math.inf, **f64)  # each env's own best since construction
        self.env_best_assignment = torch.ones(N, n, **f32)
        self._start: torch.Tensor | None = None
        self._flip_prob: torch.Tensor | float = 0.0
        self._gen = torch.Generator(device=self.device)
        if seed is None:
            self._gen.seed()
        self.reset(seed)

    # ------------------------------------------------------------------ state
    def start_from(self, assignment: torch.Tensor | None, flip_prob: float | torch.Tensor = 0.0) -> None:
        """Future restarts begin at ``assignment`` (``[n]`` for all envs, or ``[N, n]``) with each
        node flipped with ``flip_prob`` (a float, or ``[N]`` per env); ``None``: uniform random
        assignments again."""
        if assignment is None:
            self._start = None
        else:
            a = spins(assignment.to(self.device)).expand(self.num_envs, self.n)
            if self._start is None:
                self._start = a.clone()
            else:  # in place: the solver calls this every few steps
                self._start.copy_(a)
        p = torch.as_tensor(flip_prob, dtype=torch.float32, device=self.device)
        self._flip_prob = p.reshape(-1, 1) if p.dim() else p

    @property
    def starts_random(self) -> bool:
        """True while restarts draw uniform random assignments (no :meth:`start_from` point)."""
        return self._start is None

    def _draw(self) -> torch.Tensor:
        shape = (self.num_envs, self.n)
        if self._start is None:
            return torch.rand(shape, generator=self._gen, device=self.device).lt_(0.5).float().mul_(2).sub_(1)
        flips = torch.rand(shape, generator=self._gen, device=self.device) < self._flip_prob
        return torch.where(flips, -self._start, self._start)

    def set_assignment(self, s: torch.Tensor) -> None:
        """Put every env in the given assignments (``[N, n]`` or ``[n]``, any of 0/1, +-1)."""
        self.s.copy_(spins(s.to(self.device)).expand(self.num_envs, self.n))
        self._recompute()
        self.episode_best.copy_(self.cut)
        self._track_best()

    def _recompute(self) -> None:
        """Gains and cuts from the spins (exact; also clears any float drift)."""
        h = (self.s[:, self.nbr] * self.nbw).sum(-1)  # local fields sum_j w_ij s_j
        torch.mul(self.s, h, out=self.gain)
        # sum_i s_i h_i counts every edge twice: cut = (W - sum_e w_e s_u s_v) / 2
        total_w = float(self.graph.w.double().sum())
        self.cut.copy_((total_w - self.gain.double().sum(1) / 2) / 2)

    def _track_best(self) -> None:
        improved = self.cut > self.env_best_cut
        torch.maximum(self.env_best_cut, self.cut, out=self.env_best_cut)
        self.env_best_assignment.copy_(torch.where(improved.unsqueeze(1), self.s, self.env_best_assignment))
        cmax, arg = self.cut.max(0)
        better = cmax > self.best_cut
        self.best_cut.copy_(torch.where(better, cmax, self.best_cut))
        self.best_assignment.copy_(torch.where(better, self.s.index_select(0, arg.view(1))[0], self.best_assignment))

    def _observe(self) -> torch.Tensor:
        obs = torch.empty(self.num_envs, len(FEATURES), self.n, dtype=torch.float32, device=self.device)
        torch.mul(self.gain, 1.0 / self.scale, out=obs[:, 0])
        obs[:, 1].copy_(self.recent)
        obs[:, 2].copy_(((self.episode_best - self.cut) * (1.0 / self.scale)).float().unsqueeze(1).expand(-1, self.n))
        obs[:, 3].copy_(self._degree_feature)
        return obs

    # ------------------------------------------------------------------ VecEnv contract
    def reset(self, seed: int | None = None) -> torch.Tensor:
        if seed is not None:
            self._gen.manual_seed(int(seed))
        self._restart()
        return self._observe()

    def _restart(self) -> None:
        self.s.copy_(self._draw())
        self._recompute()
        self.episode_best.copy_(self.cut)
        self.recent.zero_()
        self._ep_ret.zero_()
        self.elapsed = 0
        self._track_best()

    def flip(self, k: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Flip node ``k[i]`` in env i (only where ``mask``, if given); returns the cut change
        (float32 ``[N]``). Updates spins, gains, cuts and the flip trace; no reward, no clock."""
        # Flat indices: one gather / index_copy_ on 1-D views is cheaper than 2-D advanced indexing.
        flat = self._offsets + k
        s_flat, gain_flat = self.s.view(-1), self.gain.view(-1)
        sk = s_flat.take(flat)
        gain = gain_flat.take(flat)
        if mask is not None:
            m = mask.to(torch.float32)
            sign = 1.0 - 2.0 * m  # -1 where flipping, +1 elsewhere
            s_flat.index_copy_(0, flat, sk * sign)
            gain_flat.index_copy_(0, flat, gain * sign)
            sk = sk * m  # no neighbour change where not flipping
            gain = gain * m
        else:
            s_flat.index_copy_(0, flat, sk.neg())
            gain_flat.index_copy_(0, flat, gain.neg())
        # Neighbour j's field moves by -2 w_kj s_k, so its gain s_j h_j by -2 w_kj s_k s_j.
        nb = self.nbr.index_select(0, k).add_(self._offsets.unsqueeze(1))
        delta = s_flat.take(nb).mul_(self.nbw.index_select(0, k)).mul_((-2.0 * sk).unsqueeze(1))
        gain_flat.index_add_(0, nb.view(-1), delta.view(-1))
        self.cut += gain.double()
        self.recent.mul_(self._decay)
        if mask is None:
            self.recent.view(-1).index_fill_(0, flat, 1.0)
        else:
            self.recent.view(-1).index_copy_(0, flat, torch.where(mask, 1.0, self.recent.view(-1).take(flat)))
        torch.maximum(self.episode_best, self.cut, out=self.episode_best)
        self._track_best()
        return gain

    def step(self, action: torch.Tensor):
        k = self._check_action(action)
        best_before = self.episode_best.clone() if self.reward_kind == "best" else None
        gain = self.flip(k)
        if self.reward_kind == "delta":
            reward = gain
        else:
            reward = (self.episode_best - best_before).float()
        self._ep_ret += reward.double()
        self.elapsed += 1
        obs = self._observe()
        terminated = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        ended = self.elapsed >= self.max_episode_steps
        truncated = torch.full((self.num_envs,), ended, dtype=torch.bool, device=self.device)
        info: dict[str, Any] = {
            "final_obs": obs, "cut": self.cut.clone(), "episode_return": self._ep_ret.float(),
            "episode_length": torch.full((self.num_envs,), self.elapsed, dtype=torch.int64, device=self.device),
        }
        if ended:
            self._restart()
            obs = self._observe()
        return obs, reward, terminated, truncated, info

    def _check_action(self, action: Any) -> torch.Tensor:
        a = torch.as_tensor(action, device=self.device)
        if a.shape == (self.num_envs, 1):
            a = a.view(self.num_envs)
        if a.shape != (self.num_envs,):
            raise EnvError(f"{self.env_id}: action has shape {tuple(a.shape)}, expected ({self.num_envs},) "
                           "(one node index per env)")
        if a.is_floating_point() or a.dtype == torch.bool:
            raise EnvError(f"{self.env_id}: actions must be integer node ids in [0, {self.n}), got {a.dtype}")
        return a.long()

    def state_dict(self) -> dict[str, Any]:
        return {"env_id": self.env_id, "num_envs": self.num_envs, "copyable": True, "s": self.s.clone(),
                "recent": self.recent.clone(), "episode_best": self.episode_best.clone(),
                "episode_return": self._ep_ret.clone(), "elapsed": self.elapsed,
                "best_cut": self.best_cut.clone(), "best_assignment": self.best_assignment.clone(),
                "env_best_cut": self.env_best_cut.clone(), "env_best_assignment": self.env_best_assignment.clone(),
                "start": None if self._start is None else self._start.clone(),
                "flip_prob": torch.as_tensor(self._flip_prob).clone(),
                "rng_state": self._gen.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        if state.get("env_id") != self.env_id or state.get("num_envs") != self.num_envs:
            raise ValueError(f"state of {state.get('env_id')!r} x{state.get('num_envs')} does not fit "
                             f"{self.env_id!r} x{self.num_envs}")
        self.s.copy_(state["s"])
        self._recompute()
        self.recent.copy_(state["recent"])
        self.episode_best.copy_(state["episode_best"])
        self._ep_ret.copy_(state["episode_return"])
        self.elapsed = int(state["elapsed"])
        self.best_cut.copy_(state["best_cut"])
        self.best_assignment.copy_(state["best_assignment"])
        self.env_best_cut.copy_(state["env_best_cut"])
        self.env_best_assignment.copy_(state["env_best_assignment"])
        self._start = None if state["start"] is None else state["start"].to(self.device)
        self._flip_prob = torch.as_tensor(state["flip_prob"]).to(self.device)
        self._gen.set_state(state["rng_state"].cpu())
        return True

    def close(self) -> None:
        """Nothing to release."""

    def __repr__(self) -> str:
        return (f"MaxCutEnv({self.graph.name}: n={self.n}, m={self.graph.m}, "
                f"num_envs={self.num_envs}, device={self.device})")
