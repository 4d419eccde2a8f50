"""``corral solve``: combinatorial problems solved with on-device RL.

    corral solve maxcut GRAPH_FILE [--time-limit S] [--envs N] [--seed S] [--device D]
                                   [--method ppo|random|greedy|tabu] [--out FILE] [--json]

GRAPH_FILE is in the Gset format (a header ``n m``, then ``u v w`` lines with 1-based node
ids). The best cut value is printed; the assignment is written to ``--out`` (default
``<graph name>.cut.txt`` in the current directory; ``--out -`` writes none): line i holds
0 or 1, the side of node i. With ``--json`` the last line of stdout is
``{"cut": ..., "seconds": ..., "nodes": ..., "edges": ...}``.

``cli.py`` registers the subcommand with :func:`add_solve_parser`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from corral.errors import UserError

PROBLEMS = ("maxcut",)


def write_assignment(assignment, path: str | Path) -> None:
    """One 0/1 per line, line i for node i (1-based, as in the graph file)."""
    Path(path).write_text("".join(f"{int(x)}\n" for x in assignment.tolist()))


def read_assignment(path: str | Path):
    """Read back what :func:`write_assignment` wrote (int8 tensor)."""
    import torch

    return torch.tensor([int(x) for x in Path(path).read_text().split()], dtype=torch.int8)


def _cmd_solve(args) -> int:
    import torch

    from corral.problems.graphs import read_gset
    from corral.problems.maxcut_solver import solve_maxcut
    from corral.train.setup import resolve_device

    if args.problem not in PROBLEMS:
        raise UserError(f"unknown problem {args.problem!r}; choose one of: {', '.join(PROBLEMS)}")
    if not args.time_limit > 0:
        raise UserError(f"--time-limit must be positive, got {args.time_limit}")
    if args.envs < 1:
        raise UserError(f"--envs must be >= 1, got {args.envs}")
    if args.threads < 1:
        raise UserError(f"--threads must be >= 1, got {args.threads}")
    device = resolve_device(args.device)
    graph = read_gset(args.graph)
    out = None if args.out == "-" else Path(args.out or f"{graph.name}.cut.txt")
    if out is not None and out.parent != Path("") and not out.parent.is_dir():
        raise UserError(f"--out {str(out)!r}: the folder {str(out.parent)!r} does not exist")
    torch.set_num_threads(args.threads)

    def progress(rec: dict) -> None:
        if args.verbose:
            print(f"[{rec['seconds']:7.1f}s] {rec['phase']:<7s} best cut {rec['cut']:g}", file=sys.stderr, flush=True)

    result = solve_maxcut(graph, time_limit=args.time_limit, num_envs=args.envs, seed=args.seed, device=device,
                          method=args.method, progress=progress)
    if out is not None:
        write_assignment(result["assignment"], out)
    cut = result["cut"]
    cut = int(cut) if float(cut).is_integer() else cut
    if args.json:
        print(json.dumps({"cut": cut, "seconds": result["seconds"], "nodes": result["nodes"],
                          "edges": result["edges"]}))
    else:
        where = f"; assignment in {out}" if out is not None else ""
        print(f"best cut {cut} on {graph.name} ({result['nodes']} nodes, {result['edges']} edges) "
              f"in {result['seconds']:.1f}s with {args.method}{where}")
    return 0


def add_solve_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``solve`` on an ``add_subparsers()`` object; the handler is ``args.fn``."""
    s = subparsers.add_parser("solve", help="solve a combinatorial problem (maxcut) with on-device RL",
                              description=__doc__.split("\n\n")[1] if __doc__ else None,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("problem", help="the problem: maxcut")
    s.add_argument("graph", help="graph file in the Gset format ('n m' header, then 'u v w' lines, 1-based)")
    s.add_argument("--time-limit", type=float, default=60.0, help="seconds to search (default 60)")
    s.add_argument("--envs", type=int, default=32, help="parallel envs (default 32)")
    s.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    s.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    s.add_argument("--method", choices=("ppo", "random", "greedy", "tabu"), default="ppo",
                   help="ppo: learned flip policy (default); random: uniform random flips; "
                        "greedy: multi-start steepest ascent; tabu: hand-written tabu search (reference)")
    s.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    s.add_argument("--out", help="assignment file, one 0/1 per node and line (default <graph>.cut.txt; '-': none)")
    s.add_argument("--json", action="store_true", help="end with one JSON line: cut, seconds, nodes, edges")
    s.add_argument("--verbose", action="store_true", help="print the best cut about once a second (stderr)")
    s.set_defaults(fn=_cmd_solve)
    return s
