"""Solving MaxCut with a policy trained by PPO on the instance, plus the best-cut tracker.

``solve_maxcut(graph, time_limit, ...)`` with ``method``:

* ``"ppo"``: train a :class:`NodePolicy` with corral's PPO through the Learner (its
  device-resident loop) on the instance's :class:`MaxCutEnv` for
  ``train_fraction`` of the time, then sample flips from it in all envs for the rest.
* ``"random"``: the same search with uniform random flips instead of the policy (the
  baseline that shows what learning adds).
* ``"greedy"``: multi-start steepest-ascent one-flip local search (random start, flip the
  best positive-gain node until none is left, restart).
* ``"tabu"``: a hand-written reference, batched tabu search (best non-tabu flip, tenure n/10,
  aspiration), to show how the learned policy compares with a classic heuristic.
* ``"bls"``: breakout local search (:mod:`corral.problems.maxcut_bls`), the strongest of them on
  Gset; it stops early at ``stop_at``.

In every method the env keeps the best cut any env has been in, and the best assignment is
finally polished by the same steepest-ascent local search.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from corral.errors import UserError
from corral.nets import CategoricalHead
from corral.problems.base import InfeasibleSolution, Problem
from corral.problems.graphs import Graph
from corral.problems.maxcut import FEATURES, MaxCutEnv, cut_value

METHODS = ("ppo", "random", "greedy", "tabu", "bls")


class NodePolicy(nn.Module):
    """A distribution over which node to flip: one small MLP scores every node from its
    features (the same weights for all nodes, so they do not depend on the graph's size),
    and a softmax over the graph picks one. The value is a small MLP of graph-level
    summaries (the mean of each feature and the largest gain).

    The interface of ``corral.actors.ActorCritic`` that PPO uses (``explore``, ``evaluate_actions``,
    ``value``, ``outputs``, storage shapes), so the solver trains it with the ordinary PPO through
    the Learner; ``act`` samples without the value pass.
    """

    discrete = True

    def __init__(self, num_nodes: int, num_features: int = len(FEATURES), hidden: int = 16):
        super().__init__()
        self.obs_shape = (num_features, num_nodes)
        self.act_shape = ()
        self.score = nn.Sequential(nn.Linear(num_features, hidden), nn.ReLU())
        self.out = nn.Linear(hidden, 1, bias=False)  # a bias would cancel in the softmax
        nn.init.orthogonal_(self.score[0].weight, math.sqrt(2))
        nn.init.zeros_(self.score[0].bias)
        nn.init.orthogonal_(self.out.weight, 0.01)  # near-uniform first policy: random flips
        self.value_net = nn.Sequential(nn.Linear(num_features + 1, 32), nn.Tanh(), nn.Linear(32, 1))
        self.head = CategoricalHead()

    def stored_obs(self):
        return self.obs_shape, torch.float32

    def stored_action(self):
        return (), torch.long

    def normalize(self, obs: torch.Tensor, update: bool = False) -> torch.Tensor:
        return obs  # features are scaled by the env

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, n]`` node scores from feature-major ``x [B, F, n]``: ``bmm`` with the weights
        expanded over the batch is 3-4x faster on CPU, forward and backward, than ``nn.Linear``
        on node-major ``[B * n, F]`` (inner dimension F = 4) or ``matmul``'s broadcasting."""
        lin, B = self.score[0], x.shape[0]
        h = lin.weight.shape[0]
        z = torch.bmm(lin.weight.expand(B, -1, -1), x).add_(lin.bias.view(1, h, 1))
        return torch.bmm(self.out.weight.expand(B, -1, -1), torch.relu_(z)).squeeze(-2)

    def value(self, x: torch.Tensor) -> torch.Tensor:
        summary = torch.cat([x.mean(-1), x[:, 0].amax(-1, keepdim=True)], -1)
        return self.value_net(summary).squeeze(-1)

    def outputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw logits and value (what ``ppo_loss``'s Categorical fast path takes)."""
        return self.logits(x), self.value(x)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, value = self.outputs(x)
        return self.head(logits), value

    def evaluate_actions(self, x, action):
        params, value = self.forward(x)
        return self.head.log_prob(params, action), self.head.entropy(params), value

    def to_env(self, action):
        return action

    def explore(self, obs: torch.Tensor, generator: torch.Generator | None = None):
        """``(env action, action, log_prob, value, stored obs)`` for training (under no_grad)."""
        x = self.normalize(obs)
        params, value = self.forward(x)
        action = self.head.sample(params, generator)
        return action, action, self.head.log_prob(params, action), value, x

    @torch.no_grad()
    def act(self, obs, deterministic: bool = False, generator: torch.Generator | None = None):
        logits = self.logits(obs)
        if deterministic:
            return logits.argmax(-1)
        # Inverse-CDF sampling: one exp over [B, n] and one uniform per row (Gumbel-max would
        # draw n uniforms and take two logs of each; this is the search's hot path).
        w = logits.sub_(logits.amax(-1, keepdim=True)).exp_().cumsum_(-1)
        u = torch.rand(w.shape[0], 1, generator=generator, device=w.device).mul_(w[:, -1:])
        return torch.searchsorted(w, u).squeeze(1).clamp_(max=w.shape[1] - 1)


@torch.no_grad()
def local_search(env: MaxCutEnv, max_steps: int | None = None, check_every: int = 16) -> int:
    """Steepest ascent in every env: flip the node with the largest positive gain until no
    gain is positive (a one-flip local optimum). Returns the steps taken."""
    max_steps = max_steps or 10 * env.n
    tol = 1e-6 * env.scale
    for step in range(1, max_steps + 1):
        g, k = env.gain.max(1)
        active = g > tol
        env.flip(k, active)
        if step % check_every == 0 and not bool(active.any()):
            return step
    return max_steps


@torch.no_grad()
def _tabu_search(env: MaxCutEnv, deadline: float, gen: torch.Generator, report, chunk: int = 16) -> int:
    """A hand-written reference, not learned: batched tabu search. Each env flips its best
    non-tabu node (ties broken at random); a node flipped in the last ``tenure`` steps is
    tabu unless flipping it would beat the env's own best cut (aspiration)."""
    N, n = env.num_envs, env.n
    tenure = max(10, n // 10)
    last = torch.full((N, n), -(10**9), dtype=torch.long, device=env.device)
    env.env_best_cut.copy_(env.cut)
    rows = torch.arange(N, device=env.device)
    step = 0
    while time.perf_counter() < deadline:
        for _ in range(chunk):
            gain = env.gain
            tabu = last > step - tenure
            aspire = (env.cut.unsqueeze(1) + gain) > env.env_best_cut.unsqueeze(1)
            noise = torch.rand(N, n, generator=gen, device=env.device).mul_(0.5 * env.scale * 1e-3)
            k = (gain + noise).masked_fill_(tabu & ~aspire, -math.inf).argmax(1)
            env.flip(k)
            last[rows, k] = step
            step += 1
        report("tabu")
    return step * N


def solve_maxcut(
    graph: Graph,
    time_limit: float = 60.0,
    num_envs: int = 32,
    seed: int = 0,
    device: str | torch.device = "cpu",
    method: str = "ppo",
    train_fraction: float = 0.25,
    perturb: float = 20.0,
    episode_length: int | None = None,
    hidden: int = 8,
    reward: str = "delta",
    restart: str = "mixed",
    progress: Callable[[dict], None] | None = None,
    ppo: dict | None = None,
    reduce: bool = True,
    stop_at: float | None = None,
) -> dict:
    """Search for a maximum cut of ``graph`` for about ``time_limit`` seconds.

    With ``reduce`` (the default), the exact degree-0/1/2 reductions of
    :mod:`corral.problems.reduce` run first, the search below runs on the reduced graph, and its
    best assignment is lifted back; the cut, the history and ``progress`` are in the original
    graph's terms (the reduced cut plus the constant), and the cut is recomputed on the original
    graph. The record then also has ``reduced_nodes``, ``reduced_edges``, ``constant``.

    Every method starts with steepest ascent from random assignments in all envs. For
    ``"ppo"`` and ``"random"``, episodes then restart with about ``perturb`` random flips
    (env i uses between half and twice that) from the best assignment so far
    (``restart="best"``), from the env's own best (``"own"``), or half the envs each way
    (``"mixed"``, the default), and run ``episode_length`` flips (default n/2) chosen by the
    PPO policy or uniformly at random. The policy trains during the first ``train_fraction``
    of the time: half of that on episodes from random assignments, then on the search's own.
    ``"greedy"`` repeats steepest ascent from fresh random assignments; ``"tabu"`` runs the
    hand-written tabu search, ``"bls"`` breakout local search (stopping once the cut reaches
    ``stop_at``, if given). The best assignment is finally polished by steepest ascent.

    Returns ``{"cut", "assignment" (int8 0/1 [n], on CPU), "seconds", "nodes", "edges",
    "method", "flips", "train_seconds", "history": [(seconds, best cut)], "policy"}``
    (``policy``: the trained NodePolicy, or None). ``progress(record)`` is called about once
    a second with the best cut so far.
    """
    _check_settings(method, time_limit, num_envs, restart)
    settings = dict(num_envs=num_envs, seed=seed, device=device, method=method, train_fraction=train_fraction,
                    perturb=perturb, episode_length=episode_length, hidden=hidden, reward=reward, restart=restart,
                    ppo=ppo, stop_at=stop_at)
    if not reduce:
        return _search_graph(graph, time_limit, progress=progress, **settings)
    return _solve_reduced(graph, time_limit, progress, settings)


def _solve_reduced(graph: Graph, time_limit: float, progress, settings: dict) -> dict:
    """``solve_maxcut`` on the reduced graph, lifted back (see ``reduce``)."""
    from corral.problems.reduce import reduce_maxcut

    t0 = time.perf_counter()
    red = reduce_maxcut(graph)
    const = red.constant
    if red.reduced.n == 0:  # solved by the reductions alone
        r = {"cut": 0.0, "assignment": torch.zeros(0, dtype=torch.int8), "history": [], "flips": 0,
             "train_seconds": 0.0, "updates": 0, "policy": None, "method": settings["method"]}
    else:
        def shifted(rec: dict) -> None:
            if progress is not None:
                progress({**rec, "cut": rec["cut"] + const, "seconds": round(rec["seconds"] + red.seconds, 3)})

        remaining = max(1e-3, time_limit - (time.perf_counter() - t0))
        stop_at = settings["stop_at"] - const if settings["stop_at"] is not None else None
        r = _search_graph(red.reduced, remaining, progress=shifted if progress is not None else None,
                          **{**settings, "stop_at": stop_at})
    assignment = red.lift(r["assignment"])
    cut = float(cut_value(graph.to("cpu"), assignment))
    if abs(cut - (r["cut"] + const)) > 1e-6 * max(1.0, abs(cut)):
        raise RuntimeError(f"MaxCut reductions: the lifted cut {cut} is not the reduced cut {r['cut']} "
                           f"+ the constant {const}")
    seconds = round(time.perf_counter() - t0, 3)
    history = [(round(t + red.seconds, 3), c + const) for t, c in r["history"]]
    if not history or history[-1][1] < cut:
        history.append((seconds, cut))
    return {**r, "cut": cut, "assignment": assignment, "seconds": seconds, "nodes": graph.n, "edges": graph.m,
            "history": history, "reduced_nodes": red.reduced.n, "reduced_edges": red.reduced.m, "constant": const}


def _search_graph(graph: Graph, time_limit: float, num_envs: int, seed: int, device, method: str,
                  train_fraction: float, perturb: float, episode_length: int | None, hidden: int, reward: str,
                  restart: str, progress, ppo: dict | None, stop_at: float | None = None) -> dict:
    """``solve_maxcut``'s search on ``graph`` itself (no reductions)."""
    device = torch.device(device)
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    n, N = graph.n, num_envs
    episode_length = episode_length or max(int(8 * perturb), n // 2)
    flip_prob = min(0.25, perturb / n) * torch.logspace(-1, 1, N, base=2.0, device=device)
    env = MaxCutEnv(graph, N, episode_length=episode_length, device=device, seed=seed, reward=reward)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + 1)
    run = _Search(env, gen, t0, restart, flip_prob, progress)
    train_seconds = 0.0

    if method != "bls":  # bls starts with its own descent from random assignments
        run.random_starts()
    run.report("start", force=True)
    actor = None
    updates = 0
    if method == "greedy":
        while time.perf_counter() < deadline:
            run.random_starts()
            run.report("greedy")
    elif method == "tabu":
        run.flips += _tabu_search(env, deadline, gen, run.report)
    elif method == "bls":
        from corral.problems.maxcut_bls import breakout_search

        run.flips += breakout_search(run, graph, deadline, seed, stop_at)
    else:
        if method == "ppo":
            actor, obs, updates, train_seconds = _train_node_policy(run, seed, hidden, ppo, t0 + train_fraction * time_limit,
                                                                    episode_length)
        else:
            env.start_from(run.restart_point(), flip_prob)
            obs = env.reset()
        run.flip_until(deadline, actor, obs, method)

    return run.polished(graph, method, train_seconds, updates, actor)


def _check_settings(method: str, time_limit: float, num_envs: int, restart: str) -> None:
    if method not in METHODS:
        raise UserError(f"unknown MaxCut method {method!r}; choose one of {', '.join(METHODS)}")
    if not time_limit > 0:
        raise UserError(f"the time limit must be positive, got {time_limit}")
    if num_envs < 1:
        raise UserError(f"the number of envs must be >= 1, got {num_envs}")
    if restart not in ("best", "own", "mixed"):
        raise UserError(f"restart must be 'best', 'own' or 'mixed', got {restart!r}")


class _Search:
    """One ``solve_maxcut`` run's state: the env and random stream, flips counted, the best-cut
    history reported about once a second, and where episodes restart."""

    def __init__(self, env: MaxCutEnv, gen: torch.Generator, t0: float, restart: str, flip_prob, progress):
        self.env, self.gen, self.t0, self.restart, self.flip_prob, self.progress = env, gen, t0, restart, flip_prob, progress
        self.N, self.n, self.device = env.num_envs, env.n, flip_prob.device
        self.history: list[tuple[float, float]] = []
        self.flips = 0
        self.next_report = t0 + 1.0
        self.own = torch.arange(self.N, device=self.device) % 2 == 1  # "mixed": odd envs restart from their own best

    def report(self, phase: str, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now < self.next_report:
            return
        self.next_report = now + 1.0
        best = float(self.env.best_cut)  # the one host sync, about once a second
        if not self.history or best > self.history[-1][1]:
            self.history.append((round(now - self.t0, 3), best))
        if self.progress is not None:
            self.progress({"seconds": round(now - self.t0, 3), "cut": best, "phase": phase, "flips": self.flips})

    def random_starts(self) -> None:
        self.env.set_assignment(torch.rand(self.N, self.n, generator=self.gen, device=self.device) < 0.5)
        self.flips += local_search(self.env) * self.N

    def restart_point(self) -> torch.Tensor:
        env = self.env
        if self.restart == "best":
            return env.best_assignment
        if self.restart == "own":
            return env.env_best_assignment
        return torch.where(self.own.unsqueeze(1), env.env_best_assignment, env.best_assignment)

    def polished(self, graph: Graph, method: str, train_seconds: float, updates: int, actor) -> dict:
        """Steepest ascent from the best assignment found, and the run's result."""
        env = self.env
        env.set_assignment(env.best_assignment.unsqueeze(0).expand(self.N, self.n))
        local_search(env)
        self.report("polish", force=True)
        best = env.best_assignment.to("cpu")
        return {
            "cut": float(cut_value(graph.to("cpu"), best)),
            "assignment": (best > 0).to(torch.int8),
            "seconds": round(time.perf_counter() - self.t0, 3),
            "nodes": self.n,
            "edges": graph.m,
            "method": method,
            "flips": self.flips,
            "train_seconds": round(train_seconds, 3),
            "updates": updates,
            "history": self.history,
            "policy": actor,
        }

    def flip_until(self, deadline: float, actor, obs, method: str, chunk: int = 16) -> None:
        """Flips from ``actor`` (uniform where None) in every env until ``deadline``, episodes
        restarting from perturbed best assignments."""
        env, N = self.env, self.N
        while time.perf_counter() < deadline:
            for _ in range(chunk):
                if actor is None:
                    action = torch.randint(self.n, (N,), generator=self.gen, device=self.device)
                else:
                    action = actor.act(obs, generator=self.gen)
                obs = env.step(action)[0]
            self.flips += chunk * N
            env.start_from(self.restart_point(), self.flip_prob)  # restarts perturb the best so far
            self.report(method)


def _train_node_policy(run: _Search, seed: int, hidden: int, ppo: dict | None, train_end: float, episode_length: int):
    """PPO on the instance until ``train_end``: ``(policy, the env's observation, updates, seconds)``."""
    from corral.train.learner import Learner

    env, N, n, device = run.env, run.N, run.n, run.device
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        actor = NodePolicy(n, hidden=hidden)
    # Curriculum: first episodes from random assignments, where taking gains pays at once
    # and the policy learns to climb within seconds; then the search's own episodes.
    env.start_from(None)
    env.max_episode_steps = max(16, min(n // 2, 512))
    learner = Learner(ppo_config(N, seed, device, ppo), env=env, algo_cls=ppo_with_actor(actor),
                      quiet=True)  # resets the env
    train_start = time.perf_counter()
    switch = train_start + (train_end - train_start) / 2
    n_steps = learner.cfg.algo_cfg.n_steps
    # the Learner's own loop, an update at a time; between updates the search moves the
    # env's start states (the stream goes on from ``learner.obs``)
    for _ in learner.stream() if time.perf_counter() < train_end else ():
        run.flips += n_steps * N
        if not env.starts_random:
            env.start_from(run.restart_point(), run.flip_prob)
        run.report("train")
        if time.perf_counter() >= train_end:
            break
        if env.starts_random and time.perf_counter() >= switch:
            env.max_episode_steps = episode_length
            env.start_from(run.restart_point(), run.flip_prob)
            learner.obs = env.reset()
    updates = learner.algo.updates
    env.max_episode_steps = episode_length
    env.start_from(run.restart_point(), run.flip_prob)
    train_seconds = time.perf_counter() - train_start
    actor.eval()
    return actor, learner.obs, updates, train_seconds


# PPO's settings for the node policy (``solve_maxcut(ppo=...)`` overrides them)
PPO_SETTINGS = dict(n_steps=8, batch_size=256, n_epochs=2, lr=1e-2, gamma=0.95, gae_lambda=0.9, ent_coef=0.0,
                    normalize_reward=True, clip_range=0.2)


def ppo_config(num_envs: int, seed: int, device, overrides: dict | None = None):
    """The run config of the solver's PPO: a time-limited run (the step budget is never
    reached), no evaluation or logging, the caller's torch threads."""
    from corral.train.setup import build_config

    settings = {**PPO_SETTINGS, **(overrides or {})}
    # one minibatch at most the rollout (a preset may ask for more)
    settings["batch_size"] = min(int(settings["batch_size"]), int(settings["n_steps"]) * num_envs)
    return build_config("ppo", "maxcut", steps=2**62, seed=seed, num_envs=num_envs, device=str(torch.device(device)),
                        use_preset=False,
                        overrides={**{f"ppo.{k}": v for k, v in settings.items()}, "eval.episodes": 0,
                                   "progress": False, "tensorboard": False, "threads": torch.get_num_threads()})


def ppo_with_actor(actor: torch.nn.Module) -> type:
    """PPO whose actor factory returns ``actor`` (the node policy)."""
    from corral.algos.ppo import PPO

    class NodePolicyPPO(PPO):
        user_actor = False

        def make_actor(self):
            return actor

    return NodePolicyPPO


class MaxCutProblem(Problem):
    """MaxCut under the shared problem interface (:mod:`corral.problems.base`): a row ``x`` is
    the 0/1 side of every node, every row is feasible, ``score`` is the cut, and ``improve`` is
    the steepest ascent of the solver (``maxcut_solver.local_search``) on a :class:`MaxCutEnv`.

    With ``reduce`` (the default) the search runs on the graph left by the exact reductions of
    :mod:`corral.problems.reduce`: ``n`` is then the reduced graph's node count, ``score`` the
    reduced cut plus the reductions' constant (the original graph's cut of the lifted row),
    ``export`` lifts a row to the original graph and ``check`` recomputes the cut there.
    ``graph`` is always the original graph (``search_graph`` the one searched)."""

    kind = "maxcut"
    sense = "max"

    def __init__(self, graph: Graph, device: str | torch.device = "cpu", reduce: bool = True):
        from corral.problems.reduce import reduce_maxcut

        self.device = torch.device(device)
        self.graph = graph.to(self.device)
        red = reduce_maxcut(graph.to("cpu")) if reduce else None
        if red is not None and (red.removed == 0 or red.reduced.n == 0):
            red = None  # nothing to gain (or nothing left to search: the search needs one node)
        self.reduction = red
        self.search_graph = red.reduced.to(self.device) if red is not None else self.graph
        self.constant = red.constant if red is not None else 0.0
        self.n, self.name = self.search_graph.n, graph.name
        self.optimum = None
        g = self.search_graph
        self.scale = max(float(g.w.abs().mean()), 1e-6) if g.m else 1.0
        self._envs: dict[int, MaxCutEnv] = {}

    def describe(self) -> dict[str, Any]:
        if self.reduction is not None:
            return self.reduction.describe()
        return {"nodes": self.graph.n, "edges": self.graph.m}

    def score(self, x: torch.Tensor) -> torch.Tensor:
        return cut_value(self.search_graph, x) + self.constant

    def improve(self, x: torch.Tensor, gen: torch.Generator | None = None) -> torch.Tensor:
        env = self._envs.get(x.shape[0])
        if env is None:
            env = self._envs[x.shape[0]] = MaxCutEnv(self.search_graph, x.shape[0], device=self.device, seed=0)
        env.set_assignment(x)
        local_search(env)
        return env.s > 0

    def export(self, x: torch.Tensor) -> torch.Tensor:
        if self.reduction is None:
            return x.to("cpu", torch.int8)
        return self.reduction.lift(x.to("cpu"))

    def check(self, solution) -> float:
        s = torch.as_tensor(solution).reshape(-1)
        if s.numel() != self.graph.n:
            raise InfeasibleSolution(f"maxcut {self.name}: the solution has {s.numel()} entries, "
                                     f"the graph {self.graph.n} nodes")
        if not bool(((s == 0) | (s == 1)).all()):
            raise InfeasibleSolution(f"maxcut {self.name}: a solution holds 0 or 1 per node")
        return float(cut_value(self.graph.to("cpu"), s.to(torch.int64)))
