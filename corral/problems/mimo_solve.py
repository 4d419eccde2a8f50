"""``corral solve mimo``: one channel by a method's name (corral's optimizer, the baselines, or
the one-pass policy), apart from ``mimo`` so the policy module can build on ``mimo``."""

from __future__ import annotations

import time

from corral.errors import UserError
from corral.problems.base import Result
from corral.problems.mimo import MimoProblem, ascend, mmse, wmmse_restarts, zero_forcing
from corral.problems.mimo_policy import train_policy


def solve_mimo(problem: MimoProblem, seconds: float, method: str = "corral", seed: int = 0,
               batch: int = 32, train_steps: int = 4000) -> Result:
    """One channel with ``method``: corral (WMMSE then :func:`ascend`, ``batch`` starts, stopped
    at ``seconds``), wmmse, zf, mmse, policy (a :mod:`~corral.problems.mimo_policy` policy
    trained for ``train_steps`` steps or ``seconds`` of CPU time, then one forward pass)."""
    t0 = time.perf_counter()
    H, P = problem.H.unsqueeze(0), problem.P
    info: dict = {}
    if method == "zf":
        W = zero_forcing(H, P, problem.noise)
    elif method == "mmse":
        W = mmse(H, P, problem.noise)
    elif method == "wmmse":
        W = wmmse_restarts(H, P, restarts=max(0, batch - 2), seed=seed, noise=problem.noise)
    elif method == "corral":
        W = wmmse_restarts(H, P, restarts=8, seed=seed, noise=problem.noise)
        W = ascend(H, P, starts=max(2, batch), seed=seed + 1, noise=problem.noise, init=W, deadline=t0 + seconds)
    elif method == "policy":
        policy, info = train_policy(problem.n_antennas, problem.k, P, steps=train_steps, seconds=seconds,
                                    seed=seed, noise=problem.noise)
        t1 = time.perf_counter()
        W = policy.act(H)
        info["inference_ms"] = 1e3 * (time.perf_counter() - t1)
    else:
        raise UserError(f"unknown method {method!r} for mimo; choose one of: corral, wmmse, zf, mmse, policy")
    solution = problem.export(W[0])
    value = problem.check(solution)
    spent = round(time.perf_counter() - t0, 3)
    return Result(problem="mimo", instance=problem.name, method=method, sense="max", value=value,
                  solution=solution, seconds=spent, time_to_best=spent, history=[(spent, value)], info=info)
