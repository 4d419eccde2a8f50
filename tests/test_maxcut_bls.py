"""Breakout local search for MaxCut (method "bls"): both engines keep their incremental state exact,
find known optima, stop at a target, and the C engine falls back to numpy without a compiler."""

import numpy as np
import pytest
import torch

from corral.errors import UserError
from corral.problems import (
    barabasi_albert,
    brute_force_maxcut,
    cut_value,
    erdos_renyi,
    from_edges,
    maxcut_bls_kernel,
    solve_maxcut,
)
from corral.problems.maxcut_bls import BreakoutSearch, make_search
from corral.problems.maxcut_bls_kernel import CompiledBreakoutSearch, load_kernel

needs_cc = pytest.mark.skipif(load_kernel() is None, reason="no C compiler for the bls kernel")


def engines():
    return [BreakoutSearch] + ([CompiledBreakoutSearch] if load_kernel() is not None else [])


def signed_graph(n, seed):
    return erdos_renyi(n, 0.4, seed=seed, weights=(1.0, -1.0))


def test_numpy_engine_keeps_gains_cuts_and_bests_exact_while_it_steps():
    g = signed_graph(30, seed=1)
    search = BreakoutSearch(g, num_envs=5, seed=0, stall=20)  # a small T: break-outs happen too
    for _ in range(600):
        search.step()
    gain, cut = search.gain.copy(), search.cut.copy()
    search.recompute()
    assert np.allclose(gain, search.gain) and np.allclose(cut, search.cut)
    assert np.allclose(cut, cut_value(g, torch.from_numpy(search.s)).numpy())
    search._record_best()
    assert np.allclose(search.best_cut, cut_value(g, torch.from_numpy(search.best_s)).numpy())


@needs_cc
def test_compiled_engine_keeps_gains_cuts_and_bests_exact_between_calls():
    g = signed_graph(30, seed=2)
    search = CompiledBreakoutSearch(g, num_envs=3, seed=0, stall=20, chunk=500)
    for i in range(3):
        for _ in range(4):
            if search._call(i, 500, float("inf")) == maxcut_bls_kernel.BREAK_OUT:
                search._break_out(i)
    s = torch.from_numpy(search.s.astype(np.int64))
    gain, cut = search.gain.copy(), search.d[:, 0].copy()
    for i in range(3):
        search._recompute(i)
    assert np.allclose(gain, search.gain) and np.allclose(cut, search.d[:, 0])
    assert np.allclose(cut, cut_value(g, s).numpy())
    best = torch.from_numpy(search.best_s.astype(np.int64))
    assert np.allclose(search.d[:, 1], cut_value(g, best).numpy())
    assert search.moves > 0


@pytest.mark.parametrize("engine", engines(), ids=lambda c: c.__name__)
@pytest.mark.parametrize("seed", [0, 1])
def test_engines_find_the_brute_force_optimum(engine, seed):
    g = signed_graph(16, seed=10 + seed)
    best, _ = brute_force_maxcut(g)
    search = engine(g, num_envs=4, seed=seed)
    search.run(deadline=float("inf"), stop_at=best)
    value, x = search.best()
    assert value == best == cut_value(g, x).item()


def test_an_even_cycle_and_a_bipartite_graph_are_cut_completely():
    cycle = from_edges(40, [(i, (i + 1) % 40) for i in range(40)])
    grid = from_edges(36, [(r * 6 + c, r * 6 + c + 1) for r in range(6) for c in range(5)]
                      + [(r * 6 + c, (r + 1) * 6 + c) for r in range(5) for c in range(6)])
    for g in (cycle, grid):
        r = solve_maxcut(g, time_limit=5.0, num_envs=4, method="bls", stop_at=g.m)
        assert r["cut"] == g.m == cut_value(g, r["assignment"]).item()
        assert r["seconds"] < 5.0  # stopped at the target


def test_bls_method_stops_at_the_target_and_records_when_it_got_there():
    g = barabasi_albert(300, 3, seed=4)
    first = solve_maxcut(g, time_limit=3.0, num_envs=4, seed=0, method="bls")
    target = first["cut"] - 2
    r = solve_maxcut(g, time_limit=3.0, num_envs=4, seed=0, method="bls", stop_at=target)
    assert r["cut"] >= target and cut_value(g, r["assignment"]).item() == r["cut"]
    assert r["history"] and r["history"][-1][1] == r["cut"]
    assert r["seconds"] < 3.0


def test_make_search_falls_back_to_numpy_without_a_compiler(monkeypatch):
    monkeypatch.setattr(maxcut_bls_kernel, "_KERNEL", [None])
    search = make_search(signed_graph(12, seed=3), 2, seed=0)
    assert isinstance(search, BreakoutSearch)
    with pytest.raises(RuntimeError, match="did not compile"):
        CompiledBreakoutSearch(signed_graph(12, seed=3), 2)


def test_stop_at_is_refused_where_a_method_cannot_stop(tmp_path):
    import argparse

    from corral.solve import add_solve_parser

    parser = argparse.ArgumentParser(prog="corral")
    add_solve_parser(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(["solve", "mis", "rb:5:3:0", "--method", "greedy", "--stop-at", "5", "--out", "-"])
    with pytest.raises(UserError, match="--stop-at"):
        args.fn(args)
