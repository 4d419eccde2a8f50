"""``corral solve``: combinatorial problems solved with on-device RL.

    corral solve PROBLEM INSTANCE [--seconds S] [--envs N] [--seed S] [--device D]
                 [--method M] [--out FILE] [--json] [--verbose]

PROBLEM is maxcut, mis (maximum independent set) or vc (minimum vertex cover). INSTANCE is a
graph file (Gset: a header ``n m``, then ``u v w`` lines, 1-based; or DIMACS ``p edge n m`` /
``e u v``) or a generator: ``er:N:P[:SEED]`` (Erdos-Renyi), ``rb:N:D[:SEED[:P]]`` (Model RB
with a planted optimum of N, mis / vc only); mimo takes a channel
``rayleigh:N=8,K=8,snr=10,seed=0`` (methods corral (default), wmmse, zf, mmse, policy; the
beams go to ``--out``). The best value is printed with the best value over time; the solution is written to ``--out`` (default ``<instance>.cut.txt`` for maxcut,
``<instance>.<problem>.txt`` otherwise; ``--out -`` writes none): line i holds 0 or 1 for node i
(maxcut: its side; mis / vc: whether it is in the set). With ``--json`` the last line of stdout is
one JSON record (maxcut: ``{"cut", "seconds", "nodes", "edges", "method", "time_to_best",
"cpu_seconds"}``; mis / vc: problem, instance,
method, value, optimum, seconds, time_to_best, history, nodes, edges). Methods: maxcut ppo
(default), random, greedy, tabu, bls, mcpg; mis / vc mcpg (default), bls, arw, greedy, networkx,
exact. ``--stop-at V`` ends the search once the best value reaches V (bls, mcpg and arw; mis / vc
stop at a planted optimum anyway).

``cli.py`` registers the subcommand with :func:`add_solve_parser`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from corral.errors import UserError

PROBLEMS = ("maxcut", "mis", "vc", "mimo")  # corral.problems.registry.PROBLEMS (not imported here: it loads torch)


def write_assignment(assignment, path: str | Path) -> None:
    """One 0/1 per line, line i for node i (1-based, as in the graph file)."""
    Path(path).write_text("".join(f"{int(x)}\n" for x in assignment.tolist()))


def read_assignment(path: str | Path):
    """Read back what :func:`write_assignment` wrote (int8 tensor)."""
    import torch

    return torch.tensor([int(x) for x in Path(path).read_text().split()], dtype=torch.int8)


def _cmd_solve(args) -> int:
    import torch

    from corral.problems.registry import check_method, check_problem, load_problem, solve
    from corral.train.setup import resolve_device

    kind = check_problem(args.problem)
    method = check_method(kind, args.method)
    if not args.time_limit > 0:
        raise UserError(f"--seconds (--time-limit) must be positive, got {args.time_limit}")
    if args.envs < 1:
        raise UserError(f"--envs must be >= 1, got {args.envs}")
    if args.threads < 1:
        raise UserError(f"--threads must be >= 1, got {args.threads}")
    stop = {} if args.stop_at is None else {"stop_at": args.stop_at}
    if stop and (kind == "mimo" or method not in ("bls", "mcpg", "arw")):
        raise UserError(f"--stop-at applies to the methods bls, mcpg and arw, not {kind} {method}")
    device = resolve_device(args.device)
    problem = load_problem(kind, args.graph, device)
    default_out = f"{problem.name}.cut.txt" if kind == "maxcut" else f"{problem.name}.{kind}.txt"
    out = None if args.out == "-" else Path(args.out or default_out)
    if out is not None and out.parent != Path("") and not out.parent.is_dir():
        raise UserError(f"--out {str(out)!r}: the folder {str(out.parent)!r} does not exist")
    torch.set_num_threads(args.threads)
    label = "cut" if kind == "maxcut" else kind

    def progress(rec: dict) -> None:
        if args.verbose:
            print(f"[{rec['seconds']:7.1f}s] {rec['phase']:<7s} best {label} {rec['value']:g}", file=sys.stderr,
                  flush=True)

    cpu0 = time.process_time()
    problem, result = solve(kind, problem, seconds=args.time_limit, method=method, seed=args.seed, device=device,
                            batch=args.envs, progress=progress, **stop)
    cpu_seconds = round(time.process_time() - cpu0, 3)
    if kind == "mimo":  # beams, not a 0/1 assignment (corral.problems.mimo)
        from corral.problems.mimo import write_beams

        if out is not None:
            write_beams(result.solution, out)
        print(json.dumps({**result.record(), **problem.describe()}) if args.json else
              f"sum rate {result.value:.4f} bits/s/Hz on {problem.name} in {result.seconds:.1f}s with {method}"
              + (f"; beams in {out} (line i: antenna i's re im per user)" if out is not None else ""))
        return 0
    if out is not None:
        write_assignment(result.solution, out)
    value = int(result.value) if float(result.value).is_integer() else result.value
    where = f"; solution in {out}" if out is not None else ""
    if kind == "maxcut":
        if args.json:
            print(json.dumps({"cut": value, "seconds": result.seconds, "nodes": problem.graph.n,
                              "edges": problem.graph.m, "method": method, "time_to_best": result.time_to_best,
                              "cpu_seconds": cpu_seconds}))
        else:
            print(f"best cut {value} on {problem.name} ({problem.graph.n} nodes, {problem.graph.m} edges) "
                  f"in {result.seconds:.1f}s ({cpu_seconds:.1f} CPU-s) with {method}, first reached at "
                  f"{result.time_to_best}s{where.replace('solution', 'assignment')}")
        return 0
    if args.json:
        print(json.dumps({**result.record(), **problem.describe()}))
        return 0
    known = ""
    if result.optimum is not None:
        known = f"; known optimum {result.optimum:g} (ratio {result.ratio:.4f})"
    print(f"best {kind} {value} on {problem.name} ({problem.n} nodes, {problem.m} edges) in {result.seconds:.1f}s "
          f"with {method}, first reached at {result.time_to_best}s{known}{where}")
    print("best value over time: " + ", ".join(f"{t:g}s {v:g}" for t, v in result.history))
    return 0


def add_solve_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``solve`` on an ``add_subparsers()`` object; the handler is ``args.fn``."""
    s = subparsers.add_parser("solve", help="solve a combinatorial problem (maxcut, mis, vc) with on-device RL",
                              description=__doc__.split("\n\n")[1] if __doc__ else None,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("problem", help="the problem: " + ", ".join(PROBLEMS))
    s.add_argument("graph", metavar="instance",
                   help="graph file (Gset 'n m' header or DIMACS 'p edge', 1-based) or generator "
                        "er:N:P[:SEED] / rb:N:D[:SEED[:P]]")
    s.add_argument("--seconds", "--time-limit", dest="time_limit", type=float, default=60.0,
                   help="seconds to search (default 60)")
    s.add_argument("--envs", type=int, default=32, help="parallel envs / chains (default 32)")
    s.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    s.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    s.add_argument("--method", default=None,
                   help="maxcut: ppo (learned flip policy, default), random, greedy, tabu, bls (breakout local "
                        "search), mcpg; "
                        "mis / vc: mcpg (policy-gradient sampler + local search, default), bls (breakout local "
                        "search on the equivalent MaxCut), arw ((1,2)-swap "
                        "iterated local search), greedy (min degree), networkx (maximal set), exact (MILP)")
    s.add_argument("--stop-at", type=float, default=None,
                   help="stop once the best value reaches this (methods bls, mcpg, arw)")
    s.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    s.add_argument("--out", help="solution file, one 0/1 per node and line (default <instance>.cut.txt for "
                                 "maxcut, <instance>.<problem>.txt otherwise; '-': none)")
    s.add_argument("--json", action="store_true", help="end with one JSON line (value, seconds, nodes, edges, ...)")
    s.add_argument("--verbose", action="store_true", help="print the best value about once a second (stderr)")
    s.set_defaults(fn=_cmd_solve)
    return s
