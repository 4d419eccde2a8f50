"""Augmented Random Search (Mania, Guy and Recht 2018, "Simple random search of static linear
policies is competitive for reinforcement learning"): V1 and V2, with the top-b directions
(V1-t, V2-t), as sb3-contrib's ARS runs it; Discrete and Box actions.

Each iteration draws ``n_delta`` directions ``delta_k ~ N(0, I)`` over the policy's flat
parameters ``theta`` and scores ``2 n_delta`` candidates, ``theta + nu delta_k`` and ``theta - nu
delta_k`` (``nu = delta_std``), by the return of one episode each (plus ``alive_bonus_offset``
per step). The step keeps the ``b = n_top`` directions with the largest ``max(r+, r-)``:

    theta <- theta + alpha / (b sigma_R + 1e-6) * sum_k (r+_k - r-_k) delta_k

``sigma_R`` the standard deviation of those ``2b`` returns (``ars_step``). V2
(``normalize_obs``) feeds the policy ``(x - mu) / sigma`` with the mean and standard deviation
of every state seen so far: updated with every vector step before it is normalized
(``norm_update=step``, what rl-zoo's ``VecNormalize`` does around sb3-contrib's ARS), or
frozen within an iteration and refreshed at its end (``norm_update=iteration``, the paper's
Algorithm 2: all candidates of an iteration see the same normalization).

**Candidates on the env columns.** Every env column evaluates one candidate per episode, so a
vector env of ``2 n_delta`` copies scores a whole iteration in parallel (batched: each column's
parameters gathered per step, one ``bmm`` per layer). A column takes the next candidate of the
iteration when its episode starts; once none is left it runs the central policy ``theta``
until its episode ends (those steps are counted in ``idle_frac``, not scored). The update
happens at the step where the last candidate's episode ends. The ``extras`` of every step say
which candidate of which iteration a column acted with, so the learner scores steps it did not
act itself: **collectors** (``scheme.collectors=K``) each take every K-th candidate
(``set_worker``), act with the broadcast ``theta``, directions and normalizer, and the learner
scores their fragments through ``observe``; a candidate scored twice (a restarted collector)
keeps its first complete episode. The directions are a function of (seed, iteration), drawn
by the learner and broadcast with ``theta``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from corral.actors.normalizer import RunningNormalizer
from corral.algos.base import Algorithm, Step
from corral.config import option
from corral.errors import TrainingError, UserError


@dataclass
class ARSConfig:
    n_delta: int = option(8, "random directions per iteration (2 n_delta candidates: theta +- delta_std * delta)",
                          ge=1)
    n_top: int | None = option(None, "b: the directions with the largest max(r+, r-) that make the step (None: all "
                                     "n_delta)", ge=1)
    lr: float = option(0.02, "step size alpha", gt=0)
    delta_std: float = option(0.05, "exploration noise nu: the candidates are theta +- nu delta, delta ~ N(0, I)",
                              gt=0)
    zero_policy: bool = option(True, "start from theta = 0 (else from the network's random initialization)")
    alive_bonus_offset: float = option(0.0, "added to every step's reward in the candidates' returns (cancels an "
                                            "env's alive bonus)")
    normalize_obs: bool = option(False, "V2: observations normalized by the mean and std of every state seen "
                                        "(False: V1)")
    norm_update: Literal["step", "iteration"] = option(
        "step", "V2's statistics: step (updated with every vector step, each observation normalized with statistics "
                "that include it: rl-zoo's VecNormalize) or iteration (frozen within an iteration, refreshed at its "
                "end: the paper's Algorithm 2)")
    hidden: tuple[int, ...] = option((), "hidden layer sizes (empty: the paper's linear policy, no bias; else an MLP "
                                         "with biases and, for Box actions, a tanh-squashed output)", ge=1)
    activation: Literal["relu", "tanh"] = option("relu", "hidden activation of an MLP policy")


class ARSExtras(NamedTuple):
    """Which candidate each column acted with: ``candidate`` (-1: the central policy, not
    scored) of ``iteration``."""

    candidate: torch.Tensor
    iteration: torch.Tensor


class ARSPolicy(nn.Module):
    """A deterministic policy on flat parameters: a linear map (or MLP) of the (normalized)
    observation to logits (argmax: the Discrete action) or to a Box action (clipped to the
    bounds; an MLP's output squashed by tanh onto them). ``theta``, the iteration's directions
    and the normalizer statistics are buffers, so they travel in ``state_dict`` to collectors
    and checkpoints."""

    def __init__(self, obs_space: gym.spaces.Box, act_space: gym.Space, cfg: ARSConfig):
        super().__init__()
        self.obs_dim = int(math.prod(obs_space.shape))
        self.discrete = isinstance(act_space, gym.spaces.Discrete)
        out = int(act_space.n) if self.discrete else int(math.prod(act_space.shape))
        self.act_shape = tuple(act_space.shape)
        self.dims = [self.obs_dim, *cfg.hidden, out]
        self.bias = len(cfg.hidden) > 0
        self.act_fn = torch.relu if cfg.activation == "relu" else torch.tanh
        self.squash = self.bias and not self.discrete
        size = sum(a * b + (b if self.bias else 0) for a, b in zip(self.dims[:-1], self.dims[1:]))
        theta = torch.zeros(size)
        if not cfg.zero_policy:  # nn.Linear's initialization, U(-1/sqrt(in), 1/sqrt(in)), weights and biases
            off = 0
            for a, b in zip(self.dims[:-1], self.dims[1:]):
                n = a * b + (b if self.bias else 0)
                theta[off:off + n].uniform_(-1 / math.sqrt(a), 1 / math.sqrt(a))
                off += n
        self.register_buffer("theta", theta)
        self.register_buffer("deltas", torch.zeros(cfg.n_delta, size))
        self.register_buffer("iteration", torch.zeros((), dtype=torch.long))
        # V2: ``seen`` folds every state acted on; ``obs_norm`` normalizes, a copy of ``seen`` frozen within
        # an iteration (norm_update=iteration), else unused: ``seen`` itself normalizes (norm_update=step)
        self.per_step = cfg.norm_update == "step"
        self.obs_norm = RunningNormalizer((self.obs_dim,), enabled=cfg.normalize_obs)
        self.seen = RunningNormalizer((self.obs_dim,), enabled=cfg.normalize_obs)
        if not self.discrete:
            low = torch.as_tensor(act_space.low, dtype=torch.float32).reshape(-1)
            high = torch.as_tensor(act_space.high, dtype=torch.float32).reshape(-1)
            self.squash = self.squash and bool(torch.isfinite(low).all() and torch.isfinite(high).all())
            self.register_buffer("low", low)
            self.register_buffer("high", high)

    def normalize(self, obs: torch.Tensor, update: bool = False) -> torch.Tensor:
        x = obs.reshape(obs.shape[0], -1).float()
        if update:  # first the statistics, then the normalization (VecNormalize's order)
            self.seen.update(x)
        return (self.seen if self.per_step else self.obs_norm)(x)

    def outputs(self, x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        """Logits / actions before the bounds for inputs ``x [N, in]`` under ``params``: one flat
        vector ``[P]`` for every row, or one per row ``[N, P]`` (a batched matmul per layer)."""
        per_row = params.dim() == 2
        h, off, last = x, 0, len(self.dims) - 2
        for i, (a, b) in enumerate(zip(self.dims[:-1], self.dims[1:])):
            w = params[..., off:off + a * b].unflatten(-1, (b, a))
            off += a * b
            h = torch.bmm(w, h.unsqueeze(-1)).squeeze(-1) if per_row else h @ w.T
            if self.bias:
                h = h + params[..., off:off + b]
                off += b
            if i < last:
                h = self.act_fn(h)
        return h

    def to_env(self, out: torch.Tensor) -> torch.Tensor:
        if self.discrete:
            return out.argmax(-1)
        if self.squash:
            action = self.low + (torch.tanh(out) + 1.0) * 0.5 * (self.high - self.low)
        else:
            action = torch.maximum(torch.minimum(out, self.high), self.low)
        return action.reshape(out.shape[0], *self.act_shape)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True, generator: torch.Generator | None = None):
        """The central policy's env actions (ARS's policy is deterministic)."""
        return self.to_env(self.outputs(self.normalize(obs), self.theta))


def ars_step(returns: torch.Tensor, deltas: torch.Tensor, n_top: int, lr: float) -> tuple[torch.Tensor, dict]:
    """The change of ``theta`` from the ``2 n`` candidates' ``returns`` (``+delta_k`` first, then
    ``-delta_k``) and the ``[n, P]`` directions: the top ``n_top`` directions by ``max(r+, r-)``,
    ``lr / (n_top sigma + 1e-6) * sum (r+ - r-) delta``. Returns ``(change, stats)``."""
    n = deltas.shape[0]
    plus, minus = returns[:n], returns[n:]
    top = torch.maximum(plus, minus).argsort(descending=True, stable=True)[:n_top]
    plus, minus = plus[top], minus[top]
    sigma = torch.cat([plus, minus]).std()
    step_size = lr / (n_top * sigma + 1e-6)
    change = (step_size * ((plus - minus) @ deltas[top].to(returns.dtype))).to(deltas.dtype)
    return change, {"return_std": float(sigma), "step_size": float(step_size)}


class ARS(Algorithm):
    name = "ars"
    Config = ARSConfig

    def __init__(self, cfg: ARSConfig, obs_space, act_space, num_envs, device, rng, role="learner"):
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)
        if not isinstance(act_space, (gym.spaces.Discrete, gym.spaces.Box)):
            raise UserError(f"ars acts in Discrete or Box action spaces (sb3-contrib's), not {act_space}")
        if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) > 1 or obs_space.dtype == np.uint8:
            raise UserError(f"ars's policy is a linear map (or small MLP) of a flat vector observation; {obs_space} "
                            "is not one (flatten it in an env wrapper, or use ppo for images)")
        if cfg.n_top is not None and cfg.n_top > cfg.n_delta:
            raise UserError(f"ars.n_top={cfg.n_top} is more than ars.n_delta={cfg.n_delta}: the step keeps the best "
                            "n_top of the n_delta directions; lower n_top (or leave it unset: all of them)")
        self.n_top = cfg.n_top or cfg.n_delta
        self.pop = 2 * cfg.n_delta
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(rng.seeds["init"])
            self.actor = ARSPolicy(obs_space, act_space, cfg).to(device)
        self._cache: tuple[int, torch.Tensor] | None = None  # (iteration, the candidates' parameters)
        self.set_worker(0, 1)
        # the columns: what each env column evaluates (column state; collectors keep their own)
        n = num_envs
        self._slot = torch.full((n,), -1, dtype=torch.long, device=device)  # candidate, -1: central policy
        self._slot_iter = torch.full((n,), -1, dtype=torch.long, device=device)
        self._start = torch.ones(n, dtype=torch.bool, device=device)  # the next observation starts an episode
        self._taken = torch.zeros(self.pop, dtype=torch.bool, device=device)  # handed out by this worker
        self._taken_iter = torch.full((), -1, dtype=torch.long, device=device)
        self._col_return = torch.zeros(n, dtype=torch.float64, device=device)  # the running episode's score
        self._col_length = torch.zeros(n, dtype=torch.long, device=device)
        # the iteration's scores (learner)
        self.returns = torch.zeros(self.pop, dtype=torch.float64, device=device)
        self.lengths = torch.zeros(self.pop, dtype=torch.long, device=device)
        self.done = torch.zeros(self.pop, dtype=torch.bool, device=device)
        self.idle_steps = torch.zeros((), dtype=torch.long, device=device)
        self.steps = torch.zeros((), dtype=torch.long, device=device)
        self.updates = 0
        if self.stores:
            self.actor.deltas.copy_(self.directions(0))

    def directions(self, iteration: int) -> torch.Tensor:
        """``[n_delta, P]`` standard normal directions of ``iteration``: a function of the run's
        seed and the iteration only (no stream state to carry)."""
        seed = np.random.SeedSequence([self.rng.seeds["noise"], iteration]).generate_state(1)[0]
        g = torch.Generator().manual_seed(int(seed))
        return torch.randn(self.actor.deltas.shape, generator=g).to(self.device)

    def candidates(self) -> torch.Tensor:
        """``[2 n_delta + 1, P]``: the central policy, then ``theta + nu delta_k``, then ``theta - nu delta_k``."""
        it = int(self.actor.iteration)
        if self._cache is None or self._cache[0] != it:
            a = self.actor
            scaled = self.cfg.delta_std * a.deltas
            self._cache = (it, torch.cat([a.theta.unsqueeze(0), a.theta + scaled, a.theta - scaled]))
        return self._cache[1]

    # --- hooks
    def set_worker(self, index: int, count: int) -> None:
        self._mine = list(range(index, self.pop, count))  # this worker's share of each iteration's candidates

    def episodes_ended(self, ended: torch.Tensor) -> None:
        self._start |= ended.to(self._start.device, torch.bool)

    def column_state(self) -> dict:
        return {k: getattr(self, k).clone() for k in ("_slot", "_slot_iter", "_start", "_taken", "_taken_iter",
                                                      "_col_return", "_col_length")}

    def load_collector_state(self, state) -> None:
        super().load_collector_state(state)
        self._cache = None

    # --- acting
    def assign(self, it: int) -> None:
        """Columns starting an episode take this worker's next candidates of iteration ``it``."""
        if int(self._taken_iter) != it:
            self._taken.zero_()
            self._taken_iter.fill_(it)
        free = [c for c in self._mine if not self._taken[c]]
        for j in self._start.nonzero().flatten().tolist():
            c = free.pop(0) if free else -1
            self._slot[j] = c
            self._slot_iter[j] = it
            if c >= 0:
                self._taken[c] = True
        self._start.zero_()

    def explore(self, obs):
        actor = self.actor
        it = int(actor.iteration)
        if self._start.any():
            self.assign(it)
        # a column still on an earlier iteration's candidate finishes its episode on the central policy
        self._slot.masked_fill_(self._slot_iter != it, -1)
        x = actor.normalize(obs, update=True)
        out = actor.outputs(x, self.candidates()[self._slot + 1])
        return actor.to_env(out), ARSExtras(self._slot.clone(), self._slot_iter.clone())

    def act(self, obs, deterministic: bool = True):
        return self.actor.act(obs, deterministic)

    # --- scoring
    def observe(self, step: Step) -> None:
        ex = step.extras
        live = (ex.candidate >= 0) & (ex.iteration == self.actor.iteration)
        reward = step.reward.to(torch.float64) + self.cfg.alive_bonus_offset
        self._col_return += torch.where(live, reward, 0.0)
        self._col_length += live
        self.steps += live.numel()
        self.idle_steps += (~live).sum()
        ended = step.episode_ended()
        scored = ended & live
        if scored.any():
            c = ex.candidate[scored]
            first = ~self.done[c]  # a candidate scored twice keeps its first complete episode
            self.returns[c[first]] = self._col_return[scored][first]
            self.lengths[c[first]] = self._col_length[scored][first]
            self.done[c[first]] = True
        self._col_return.masked_fill_(ended, 0.0)
        self._col_length.masked_fill_(ended, 0)

    def ready(self) -> bool:
        return bool(self.done.all())

    def update(self, progress: float) -> dict[str, float]:
        cfg, actor = self.cfg, self.actor
        if not torch.isfinite(self.returns).all():
            raise TrainingError(f"ars: a candidate's return is not finite at iteration {int(actor.iteration)}; "
                                "check the env's rewards")
        change, stats = ars_step(self.returns, actor.deltas, self.n_top, cfg.lr)
        actor.theta += change
        if cfg.normalize_obs and not actor.per_step:  # the next iteration normalizes with every state seen so far
            actor.obs_norm.load_state_dict(actor.seen.state_dict())
        stats.update(return_mean=float(self.returns.mean()), return_max=float(self.returns.max()),
                     candidate_length=float(self.lengths.float().mean()),
                     idle_frac=float(self.idle_steps) / max(1, int(self.steps)), theta_norm=float(actor.theta.norm()),
                     lr=cfg.lr, delta_std=cfg.delta_std, iteration=float(actor.iteration))
        actor.iteration += 1
        actor.deltas.copy_(self.directions(int(actor.iteration)))
        self._cache = None
        for t in (self.returns, self.lengths, self.done, self.idle_steps, self.steps):
            t.zero_()
        self.updates += 1
        return stats

    # --- state
    def extra_state(self):
        return {"columns": self.column_state(), "returns": self.returns.clone(), "lengths": self.lengths.clone(),
                "done": self.done.clone(), "idle_steps": self.idle_steps.clone(), "steps": self.steps.clone(),
                "updates": self.updates}

    def load_extra_state(self, state):
        if state["columns"]["_slot"].shape == self._slot.shape:  # else (another number of envs): fresh episodes
            self.load_column_state(state["columns"])
        for k in ("returns", "lengths", "done", "idle_steps", "steps"):
            getattr(self, k).copy_(state[k])
        self.updates = int(state["updates"])
        self._cache = None
