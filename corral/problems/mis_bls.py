"""Maximum independent set by breakout local search on an equivalent MaxCut instance.

An independent set maximizes ``f(x) = sum_i x_i - 2 * sum_{(i, j) in E} x_i x_j`` over 0/1 vectors:
a set with an edge inside gains at least 1 when one end of that edge leaves, so ``f``'s maximum is
the independence number and is reached at independent sets. ``f`` is a quadratic function of
``x``, so it is a cut: with an apex node ``a`` and ``x_i = 1`` where node ``i`` is on the other side
from ``a``, ``f(x) = cut(x)`` exactly on the graph with the original edges at weight 1 and an edge
``a - i`` of weight ``1 - deg(i)`` for every node (derivation: ``x_i = (1 - s_a s_i) / 2`` in
``f``, and a cut term ``w_uv (1 - s_u s_v) / 2`` per edge; both are 0 at the empty set).

:func:`bls_mis` runs :mod:`corral.problems.maxcut_bls`'s search (the compiled engine: the weights
are integers) on that graph; a flip adds a node to the set or takes it out, and the tabu
rule, perturbations and break-outs act on sets. The best cut's set is made independent (one end of
any edge inside leaves, which keeps the size >= the cut) and filled with free nodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from corral.problems.base import Result, Tracker
from corral.problems.graphs import Graph
from corral.problems.mis import IndependentSet


def apex_graph(problem: IndependentSet) -> Graph:
    """The MaxCut graph whose cut equals ``f`` (see the module's docstring): node ``n`` is the apex."""
    n = problem.n
    u, v = problem.u.cpu(), problem.v.cpu()
    deg = torch.bincount(torch.cat([u, v]), minlength=n)
    nodes = torch.arange(n)
    apex = torch.full((n,), n, dtype=torch.long)
    uu = torch.cat([u, nodes])
    vv = torch.cat([v, apex])
    w = torch.cat([torch.ones(u.numel()), (1 - deg).float()])
    keep = w != 0
    return Graph(n + 1, uu[keep], vv[keep], w[keep], f"{problem.name}+apex")


def set_of(assignment: torch.Tensor) -> torch.Tensor:
    """The set of a cut's 0/1 assignment ``[n + 1]``: nodes on the other side from the apex."""
    a = assignment.to(torch.bool)
    return a[:-1] != a[-1]


def bls_mis(problem: IndependentSet, seconds: float = 30.0, seed: int = 0, batch: int = 8,
            stop_at: float | None = None, progress: Callable[[dict], None] | None = None,
            tenure: tuple[int, int] | None = None) -> Result:
    """Search ``problem`` (mis, or vc through its complement) with breakout local search for about
    ``seconds``; stop at ``stop_at`` (in the problem's own terms) or at a planted optimum.

    ``tenure``: the tabu tenure range of every search, default ``(max(3, n / 45), max(6, n / 15))``
    (10 to 30 steps on the 450-node rb-small graphs, where MaxCut's default ``[3 or n / 20, n / 10]``
    left rb:30:15:0 at 29 and ``(10, 30)`` reached the planted 30 on rb:30:15:1 in 2.8 CPU-seconds)."""
    from corral.problems.maxcut_bls import make_search

    t0 = time.perf_counter()
    target = stop_at if stop_at is not None else problem.optimum
    if target is not None and problem.cover:  # the search counts set sizes; a cover of c is a set of n - c
        target = problem.n - target
    tracker = Tracker("max")
    n = problem.n
    tenure = tenure or (max(3, n // 45), max(6, n // 15))
    search = make_search(apex_graph(problem), max(1, batch), seed=seed, tenure=tenure)

    def on_best(cut: float) -> None:  # a cut below 0 is a set with edges inside: not recorded
        if cut >= 0 and tracker.seen(cut, time.perf_counter() - t0) and progress is not None:
            progress({"seconds": round(time.perf_counter() - t0, 3), "value": problem.value_of_score(cut),
                      "phase": "bls", "samples": search.moves})

    search.run(t0 + seconds, stop_at=target, on_best=on_best)
    cut, x = search.best()
    s = set_of(x).unsqueeze(0).to(problem.device)
    s = problem.insert_free(s & ~_one_end_of_each_edge(problem, s))[0]
    size = float(s.sum())
    tracker.seen(size, time.perf_counter() - t0)
    return problem.result("bls", s.cpu().numpy(), time.perf_counter() - t0, tracker,
                          info={"moves": search.moves, "best_cut": cut, "engine": type(search).__name__})


def _one_end_of_each_edge(problem: IndependentSet, s: torch.Tensor) -> torch.Tensor:
    """Nodes to drop from ``s [1, n]`` so that no edge stays inside: greedily, the node of the most
    inside edges first (each drop removes all its inside edges)."""
    s = s.clone()
    drop = torch.zeros_like(s)
    while True:
        inside = problem.tight(s) * s  # inside edges per set node
        if not bool((inside > 0).any()):
            return drop
        i = int(inside.argmax())
        s[0, i] = False
        drop[0, i] = True
