"""MaxCut's exact reductions (corral/problems/reduce.py): hand-worked rules, brute force on random
small graphs with leaves, chains and isolated nodes (the reduced optimum plus the constant is the
original optimum; lifting keeps the cut), G70's reduced size, and the solvers through them."""

import random
from pathlib import Path

import pytest
import torch

from corral.problems import MaxCutProblem, brute_force_maxcut, cut_value, from_edges, mcpg, read_gset, solve_maxcut
from corral.problems.reduce import reduce_maxcut

GSET = Path("/work/shared/data/gset")


def optimum(graph) -> float:
    return 0.0 if graph.n == 0 else brute_force_maxcut(graph)[0]


def structured_graph(seed: int, n_max: int = 14):
    """A random signed core plus pendant leaves, paths of degree-2 nodes (some closing cycles)
    and isolated nodes: every rule fires, weights +-1, at most ``n_max`` nodes."""
    rng = random.Random(seed)
    core = rng.randint(4, 7)
    edges = [(a, b, rng.choice((1.0, -1.0))) for a in range(core) for b in range(a + 1, core) if rng.random() < 0.8]
    n = core
    while n < n_max - 1:
        kind = rng.random()
        if kind < 0.3:  # a leaf on any node so far
            edges.append((rng.randrange(n), n, rng.choice((1.0, -1.0))))
            n += 1
        elif kind < 0.9:  # a path of 1-3 new nodes from one node, closed onto another (or left hanging)
            length = min(rng.randint(1, 3), n_max - 1 - n)
            prev = rng.randrange(n)
            for _ in range(length):
                edges.append((prev, n, rng.choice((1.0, -1.0))))
                prev, n = n, n + 1
            if rng.random() < 0.7:
                end = rng.randrange(n - length)
                edges.append((prev, end, rng.choice((1.0, -1.0))))
        else:
            n += 1  # isolated
    return from_edges(n, edges, name=f"structured{seed}")


def test_a_unit_path_becomes_a_negative_edge_plus_two():
    # u=0 - v=1 - w=2, u and w also in a K5 (their edge 0-2 +1 meets the chain's -1: dropped)
    core = (0, 2, 3, 4, 5)
    k5 = [(a, b) for a in core for b in core if a < b]
    red = reduce_maxcut(from_edges(6, [(0, 1), (1, 2)] + k5))
    assert red.kept.tolist() == [0, 2, 3, 4, 5] and red.constant == 2.0
    assert red.reduced.m == 9 and bool((red.reduced.w == 1).all())
    assert (0, 1) not in set(zip(red.reduced.u.tolist(), red.reduced.v.tolist()))
    # without the 0-2 edge the chain's edge stays, weight -1
    red = reduce_maxcut(from_edges(6, [(0, 1), (1, 2)] + [e for e in k5 if e != (0, 2)]))
    edges = {(a, b): c for a, b, c in zip(red.reduced.u.tolist(), red.reduced.v.tolist(), red.reduced.w.tolist())}
    assert red.constant == 2.0 and edges[(0, 1)] == -1.0


def test_leaves_and_trees_reduce_to_their_positive_weight():
    tree = from_edges(6, [(0, 1, 1.0), (1, 2, -1.0), (1, 3, 2.0), (3, 4, 1.0), (3, 5, -3.0)])
    red = reduce_maxcut(tree)
    assert red.reduced.n == 0 and red.constant == 4.0 == optimum(tree)
    x = red.lift(torch.zeros(0))
    assert cut_value(tree, x).item() == 4.0
    triangle = from_edges(3, [(0, 1), (1, 2), (0, 2)])
    assert reduce_maxcut(triangle).constant == 2.0 and reduce_maxcut(triangle).reduced.n == 0


@pytest.mark.parametrize("seed", range(40))
def test_reductions_keep_the_optimum_and_lifting_keeps_the_cut(seed):
    g = structured_graph(seed)
    red = reduce_maxcut(g)
    assert red.reduced.n < g.n  # leaves, chains or isolated nodes were removed
    assert bool((torch.bincount(torch.cat([red.reduced.u, red.reduced.v]), minlength=red.reduced.n) >= 3).all())
    assert optimum(red.reduced) + red.constant == optimum(g)
    gen = torch.Generator().manual_seed(seed)
    for x in torch.randint(0, 2, (8, red.reduced.n), generator=gen):
        lifted = red.lift(x)
        assert lifted.shape == (g.n,) and set(lifted.tolist()) <= {0, 1}
        assert torch.equal(lifted[red.kept], x.to(torch.int8))
        assert cut_value(g, lifted).item() == cut_value(red.reduced, x).item() + red.constant
    if red.reduced.n:
        _, best_x = brute_force_maxcut(red.reduced)
        assert cut_value(g, red.lift(best_x)).item() == optimum(g)


def test_lift_refuses_a_wrong_size():
    red = reduce_maxcut(structured_graph(0))
    with pytest.raises(ValueError, match="reduced graph has"):
        red.lift(torch.zeros(red.reduced.n + 1))


@pytest.mark.skipif(not (GSET / "G70.txt").is_file(), reason="Gset data not here")
def test_g70_reduces_to_about_a_fifth():
    g = read_gset(GSET / "G70.txt")
    red = reduce_maxcut(g)
    assert (red.reduced.n, red.reduced.m, red.constant) == (2164, 3760, 7363.0)
    x = torch.randint(0, 2, (red.reduced.n,), generator=torch.Generator().manual_seed(0))
    assert cut_value(g, red.lift(x)).item() == cut_value(red.reduced, x).item() + red.constant


@pytest.mark.parametrize("method", ["tabu", "greedy"])
def test_solve_maxcut_through_the_reductions_reaches_the_optimum(method):
    g = structured_graph(3, n_max=14)
    best = optimum(g)
    r = solve_maxcut(g, time_limit=1.0, num_envs=4, seed=0, method=method)
    assert r["cut"] == best == cut_value(g, r["assignment"]).item()
    assert r["nodes"] == g.n and r["reduced_nodes"] < g.n and r["history"][-1][1] == best
    plain = solve_maxcut(g, time_limit=1.0, num_envs=4, seed=0, method=method, reduce=False)
    assert plain["cut"] == best and "reduced_nodes" not in plain


def test_mcpg_searches_the_reduced_graph_and_exports_the_original_cut():
    g = structured_graph(5, n_max=14)
    best = optimum(g)
    problem = MaxCutProblem(g)
    assert problem.n < g.n and problem.describe()["nodes"] == g.n
    r = mcpg(problem, seconds=5, seed=0, stop_at=best)
    assert r.value == best and r.solution.shape == (g.n,) and r.check(problem) == best
    assert MaxCutProblem(g, reduce=False).n == g.n
