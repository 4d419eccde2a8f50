"""MIS / vertex cover by breakout local search on the apex MaxCut graph (method "bls"): the cut is the
penalized set size for every assignment, the search finds brute-force optima and planted ones, and
what it returns is always an independent set (or a cover)."""

import itertools

import torch

from corral.problems import cut_value, erdos_renyi, solve
from corral.problems.graphs import from_edges
from corral.problems.mis import IndependentSet, load_graph
from corral.problems.mis_bls import apex_graph, bls_mis, set_of


def brute_force_mis(problem) -> int:
    edges = list(zip(problem.u.tolist(), problem.v.tolist()))
    return max(sum(bits) for bits in itertools.product([0, 1], repeat=problem.n)
               if all(not (bits[a] and bits[b]) for a, b in edges))


def test_the_apex_cut_is_the_set_size_minus_twice_its_inside_edges_for_every_assignment():
    g = erdos_renyi(8, 0.4, seed=3)
    problem = IndependentSet(g)
    apex = apex_graph(problem)
    edges = list(zip(problem.u.tolist(), problem.v.tolist()))
    for bits in itertools.product([0, 1], repeat=g.n + 1):  # the apex on either side
        x = torch.tensor(bits)
        s = set_of(x).tolist()
        f = sum(s) - 2 * sum(s[a] and s[b] for a, b in edges)
        assert cut_value(apex, x).item() == f


def test_bls_finds_the_brute_force_independence_number_and_returns_independent_sets():
    for seed in range(3):
        problem = IndependentSet(erdos_renyi(14, 0.3, seed=20 + seed))
        best = brute_force_mis(problem)
        r = bls_mis(problem, seconds=5.0, seed=seed, batch=4, stop_at=best)
        assert r.value == best == r.check(problem)


def test_bls_reaches_a_planted_model_rb_optimum_and_covers_through_the_complement():
    _, r = solve("mis", "rb:20:10:0", seconds=20, method="bls", batch=8)  # stops at the planted 20
    assert r.value == r.optimum == 20
    g, planted = load_graph("rb:20:10:0")
    _, c = solve("vc", "rb:20:10:0", seconds=20, method="bls", batch=8)
    assert c.value == c.optimum == g.n - 20
    assert c.check(IndependentSet(g, cover=True, planted=planted)) == g.n - 20


def test_a_set_with_edges_inside_is_repaired_to_an_independent_set_no_smaller_than_its_cut():
    # a triangle and a pendant: every search result is checked, even after a 1-step budget
    g = from_edges(4, [(0, 1), (1, 2), (0, 2), (2, 3)], name="tri+1")
    problem = IndependentSet(g)
    r = bls_mis(problem, seconds=1e-6, seed=0, batch=2)
    assert r.check(problem) == r.value >= 1
