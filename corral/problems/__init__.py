"""Combinatorial problems as batched RL environments, and solvers built on corral's RL pieces.

MaxCut: :class:`~corral.problems.maxcut.MaxCutEnv` (flip one node per step, reward = change
of the cut, best cut tracked on device) and :func:`~corral.problems.maxcut_solver.solve_maxcut`
(PPO-trained node policy, random-flip and greedy baselines). Graphs come from Gset files or
the Erdos-Renyi / Barabasi-Albert generators in :mod:`corral.problems.graphs`.
"""

from corral.problems.graphs import Graph, barabasi_albert, erdos_renyi, from_edges, read_gset, write_gset
from corral.problems.maxcut import FEATURES, MaxCutEnv, brute_force_maxcut, cut_value
from corral.problems.maxcut_solver import NodePolicy, local_search, solve_maxcut

__all__ = [
    "FEATURES",
    "Graph",
    "MaxCutEnv",
    "NodePolicy",
    "barabasi_albert",
    "brute_force_maxcut",
    "cut_value",
    "erdos_renyi",
    "from_edges",
    "local_search",
    "read_gset",
    "solve_maxcut",
    "write_gset",
]
