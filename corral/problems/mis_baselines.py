"""Baselines for maximum independent set / minimum vertex cover (:mod:`corral.problems.mis`), not
learned, for comparison in the same run: :func:`greedy_min_degree`, :func:`networkx_maximal`
(networkx's random maximal independent set), :func:`arw_ils` (Andrade-Resende-Werneck iterated
local search with (1,2)-swaps, in plain Python) and :func:`exact_milp` (HiGHS through
``scipy.optimize.milp``, for small instances)."""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

import numpy as np

from corral.problems.base import Result, Tracker

if TYPE_CHECKING:
    from corral.problems.mis import IndependentSet

def greedy_min_degree(problem: IndependentSet) -> Result:
    """Classic greedy: repeatedly take a node of least degree in the remaining graph, drop its
    neighbours."""
    t0 = time.perf_counter()
    adj = [set(a) for a in problem.adjacency_lists()]
    alive = set(range(problem.n))
    deg = {i: len(adj[i]) for i in alive}
    import heapq

    heap = [(d, i) for i, d in deg.items()]
    heapq.heapify(heap)
    chosen = np.zeros(problem.n, dtype=bool)
    while heap:
        d, i = heapq.heappop(heap)
        if i not in alive or d != deg[i]:
            continue
        chosen[i] = True
        gone = {i} | (adj[i] & alive)
        alive -= gone
        touched = set()
        for j in gone:
            for k in adj[j]:
                if k in alive:
                    deg[k] -= 1
                    touched.add(k)
        for k in touched:
            heapq.heappush(heap, (deg[k], k))
    tr = Tracker()
    tr.seen(float(chosen.sum()), time.perf_counter() - t0)
    return problem.result("greedy", chosen, time.perf_counter() - t0, tr)


def networkx_maximal(problem: IndependentSet, seconds: float = 0.0, seed: int = 0) -> Result:
    """networkx's ``maximal_independent_set`` (a random maximal set), repeated with new seeds
    for ``seconds`` (at least once); the largest is kept."""
    import networkx as nx

    t0 = time.perf_counter()
    g = nx.Graph()
    g.add_nodes_from(range(problem.n))
    g.add_edges_from(zip(problem.u.tolist(), problem.v.tolist()))
    tr, best, i = Tracker(), None, 0
    while best is None or time.perf_counter() - t0 < seconds:
        s = nx.maximal_independent_set(g, seed=seed + i)
        i += 1
        if best is None or len(s) > len(best):
            best = s
            tr.seen(float(len(s)), time.perf_counter() - t0)
    mask = np.zeros(problem.n, dtype=bool)
    mask[list(best)] = True
    return problem.result("networkx", mask, time.perf_counter() - t0, tr, {"draws": i})


def _arw_moves(adj: list[list[int]], insol: list[bool], tight: list[int], rng: random.Random):
    """ARW's moves on the set ``insol`` and the tightness ``tight`` (both changed in place):
    ``add``, ``remove``, ``fill`` (free candidates in, in random order) and ``local_search``
    ((1,2)-swaps from a queue of set nodes until none is left)."""
    adjset = [set(a) for a in adj]

    def add(v):
        insol[v] = True
        for w in adj[v]:
            tight[w] += 1

    def remove(v):
        insol[v] = False
        for w in adj[v]:
            tight[w] -= 1

    def fill(candidates):
        cand = [v for v in candidates if not insol[v] and tight[v] == 0]
        rng.shuffle(cand)
        for v in cand:
            if not insol[v] and tight[v] == 0:
                add(v)

    def one_tight(v):
        return [w for w in adj[v] if not insol[w] and tight[w] == 1]

    def local_search(queue):
        queue = list(dict.fromkeys(queue))
        while queue:
            v = queue.pop()
            if not insol[v]:
                continue
            L = one_tight(v)
            if len(L) < 2:
                continue
            rng.shuffle(L)
            done = False
            for i, a in enumerate(L):
                na = adjset[a]
                for b in L[i + 1:]:
                    if b not in na:
                        remove(v)
                        add(a)
                        add(b)
                        rest = [w for w in L if w not in (a, b) and tight[w] == 0]
                        fill(rest)
                        # new swap chances: the new set nodes and the set neighbours of v's area
                        queue.extend([a, b] + rest)
                        for w in adj[a] + adj[b]:
                            if not insol[w] and tight[w] == 1:
                                queue.extend(x for x in adj[w] if insol[x])
                        done = True
                        break
                if done:
                    break

    return add, remove, fill, local_search


def arw_ils(problem: IndependentSet, seconds: float = 10.0, seed: int = 0, stop_at: float | None = None,
            max_iters: int | None = None) -> Result:
    """Iterated local search of Andrade, Resende and Werneck (2012), in plain Python.

    Local search: (1,2)-swaps (a set node leaves, two non-adjacent neighbours whose only set
    neighbour it was come in) until none is left. Perturbation: force one node out of the set
    (usually; sometimes i + 1 with probability 1/2^i), preferring nodes out of the set the
    longest, drop its set neighbours, refill free nodes at random, climb. Acceptance: a
    solution no worse is taken; one worse by d, ``gap`` below the best, with probability
    1 / (1 + d * gap). The best set is kept. ``stop_at``: stop on reaching that set size.
    """
    t0 = time.perf_counter()
    rng = random.Random(seed)
    n = problem.n
    adj = problem.adjacency_lists()
    insol = [False] * n
    tight = [0] * n
    age = [0] * n  # iteration when a node last left or entered
    add, remove, fill, local_search = _arw_moves(adj, insol, tight, rng)

    order = list(range(n))
    rng.shuffle(order)
    fill(order)
    local_search([v for v in range(n) if insol[v]])
    size = sum(insol)
    best, best_mask = size, insol[:]
    tr = Tracker()
    tr.seen(float(best), time.perf_counter() - t0)
    it = 0
    while time.perf_counter() - t0 < seconds and (stop_at is None or best < stop_at) \
            and (max_iters is None or it < max_iters):
        it += 1
        saved = insol[:]
        saved_size = size
        k = 1
        while rng.random() < 0.5 / k and k < 4:
            k += 1
        outside = [v for v in rng.sample(range(n), min(n, 4 * k)) if not insol[v]] or [v for v in range(n) if not insol[v]]
        if not outside:
            break
        outside.sort(key=lambda v: age[v])
        forced = outside[:k]
        touched = []
        for v in forced:
            if insol[v]:
                continue
            for w in adj[v]:
                if insol[w]:
                    remove(w)
                    age[w] = it
                    touched.append(w)
            add(v)
            age[v] = it
        area = list({x for w in touched for x in adj[w]})
        fill(area)
        # swap chances: the set nodes in the area and the only set neighbour of each 1-tight node there
        queue = forced + [x for x in area if insol[x]]
        for w in area:
            if not insol[w] and tight[w] == 1:
                queue.extend(x for x in adj[w] if insol[x])
        local_search(queue)
        size = sum(insol)
        if size > best:
            best, best_mask = size, insol[:]
            tr.seen(float(best), time.perf_counter() - t0)
        elif size < saved_size:
            d, gap = saved_size - size, best - size
            if rng.random() >= 1.0 / (1.0 + d * gap):
                # undo: back to the saved set
                for v in range(n):
                    if insol[v] != saved[v]:
                        (add if saved[v] else remove)(v)
                size = saved_size
    return problem.result("arw", best_mask, time.perf_counter() - t0, tr, {"iterations": it})


def clique_cover(problem: IndependentSet) -> list[list[int]]:
    """Cliques that hold every edge: from each edge not yet covered, grow a clique greedily by
    common neighbours, preferring those that cover more uncovered edges of it."""
    adj = [set(a) for a in problem.adjacency_lists()]
    uncovered = [set(a) for a in adj]
    cliques = []
    for a in range(problem.n):
        while uncovered[a]:
            b = next(iter(uncovered[a]))
            clique = [a, b]
            common = adj[a] & adj[b]
            while common:
                c = max(common, key=lambda x: sum(1 for y in clique if y in uncovered[x]))
                clique.append(c)
                common &= adj[c]
            for i, x in enumerate(clique):
                for y in clique[i + 1:]:
                    uncovered[x].discard(y)
                    uncovered[y].discard(x)
            cliques.append(clique)
    return cliques or [[0]]


def node_cliques(problem: IndependentSet) -> list[list[int]]:
    """A maximal clique through every node (duplicates dropped), grown greedily from the node: the
    candidate with the most neighbours among the candidates joins, the candidates shrink to its
    neighbours. Their at-most-one rows tighten the bound beyond :func:`clique_cover`'s (on the
    rb-small graphs they hold each variable's clique, whose rows alone bound the set by the planted
    size)."""
    adj = [set(a) for a in problem.adjacency_lists()]
    seen, cliques = set(), []
    for v in range(problem.n):
        clique, cand = [v], set(adj[v])
        while cand:
            c = max(cand, key=lambda x: (len(adj[x] & cand), -x))
            clique.append(c)
            cand &= adj[c]
        key = tuple(sorted(clique))
        if len(key) > 1 and key not in seen:
            seen.add(key)
            cliques.append(list(key))
    return cliques


def exact_milp(problem: IndependentSet, seconds: float = 60.0) -> Result:
    """The exact optimum by integer programming (HiGHS via ``scipy.optimize.milp``): maximize
    ``sum x`` s.t. ``sum_{v in C} x_v <= 1`` for the cliques C of :func:`clique_cover` (every edge
    is in one; stronger than one row per edge), within ``seconds``. ``info["proven"]`` says
    whether HiGHS proved optimality; ``info["bound"]`` is its upper bound on the set size."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    t0 = time.perf_counter()
    n = problem.n
    cliques = clique_cover(problem)
    rows = np.concatenate([np.full(len(c), i) for i, c in enumerate(cliques)])
    cols = np.concatenate([np.asarray(c) for c in cliques])
    a = coo_matrix((np.ones(rows.size), (rows, cols)), shape=(len(cliques), n)).tocsr()
    res = milp(c=-np.ones(n), constraints=[LinearConstraint(a, -np.inf, 1.0)], integrality=np.ones(n),
               bounds=Bounds(0, 1), options={"time_limit": float(seconds), "disp": False})
    if res.x is None:
        mask = np.zeros(n, dtype=bool)
    else:
        mask = res.x > 0.5
    tr = Tracker()
    tr.seen(float(mask.sum()), time.perf_counter() - t0)
    bound = getattr(res, "mip_dual_bound", None)
    proven = res.status == 0
    info = {"proven": bool(proven), "bound": float(-bound) if bound is not None else None, "status": res.message}
    return problem.result("exact", mask, time.perf_counter() - t0, tr, info)


def exact_cpsat(problem: IndependentSet, seconds: float = 60.0, seed: int = 0, workers: int = 1) -> Result:
    """The exact optimum with OR-Tools CP-SAT (the ``cpsat`` extra: ``pip install ortools``): one
    Boolean per node, an at-most-one per clique of :func:`clique_cover` and of :func:`node_cliques`
    (CP-SAT's presolve merges them further), maximize the count, within ``seconds`` on ``workers`` search workers
    (1: one core). ``info["proven"]``: CP-SAT proved the optimum; ``info["bound"]``: its upper bound
    on the set size."""
    try:
        from ortools.sat.python import cp_model
    except ImportError as e:  # an optional extra
        from corral.errors import UserError

        raise UserError("method cpsat needs OR-Tools: pip install 'corral[cpsat]' (or pip install ortools)") from e
    t0 = time.perf_counter()
    model = cp_model.CpModel()
    x = [model.NewBoolVar(f"x{i}") for i in range(problem.n)]
    for c in clique_cover(problem) + node_cliques(problem):
        if len(c) > 1:
            model.AddAtMostOne(x[i] for i in c)
    model.Maximize(sum(x))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, float(seconds) - (time.perf_counter() - t0))
    solver.parameters.num_search_workers = max(1, int(workers))
    solver.parameters.random_seed = int(seed)
    status = solver.Solve(model)
    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    mask = np.array([bool(solver.Value(v)) for v in x]) if found else np.zeros(problem.n, dtype=bool)
    tr = Tracker()
    tr.seen(float(mask.sum()), time.perf_counter() - t0)
    info = {"proven": status == cp_model.OPTIMAL, "bound": float(solver.BestObjectiveBound()),
            "status": solver.StatusName(status), "workers": int(workers)}
    return problem.result("cpsat", mask, time.perf_counter() - t0, tr, info)
