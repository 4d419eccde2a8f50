"""Combinatorial problems as batched RL environments, and solvers built on corral's RL pieces.

MaxCut: :class:`~corral.problems.maxcut.MaxCutEnv` (flip one node per step, reward = change
of the cut, best cut tracked on device) and :func:`~corral.problems.maxcut_solver.solve_maxcut`
(PPO-trained node policy, random-flip and greedy baselines). Graphs come from Gset files or
the Erdos-Renyi / Barabasi-Albert generators in :mod:`corral.problems.graphs`.

Every problem shares one interface (:mod:`corral.problems.base`: batched objective, feasibility,
repair, local search, and a :class:`~corral.problems.base.Result` that is checked against the
instance), one search loop (:func:`~corral.problems.search.mcpg`: policy-gradient mean-field
sampling, local search, elite restarts) and one entry point
(:func:`~corral.problems.registry.solve`, ``corral solve PROBLEM INSTANCE``). Problems: maxcut,
mis / vc (:mod:`corral.problems.mis`).
"""

from corral.problems.base import InfeasibleSolution, Problem, Result
from corral.problems.graphs import Graph, barabasi_albert, erdos_renyi, from_edges, read_gset, write_gset
from corral.problems.maxcut import FEATURES, MaxCutEnv, brute_force_maxcut, cut_value
from corral.problems.maxcut_solver import MaxCutProblem, NodePolicy, local_search, solve_maxcut
from corral.problems.registry import load_problem, solve
from corral.problems.search import mcpg

__all__ = [
    "FEATURES",
    "Graph",
    "InfeasibleSolution",
    "MaxCutEnv",
    "MaxCutProblem",
    "NodePolicy",
    "Problem",
    "Result",
    "barabasi_albert",
    "brute_force_maxcut",
    "cut_value",
    "erdos_renyi",
    "from_edges",
    "load_problem",
    "local_search",
    "mcpg",
    "read_gset",
    "solve",
    "solve_maxcut",
    "write_gset",
]
