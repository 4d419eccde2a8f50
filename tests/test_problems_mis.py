"""Maximum independent set / minimum vertex cover and the shared problem interface: values and
feasibility on hand-worked graphs, the planted Model RB solution, cover = complement, the check
that recomputes a value from the solution alone, repair and local search, the solver reaching a
known optimum, the baselines, MaxCut through the same interface, and `corral solve`."""

import argparse
import itertools
import json

import pytest
import torch

from corral.cli import main as corral_main
from corral.errors import UserError
from corral.problems import InfeasibleSolution, MaxCutProblem, brute_force_maxcut, erdos_renyi, mcpg, solve
from corral.problems.graphs import from_edges
from corral.problems.mis import (
    IndependentSet,
    arw_ils,
    clique_cover,
    erdos_renyi_mis,
    exact_milp,
    greedy_min_degree,
    load_graph,
    model_rb,
    networkx_maximal,
    node_cliques,
    read_graph,
)
from corral.solve import add_solve_parser, read_assignment

PATH4 = from_edges(4, [(0, 1), (1, 2), (2, 3)], name="path4")
TRIANGLE = from_edges(3, [(0, 1), (1, 2), (0, 2)], name="triangle")
STAR = from_edges(5, [(0, 1), (0, 2), (0, 3), (0, 4)], name="star")


def brute_force_mis(graph) -> int:
    edges = list(zip(graph.u.tolist(), graph.v.tolist()))
    best = 0
    for bits in itertools.product([0, 1], repeat=graph.n):
        if all(not (bits[a] and bits[b]) for a, b in edges):
            best = max(best, sum(bits))
    return best


def rows(*sets, n):
    x = torch.zeros(len(sets), n, dtype=torch.bool)
    for i, s in enumerate(sets):
        x[i, list(s)] = True
    return x


# ---------------------------------------------------------------------------------- known answers


def test_feasibility_and_size_on_hand_worked_graphs():
    p = IndependentSet(PATH4)
    x = rows({0, 2}, {0, 3}, {1, 3}, {0, 1}, {1, 2, 3}, set(), n=4)
    assert p.feasible(x).tolist() == [True, True, True, False, False, True]
    assert p.score(x).tolist() == [2, 2, 2, 2, 3, 0]
    t = IndependentSet(TRIANGLE)
    assert t.feasible(rows({0}, {0, 1}, {2}, n=3)).tolist() == [True, False, True]


@pytest.mark.parametrize("graph, mis", [(PATH4, 2), (TRIANGLE, 1), (STAR, 4)])
def test_optimum_of_hand_worked_graphs_for_mis_vc_and_the_exact_solver(graph, mis):
    pytest.importorskip("scipy", reason="the exact solver needs scipy (the solve extra)")
    assert brute_force_mis(graph) == mis
    _, r = solve("mis", IndependentSet(graph), seconds=0.5, seed=0)
    assert r.value == mis
    _, c = solve("vc", IndependentSet(graph, cover=True), seconds=0.5, seed=0)
    assert c.value == graph.n - mis and c.sense == "min"
    e = exact_milp(IndependentSet(graph), seconds=10)
    assert e.value == mis and e.info["proven"]


def test_exact_solver_and_mcpg_agree_with_brute_force_on_random_graphs():
    pytest.importorskip("scipy", reason="the exact solver needs scipy (the solve extra)")
    for seed in range(3):
        g = erdos_renyi_mis(14, 0.3, seed=seed)
        best = brute_force_mis(g)
        assert exact_milp(IndependentSet(g), seconds=20).value == best
        assert mcpg(IndependentSet(g), seconds=3, seed=seed, stop_at=best).value == best


def test_cpsat_proves_the_brute_force_optimum_for_mis_and_vc():
    pytest.importorskip("ortools", reason="the cpsat method needs OR-Tools (the cpsat extra)")
    for seed in range(2):
        g = erdos_renyi_mis(12, 0.3, seed=seed)
        best = brute_force_mis(g)
        _, r = solve("mis", IndependentSet(g), seconds=10, method="cpsat")
        assert r.value == best and r.info["proven"] and r.info["bound"] == best
    _, c = solve("vc", "rb:6:3:0", seconds=10, method="cpsat")
    assert c.value == 18 - 6 and c.info["proven"]


def test_node_cliques_are_cliques_and_find_the_variable_cliques_of_model_rb():
    p = load_graph_problem("rb:30:15:0")  # rb-small's first graph: 30 cliques of 15 bound the set by 30
    adj = [set(a) for a in p.adjacency_lists()]
    cliques = node_cliques(p)
    assert all(b in adj[a] for c in cliques for a, b in itertools.combinations(c, 2))
    assert all(list(range(15 * i, 15 * i + 15)) in cliques for i in range(30))


def test_clique_cover_holds_every_edge_in_a_clique():
    p = IndependentSet(erdos_renyi_mis(40, 0.3, seed=1))
    adj = [set(a) for a in p.adjacency_lists()]
    covered = set()
    for c in clique_cover(p):
        for a, b in itertools.combinations(c, 2):
            assert b in adj[a]
            covered.add((min(a, b), max(a, b)))
    assert covered == set(zip(p.u.tolist(), p.v.tolist()))


def test_planted_model_rb_solution_is_independent_and_of_the_stated_size():
    for n, d, seed in [(10, 5, 0), (20, 8, 3), (30, 15, 1)]:
        g, planted = model_rb(n, d, seed=seed)
        assert g.n == n * d and planted.sum() == n
        p = IndependentSet(g, planted=planted)
        assert p.optimum == n
        assert p.check(planted.to(torch.int8)) == n
        # one node per variable (the d values of a variable are a clique)
        assert planted.view(n, d).sum(1).eq(1).all()
        assert not p.feasible(torch.ones(1, g.n, dtype=torch.bool)).item()
    a, b = model_rb(12, 6, seed=4)[0], model_rb(12, 6, seed=4)[0]
    assert torch.equal(a.u, b.u) and torch.equal(a.v, b.v)


def test_vertex_cover_is_the_complement_of_an_independent_set():
    g = erdos_renyi_mis(30, 0.2, seed=2)
    mis, vc = IndependentSet(g), IndependentSet(g, cover=True)
    gen = torch.Generator().manual_seed(0)
    x = mis.random(5, gen)
    for row in x:
        s = mis.export(row)
        c = vc.export(row)
        assert torch.equal(c, 1 - s)
        assert vc.check(c) == g.n - mis.check(s)
    _, r = solve("vc", vc, seconds=1, seed=0)
    assert mis.check(1 - r.solution) == g.n - r.value


# ---------------------------------------------------------------------------------- the check


def test_check_recomputes_the_value_and_catches_infeasible_solutions():
    mis, vc = IndependentSet(PATH4), IndependentSet(PATH4, cover=True)
    assert mis.check([1, 0, 1, 0]) == 2 and vc.check([0, 1, 0, 1]) == 2
    with pytest.raises(InfeasibleSolution, match="nodes 1 and 2 are both in it"):
        mis.check([1, 1, 0, 0])
    with pytest.raises(InfeasibleSolution, match=r"edge \(3, 4\) has neither end"):
        vc.check([0, 1, 0, 0])
    with pytest.raises(InfeasibleSolution, match="3 entries"):
        mis.check([1, 0, 1])
    with pytest.raises(InfeasibleSolution, match="0 or 1"):
        mis.check([2, 0, 0, 0])
    _, r = solve("mis", mis, seconds=1)
    assert r.check(mis) == 2
    r.value = 3  # a record that does not match its solution
    with pytest.raises(InfeasibleSolution, match="records 3"):
        r.check(mis)


def test_repair_never_returns_an_infeasible_set_and_keeps_what_it_can():
    p = IndependentSet(erdos_renyi_mis(60, 0.15, seed=3))
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        x = torch.rand(16, p.n, generator=gen) < 0.5
        keep = torch.rand(16, p.n, generator=gen) < 0.05
        y = p.repair(x, keep=keep, gen=gen)
        assert p.feasible(y).all()
        free = ~y & (p.tight(y) == 0)
        assert not free.any()  # maximal
        # a kept node leaves only when it clashes with another kept node
        k = keep & x
        lost = k & ~y
        assert ((p.tight(k) > 0) | ~lost).all()


def test_local_search_finds_a_one_two_swap_and_never_shrinks_a_set():
    star = IndependentSet(STAR)
    x = rows({0}, n=5)
    # a swap pass drops each candidate with probability 1/2 (its own generator: the test is seeded)
    assert star.improve(x, torch.Generator().manual_seed(0)).tolist() == [[False, True, True, True, True]]
    p = IndependentSet(erdos_renyi_mis(80, 0.1, seed=4))
    gen = torch.Generator().manual_seed(2)
    x = p.insert_free(torch.zeros(8, p.n, dtype=torch.bool), gen)
    y = p.improve(x, gen)
    assert p.feasible(y).all() and (y.sum(1) >= x.sum(1)).all()


# ---------------------------------------------------------------------------------- solvers


def test_mcpg_reaches_the_planted_optimum_of_a_small_model_rb_instance():
    _, r = solve("mis", "rb:20:10:0", seconds=40, seed=0)  # stops when it reaches the planted 20
    assert r.optimum == 20 and r.value == 20 and r.ratio == 1.0
    assert r.time_to_best < 30  # a margin: it takes a few seconds on two busy cores
    assert r.history[-1] == (r.time_to_best, 20.0)
    assert r.check(load_graph_problem("rb:20:10:0")) == 20


def load_graph_problem(spec, cover=False):
    g, planted = load_graph(spec)
    return IndependentSet(g, cover=cover, planted=planted)


def test_baselines_return_checked_independent_sets():
    pytest.importorskip("networkx", reason="the networkx baseline needs networkx (the solve extra)")
    p = load_graph_problem("rb:10:5:1")
    for r in [greedy_min_degree(p), networkx_maximal(p, seconds=0.2), arw_ils(p, seconds=5, stop_at=10)]:
        assert p.check(r.solution) == r.value
        assert 1 <= r.value <= 10
    assert arw_ils(p, seconds=10, stop_at=10).value == 10


def test_maxcut_through_the_shared_interface():
    g = erdos_renyi(14, 0.4, seed=11, weights=(1.0, -1.0))
    best, _ = brute_force_maxcut(g)
    problem = MaxCutProblem(g)
    r = mcpg(problem, seconds=5, seed=0, stop_at=best)
    assert r.value == best and r.check(problem) == best
    _, r = solve("maxcut", problem, seconds=1, method="greedy", seed=0, batch=4)
    assert r.value == best and r.check(problem) == best and r.method == "greedy"


# ---------------------------------------------------------------------------------- instances and the CLI


def test_generators_are_seeded_and_files_read(tmp_path):
    a, b, c = erdos_renyi_mis(50, 0.2, 1), erdos_renyi_mis(50, 0.2, 1), erdos_renyi_mis(50, 0.2, 2)
    assert torch.equal(a.u, b.u) and not torch.equal(a.u, c.u)
    assert abs(a.m - 0.2 * 50 * 49 / 2) < 60
    path = tmp_path / "tiny.mis"
    path.write_text("c a comment\np edge 4 3\ne 1 2\ne 2 3\ne 3 4\n")
    g = read_graph(path)
    assert (g.n, g.m, g.name) == (4, 3, "tiny")
    assert IndependentSet(g).check([1, 0, 1, 0]) == 2
    bad = tmp_path / "bad.mis"
    bad.write_text("p edge 4 1\nx 1 2\n")
    with pytest.raises(UserError, match="bad.mis:2"):
        read_graph(bad)


def run_cli(argv):
    parser = argparse.ArgumentParser(prog="corral")
    add_solve_parser(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    return args.fn(args)


def test_cli_mis_and_vc_json_and_solution_file(tmp_path, capsys):
    out = tmp_path / "sol.txt"
    assert run_cli(["solve", "mis", "rb:8:4:0", "--seconds", "5", "--envs", "8", "--out", str(out), "--json"]) == 0
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rec["value"] == rec["optimum"] == 8 and rec["nodes"] == 32 and rec["history"][-1][1] == 8
    p = load_graph_problem("rb:8:4:0")
    assert p.check(read_assignment(out)) == 8
    assert run_cli(["solve", "vc", "er:40:0.2:1", "--seconds", "1", "--out", str(out), "--method", "arw"]) == 0
    text = capsys.readouterr().out
    assert "best vc" in text and "best value over time" in text
    vc = load_graph_problem("er:40:0.2:1", cover=True)
    assert vc.check(read_assignment(out)) == int(text.split("best vc ")[1].split()[0])


@pytest.mark.parametrize("argv, names", [
    (["solve", "tsp", "rb:8:4"], ["unknown problem 'tsp'", "maxcut, mis, vc"]),
    (["solve", "mis", "missing.txt"], ["'missing.txt' does not exist", "er:800:0.15:0"]),
    (["solve", "mis", "rb:8:x"], ["'rb:8:x' is not a generator spec", "rb:N:D"]),
    (["solve", "mis", "rb:8:4", "--method", "ppo"], ["unknown method 'ppo' for mis", "mcpg, arw"]),
    (["solve", "vc", "rb:8:4", "--seconds", "0"], ["--seconds"]),
])
def test_cli_refuses_a_bad_problem_instance_or_method_with_one_message(argv, names, capsys):
    assert corral_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("corral: error:")
    for name in names:
        assert name in err[0]
