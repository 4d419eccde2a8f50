"""The problems ``corral solve`` knows, how an instance is named, and one ``solve`` for all.

    problem, result = solve("mis", "rb:30:15:0", seconds=10)       # Model RB, planted optimum 30
    problem, result = solve("maxcut", "G14.txt", seconds=60)        # MaxCut's PPO solver
    result.check(problem)                                           # recompute from the solution

An instance is a graph file or a generator spec: ``er:N:P[:SEED]`` (Erdos-Renyi) for every
problem, ``rb:N:D[:SEED[:P]]`` (Model RB with a planted optimum) for mis / vc, a channel
``rayleigh:N=8,K=8,snr=10,seed=0`` for mimo (:mod:`corral.problems.mimo`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from corral.errors import UserError
from corral.problems.base import Problem, Result

PROBLEMS = {
    "maxcut": "maximum cut of a weighted graph",
    "mis": "maximum independent set",
    "vc": "minimum vertex cover (the complement of an independent set)",
    "mimo": "MIMO downlink beamforming (sum rate under a total power budget)",
}
METHODS = {
    "maxcut": ("ppo", "random", "greedy", "tabu", "bls", "mcpg"),
    "mis": ("mcpg", "arw", "bls", "greedy", "networkx", "exact", "cpsat"),
    "vc": ("mcpg", "arw", "bls", "greedy", "networkx", "exact", "cpsat"),
    "mimo": ("corral", "wmmse", "zf", "mmse", "policy"),
}
DEFAULT_METHOD = {"maxcut": "ppo", "mis": "mcpg", "vc": "mcpg", "mimo": "corral"}


def check_problem(kind: str) -> str:
    if kind not in PROBLEMS:
        raise UserError(f"unknown problem {kind!r}; choose one of: {', '.join(PROBLEMS)}")
    return kind


def check_method(kind: str, method: str | None) -> str:
    method = method or DEFAULT_METHOD[kind]
    if method not in METHODS[kind]:
        raise UserError(f"unknown method {method!r} for {kind}; choose one of: {', '.join(METHODS[kind])}")
    return method


def load_problem(kind: str, instance: str, device: str | torch.device = "cpu") -> Problem:
    """The problem ``kind`` on ``instance`` (a graph file or a generator spec)."""
    check_problem(kind)
    if kind == "mimo":
        from corral.problems.mimo import load_mimo

        return load_mimo(instance)
    if kind == "maxcut":
        from corral.problems.graphs import erdos_renyi, read_gset
        from corral.problems.maxcut_solver import MaxCutProblem

        if instance.startswith("er:"):
            parts = instance.split(":")[1:]
            try:
                if len(parts) not in (2, 3):
                    raise ValueError
                graph = erdos_renyi(int(parts[0]), float(parts[1]), int(parts[2]) if len(parts) > 2 else 0)
            except ValueError:
                raise UserError(f"instance {instance!r} is not a generator spec; use er:N:P[:SEED] "
                                "or a Gset graph file") from None
        else:
            graph = read_gset(instance)
        return MaxCutProblem(graph, device=device)
    from corral.problems.mis import IndependentSet, load_graph

    graph, planted = load_graph(instance)
    return IndependentSet(graph, cover=kind == "vc", planted=planted, device=device)


def solve(kind: str, instance: str | Problem, seconds: float = 30.0, method: str | None = None, seed: int = 0,
          device: str | torch.device = "cpu", batch: int = 32, progress: Callable[[dict], None] | None = None,
          **options) -> tuple[Problem, Result]:
    """Solve ``instance`` with ``method`` for about ``seconds``; returns ``(problem, result)``.
    The result's solution has been checked against the instance (``problem.check``)."""
    check_problem(kind)
    method = check_method(kind, method)
    if not seconds > 0:
        raise UserError(f"the time limit must be positive, got {seconds}")
    if batch < 1:
        raise UserError(f"the number of envs (chains) must be >= 1, got {batch}")
    problem = instance if isinstance(instance, Problem) else load_problem(kind, instance, device)
    if kind == "mimo":
        from corral.problems.mimo_solve import solve_mimo

        result = solve_mimo(problem, seconds, method, seed=seed, batch=batch, **options)
    elif method == "mcpg":
        from corral.problems.search import mcpg

        result = mcpg(problem, seconds, seed=seed, batch=max(2, batch), progress=progress, **options)
    elif kind == "maxcut":
        result = _solve_maxcut(problem, seconds, method, seed, device, batch, progress, **options)
    else:
        from corral.problems import mis

        if method == "bls":
            from corral.problems.mis_bls import bls_mis

            result = bls_mis(problem, seconds, seed=seed, batch=batch, progress=progress, **options)
        elif method == "arw":
            result = mis.arw_ils(problem, seconds, seed=seed, **{"stop_at": problem.optimum, **options})
        elif method == "greedy":
            result = mis.greedy_min_degree(problem)
        elif method == "networkx":
            result = mis.networkx_maximal(problem, seconds, seed=seed)
        elif method == "cpsat":
            result = mis.exact_cpsat(problem, seconds, seed=seed, **options)
        else:
            result = mis.exact_milp(problem, seconds)
    result.check(problem)
    return problem, result


def _solve_maxcut(problem, seconds, method, seed, device, batch, progress, **options) -> Result:
    """MaxCut's own solver (``solve_maxcut``: PPO, random, greedy, tabu, bls) as a :class:`Result`."""
    from corral.problems.maxcut_solver import solve_maxcut

    def relay(rec: dict) -> None:
        if progress is not None:
            progress({"seconds": rec["seconds"], "value": rec["cut"], "phase": rec["phase"], "flips": rec["flips"]})

    r = solve_maxcut(problem.graph, time_limit=seconds, num_envs=batch, seed=seed, device=device, method=method,
                     progress=relay, **options)
    history = list(r["history"])
    if not history or history[-1][1] < r["cut"]:
        history.append((r["seconds"], r["cut"]))
    first = next((t for t, c in history if c >= r["cut"]), None)
    return Result(problem="maxcut", instance=problem.name, method=method, sense="max", value=r["cut"],
                  solution=r["assignment"], seconds=r["seconds"], time_to_best=first, history=history,
                  info={"flips": r["flips"], "updates": r["updates"], "train_seconds": r["train_seconds"],
                        "nodes": r["nodes"], "edges": r["edges"], "policy": r["policy"]})
