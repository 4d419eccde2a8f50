"""MaxCut on Gset graphs: the PPO-trained flip policy against uniform random flips and
multi-start greedy local search, each for the same wall-clock budget, one CPU thread.

All three start from steepest ascent on random assignments and end with a steepest-ascent
polish of the best assignment (see corral/problems/maxcut_solver.py); "ppo" spends the first
quarter of its budget training the policy on the instance (its training episodes count
towards the best cut), "random" replaces the policy's choice by a uniform random node in the
same restart-and-perturb search, "greedy" repeats steepest ascent from fresh random
assignments. Ratios are to the best known cuts.

    python benchmarks/bench_maxcut.py --graphs G14 G22 G70 --time-limit 120
    python benchmarks/bench_maxcut.py --graphs G14 --methods ppo --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import re
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
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)

    from corral.problems import read_gset, solve_maxcut

    known = best_known(Path(args.data))
    rows = []
    for name in args.graphs:
        graph = read_gset(Path(args.data) / f"{name}.txt")
        for method in args.methods:
            for seed in args.seeds:
                r = solve_maxcut(graph, time_limit=args.time_limit, num_envs=args.envs, seed=seed,
                                 device=args.device, method=method)
                first = next((t for t, c in r["history"] if c >= r["cut"]), None)
                row = {"graph": name, "method": method, "seed": seed, "cut": r["cut"], "best_known": known.get(name),
                       "ratio": r["cut"] / known[name] if name in known else None, "seconds": r["seconds"],
                       "found_at": first, "flips": r["flips"], "train_seconds": r["train_seconds"]}
                rows.append(row)
                print(json.dumps(row), flush=True)

    print("\n| graph | n | m | best known | method | cut | ratio | found at (s) | flips |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    sizes = {}
    for row in rows:
        if row["graph"] not in sizes:
            g = read_gset(Path(args.data) / f"{row['graph']}.txt")
            sizes[row["graph"]] = (g.n, g.m)
        n, m = sizes[row["graph"]]
        ratio = f"{row['ratio']:.4f}" if row["ratio"] is not None else "-"
        print(f"| {row['graph']} | {n} | {m} | {row['best_known']:.0f} | {row['method']} (seed {row['seed']}) | "
              f"{row['cut']:.0f} | {ratio} | {row['found_at']} | {row['flips']:,} |")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
