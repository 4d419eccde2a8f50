"""The shared solver loop: policy-gradient mean-field sampling, local search, elite restarts.

``mcpg(problem, seconds)`` searches any :class:`~corral.problems.base.Problem` (MaxCut, MIS,
vertex cover, ...) in the manner of MCPG / RLSolver:

* ``B`` chains each hold a feasible 0/1 vector ``x`` (internal form), started from
  ``problem.random`` and improved by ``problem.improve``.
* A **mean-field policy**, one logit per variable (``p = sigmoid(theta)``: the probability that
  the variable is 1 in a good solution), picks which variables each chain changes: chain b flips
  ``k_b`` variables (a ladder from 1 to ``max_flips`` over the chains), drawn without replacement
  with weight ``p_i`` where ``x_i = 0`` and ``1 - p_i`` where ``x_i = 1`` (the policy's probability
  of the new value). ``problem.repair`` keeps the flipped-in variables where it can, and
  ``problem.improve`` climbs from there.
* **Policy gradient**: the reward of a sample is its score after local search minus the score of
  the chain it came from (normalized over the batch); ``theta`` moves by REINFORCE on the log
  probability of the flips it chose (Adam), with an entropy bonus that keeps it from
  collapsing.
* **Acceptance** as in iterated local search: a sample replaces its chain if it is no worse,
  and, if worse by ``d``, with probability ``1 / (1 + d * gap)`` (``gap``: how far it is below
  the best so far, both in units of ``problem.scale``).
* **Elites**: the ``elites`` best distinct solutions seen so far; a chain that has not improved
  for ``patience`` rounds restarts from one of them.

Every step is a batched tensor operation on the problem's device; the host reads the best
score once a round (for the progress record and the time to best).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from corral.errors import UserError
from corral.problems.base import Problem, Result, Tracker


def _row_hash(x: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    return (x.to(torch.float64) * key).sum(-1)


@torch.no_grad()
def _merge_elites(pool_x, pool_s, x, s, key, k):
    """The ``k`` best distinct rows of pool and x (best first)."""
    all_x = torch.cat([pool_x, x]) if pool_x is not None else x
    all_s = torch.cat([pool_s, s]) if pool_s is not None else s
    h = _row_hash(all_x, key)
    _, inverse = torch.unique(h, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1,), all_x.shape[0], dtype=torch.long, device=x.device)
    first.scatter_reduce_(0, inverse, torch.arange(all_x.shape[0], device=x.device), reduce="amin")
    ss = all_s[first]
    order = torch.argsort(ss, descending=True, stable=True)[:k]
    keep = first[order]
    return all_x[keep].clone(), all_s[keep].clone()


def _flip_ladder(B: int, max_flips: int, n: int, dev) -> tuple[int, torch.Tensor]:
    """Chain b flips ``k_b`` variables, a ladder from 1 to ``max_flips`` over the chains: the
    largest ``k`` and which of the ``[B, kmax]`` draws each chain uses."""
    k_of = torch.clamp(torch.round(torch.logspace(0, math.log2(max(1, max_flips)), B, base=2.0)), 1, n).long().to(dev)
    kmax = int(k_of.max())
    cols = torch.arange(kmax, device=dev)
    return kmax, cols.unsqueeze(0) < k_of.unsqueeze(1)


def _reached(problem: Problem, best_s: float, target: float | None) -> bool:
    if target is None:
        return False
    v = problem.value_of_score(best_s)
    return v >= target - 1e-9 if problem.sense == "max" else v <= target + 1e-9


def _policy_step(theta, p, x, idx, used, s, sy, adam_m, adam_v, step: int, lr: float, ent_coef: float) -> None:
    """REINFORCE on the flips' log-probabilities (a draw without replacement, taken as
    independent draws from the normalized weights), then Adam by hand on ``theta``."""
    B = x.shape[0]
    pw = torch.where(x, 1.0 - p, p).clamp_min(1e-6)
    logp = (torch.log(pw.gather(1, idx)) - torch.log(pw.sum(1, keepdim=True))) * used
    adv = (sy - s).float()
    adv = (adv - adv.mean()) / (adv.std() + 1e-6) if B > 1 else adv
    entropy = -(p * torch.log(p + 1e-9) + (1 - p) * torch.log(1 - p + 1e-9)).mean()
    loss = -(adv.unsqueeze(1) * logp).sum(1).mean() - ent_coef * entropy
    (grad,) = torch.autograd.grad(loss, theta)
    with torch.no_grad():
        adam_m.mul_(0.9).add_(grad, alpha=0.1)
        adam_v.mul_(0.999).addcmul_(grad, grad, value=0.001)
        mhat = adam_m / (1 - 0.9**step)
        vhat = adam_v / (1 - 0.999**step)
        theta.sub_(lr * mhat / (vhat.sqrt() + 1e-8)).clamp_(-6.0, 6.0)


def _accept(x, s, y, sy, best_s: float, stall, scale: float, gen):
    """Iterated local search acceptance: a sample replaces its chain if no worse, else with
    probability ``1 / (1 + d * gap)``; the chains' stall counts move on."""
    worse = ((s - sy) / scale).clamp_min(0).float()
    gap = ((best_s - sy) / scale).clamp_min(0).float()
    u = torch.rand(x.shape[0], generator=gen, device=x.device)
    accept = (sy >= s) | (u < 1.0 / (1.0 + worse * gap))
    improved = sy > s
    x = torch.where(accept.unsqueeze(1), y, x)
    s = torch.where(accept, sy, s)
    return x, s, torch.where(improved, 0, stall + 1)


def _restart(x, s, stall, pool_x, pool_s, patience: int, gen):
    """Chains that stalled ``patience`` rounds restart from elites drawn at random."""
    restart = stall >= patience
    if bool(restart.any()):
        pick = torch.randint(pool_x.shape[0], (x.shape[0],), generator=gen, device=x.device)
        x = torch.where(restart.unsqueeze(1), pool_x[pick], x)
        s = torch.where(restart, pool_s[pick], s)
        stall = torch.where(restart, 0, stall)
    return x, s, stall


def mcpg(
    problem: Problem,
    seconds: float = 30.0,
    seed: int = 0,
    batch: int = 32,
    max_flips: int = 4,
    lr: float = 0.05,
    ent_coef: float = 0.01,
    elites: int = 16,
    patience: int = 50,
    rounds: int | None = None,
    progress: Callable[[dict], None] | None = None,
    stop_at: float | None = None,
) -> Result:
    """Search ``problem`` for about ``seconds`` (or ``rounds`` rounds, whichever ends first);
    stop early if the user's value reaches ``stop_at`` (or the problem's known optimum)."""
    if not seconds > 0:
        raise UserError(f"the time limit must be positive, got {seconds}")
    if batch < 2:
        raise UserError(f"mcpg needs at least 2 chains, got batch={batch}")
    t0 = time.perf_counter()
    deadline = t0 + seconds
    dev = problem.device
    n, B = problem.n, int(batch)
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    key = torch.rand(n, generator=gen, device=dev, dtype=torch.float64) + 0.5
    scale = float(getattr(problem, "scale", 1.0))
    target = stop_at if stop_at is not None else problem.optimum
    tracker = Tracker(problem.sense)

    theta = torch.zeros(n, device=dev, requires_grad=True)
    adam_m, adam_v = torch.zeros(n, device=dev), torch.zeros(n, device=dev)  # Adam by hand: torch.optim
    # imports torch._dynamo on first use (seconds of a short run)
    kmax, used = _flip_ladder(B, max_flips, n, dev)

    with torch.no_grad():
        x = problem.random(B, gen)
        s = problem.score(x)
    pool_x, pool_s = _merge_elites(None, None, x, s, key, elites)
    best_x, best_s = pool_x[0].clone(), float(pool_s[0])
    stall = torch.zeros(B, dtype=torch.long, device=dev)
    now = time.perf_counter()
    tracker.seen(problem.value_of_score(best_s), now - t0)
    samples, step = B, 0
    next_report = t0 + 1.0

    while not _reached(problem, best_s, target) and (rounds is None or step < rounds) and time.perf_counter() < deadline:
        step += 1
        p = torch.sigmoid(theta)
        with torch.no_grad():
            w = torch.where(x, 1.0 - p, p).clamp_min(1e-6)
            idx = torch.multinomial(w, kmax, replacement=False, generator=gen)  # [B, kmax]
            flip = torch.zeros_like(x)
            flip.scatter_(1, idx, used)
            y = x ^ flip
            y = problem.repair(y, keep=y & flip, gen=gen)
            y = problem.improve(y, gen)
            sy = problem.score(y)
        _policy_step(theta, p, x, idx, used, s, sy, adam_m, adam_v, step, lr, ent_coef)
        with torch.no_grad():
            x, s, stall = _accept(x, s, y, sy, best_s, stall, scale, gen)
            samples += B
            pool_x, pool_s = _merge_elites(pool_x, pool_s, y, sy, key, elites)
            top = float(pool_s[0])
            if top > best_s:
                best_s, best_x = top, pool_x[0].clone()
                tracker.seen(problem.value_of_score(best_s), time.perf_counter() - t0)
            x, s, stall = _restart(x, s, stall, pool_x, pool_s, patience, gen)
        now = time.perf_counter()
        if progress is not None and now >= next_report:
            next_report = now + 1.0
            progress({"seconds": round(now - t0, 3), "value": problem.value_of_score(best_s), "phase": "mcpg",
                      "samples": samples})

    info = {"rounds": step, "samples": samples, "batch": B, "policy_mean": float(torch.sigmoid(theta.detach()).mean())}
    return _result(problem, best_x, tracker, t0, info, progress)


def _result(problem: Problem, best_x, tracker: Tracker, t0: float, info: dict, progress) -> Result:
    """The best solution, exported and checked, as the run's Result (and its last progress record)."""
    solution = problem.export(best_x)
    value = problem.check(solution)
    seconds_used = round(time.perf_counter() - t0, 3)
    if progress is not None:
        progress({"seconds": seconds_used, "value": value, "phase": "done", "samples": info["samples"]})
    return Result(problem=problem.kind, instance=problem.name, method="mcpg", sense=problem.sense, value=value,
                  solution=solution, seconds=seconds_used, time_to_best=tracker.time_to_best,
                  history=tracker.history, optimum=problem.optimum, info=info)
