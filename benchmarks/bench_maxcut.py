"""MaxCut on Gset graphs: the PPO-trained flip policy against uniform random flips and
multi-start greedy local search, each for the same wall-clock budget, one CPU thread.

All three start from steepest ascent on random assignments and end with a steepest-ascent
polish of the best assignment (see corral/problems/maxcut_solver.py); "ppo" spends the first
quarter of its budget training the policy on the instance (its training episodes count
towards the best cut), "random" replaces the policy's choice by a uniform random node in the
same restart-and-perturb search, "greedy" repeats steepest ascent from fresh random
assignments, "tabu" is the hand-written batched tabu search, "bls" breakout local search
(corral/problems/maxcut_bls.py; it and "mcpg" stop at the best known cut), "mcpg" the shared
policy-gradient sampler of corral/problems/search.py. Every method runs on the graph left by the exact
reductions (corral/problems/reduce.py: degree-0/1 peeling, degree-2 contraction; G70 drops
to 2164 nodes) unless --no-reduce; the cut is the lifted assignment's cut on the original graph.
Ratios are to the best known cuts; "known at" is when the best known cut was first reached.

    python benchmarks/bench_maxcut.py --graphs G14 G22 G70 --time-limit 120
    python benchmarks/bench_maxcut.py --graphs G14 --methods ppo --seeds 0 1 2
    python benchmarks/bench_maxcut.py --graphs G70 --methods tabu --time-limit 600
    python benchmarks/bench_maxcut.py --graphs G14 G22 --methods bls --envs 8 --seeds 0 1 --time-limit 400

"cpu" is the process's CPU seconds for the run (what a shared machine gave it).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import torch

DATA = Path("/work/shared/data/gset")
# Best known cuts (the data folder's README: microsoft/AOCoptimizer.jl's reference table;
# other reports give G70 9595).
BEST_KNOWN = {"G14": 3064, "G22": 13359, "G70": 9591}


def best_known(data: Path) -> dict[str, float]:
    known = dict(BEST_KNOWN)
    readme = data / "README.md"
    if readme.is_file():
        for name, value in re.findall(r"^\|\s*(G\d+)\s*\|.*\|\s*(\d+)\s*\|\s*$", readme.read_text(), re.M):
            known[name] = float(value)
    return known


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--graphs", nargs="+", default=["G14", "G22", "G70"])
    p.add_argument("--methods", nargs="+", default=["ppo", "random", "greedy"])
    p.add_argument("--time-limit", type=float, default=120.0)
    p.add_argument("--envs", type=int, default=32)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--data", default=str(DATA))
    p.add_argument("--no-reduce", action="store_true", help="search the original graph (no reductions)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)

    from corral.problems import MaxCutProblem, mcpg, read_gset, solve_maxcut
    from corral.problems.reduce import reduce_maxcut

    known = best_known(Path(args.data))
    rows = []
    for name in args.graphs:
        graph = read_gset(Path(args.data) / f"{name}.txt")
        red = reduce_maxcut(graph)
        for method in args.methods:
            for seed in args.seeds:
                cpu0 = time.process_time()
                if method == "mcpg":
                    r = mcpg(MaxCutProblem(graph, reduce=not args.no_reduce), args.time_limit, seed=seed,
                             batch=args.envs, stop_at=known.get(name))
                    r = {"cut": r.value, "seconds": r.seconds, "history": r.history, "flips": r.info["samples"],
                         "train_seconds": 0.0}
                else:
                    r = solve_maxcut(graph, time_limit=args.time_limit, num_envs=args.envs, seed=seed,
                                     device=args.device, method=method, reduce=not args.no_reduce,
                                     stop_at=known.get(name) if method == "bls" else None)
                first = next((t for t, c in r["history"] if c >= r["cut"]), None)
                at_known = next((t for t, c in r["history"] if name in known and c >= known[name]), None)
                row = {"graph": name, "method": method, "seed": seed, "cut": r["cut"], "best_known": known.get(name),
                       "ratio": r["cut"] / known[name] if name in known else None, "seconds": r["seconds"],
                       "cpu": round(time.process_time() - cpu0, 1),
                       "found_at": first, "known_at": at_known, "flips": r["flips"],
                       "train_seconds": r["train_seconds"],
                       "searched_nodes": graph.n if args.no_reduce else red.reduced.n,
                       "searched_edges": graph.m if args.no_reduce else red.reduced.m}
                rows.append(row)
                print(json.dumps(row), flush=True)

    print("\n| graph | n | m | searched n / m | best known | method | cut | ratio | found at (s) | known at (s) "
          "| CPU-s | flips (mcpg: samples) |")
    print("| --- " * 12 + "|")
    sizes = {}
    for row in rows:
        if row["graph"] not in sizes:
            g = read_gset(Path(args.data) / f"{row['graph']}.txt")
            sizes[row["graph"]] = (g.n, g.m)
        n, m = sizes[row["graph"]]
        ratio = f"{row['ratio']:.4f}" if row["ratio"] is not None else "-"
        print(f"| {row['graph']} | {n} | {m} | {row['searched_nodes']} / {row['searched_edges']} | "
              f"{row['best_known']:.0f} | {row['method']} (seed {row['seed']}) | {row['cut']:.0f} | {ratio} | "
              f"{row['found_at']} | {row['known_at'] if row['known_at'] is not None else '-'} | {row['cpu']} | "
              f"{row['flips']:,} |")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
