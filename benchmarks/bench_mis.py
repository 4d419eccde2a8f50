"""Maximum independent set: corral's solver (mcpg: policy-gradient mean-field sampling + batched
(1,2)-swap local search + elite restarts) against the baselines, in the same run, at the same
seconds per instance, one torch thread.

Sets (fixed seeds):
  rb-small   Model RB rb:30:15:s (the size of BHOSLIB's frb30-15), s = 0..4: planted optimum 30
  rb-medium  rb:50:23:s (frb50-23 size), s = 0..4: planted optimum 50
  er-small   32 Erdos-Renyi graphs, n drawn in [700, 800] from the seed, p = 0.15 (the ER-[700-800]
             set of the learned-solver papers: Li et al. 2018, DIMES, DIFUSCO)
  er-large   Erdos-Renyi, n in [9000, 11000], p = 0.02 (their ER-[9000-11000] set)

Methods: mcpg (corral), bls (corral: breakout local search on the equivalent MaxCut,
corral/problems/mis_bls.py), arw (Andrade-Resende-Werneck iterated local search, plain Python),
networkx (networkx's maximal_independent_set, redrawn for the same seconds, the largest kept),
greedy (min-degree greedy, one pass), exact (HiGHS MILP via scipy with --exact-seconds; "proven"
when HiGHS closes the gap), cpsat (OR-Tools CP-SAT, the cpsat extra, --exact-seconds, one worker;
"proven" when CP-SAT proves the optimum). Each solution is checked against the instance. mcpg and arw stop
early when they reach a known (planted) optimum.

    python benchmarks/bench_mis.py --sets rb-small er-small --seconds 30
    python benchmarks/bench_mis.py --sets er-small --count 8 --seconds 10 --exact-seconds 0
    python benchmarks/bench_mis.py --sets rb-small --seconds 30 --exact-seconds 0 --methods bls mcpg arw
    python benchmarks/bench_mis.py --sets rb-small --exact-seconds 120 --methods cpsat
    python benchmarks/bench_mis.py --instances er:749:0.15:0 --exact-seconds 300 --methods cpsat

Each row also has "cpu": the process's CPU seconds for that solve (what a shared machine gave it).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

SETS = {
    "rb-small": lambda k: [f"rb:30:15:{s}" for s in range(k or 5)],
    "rb-medium": lambda k: [f"rb:50:23:{s}" for s in range(k or 5)],
    "er-small": lambda k: [f"er:{random.Random(s).randint(700, 800)}:0.15:{s}" for s in range(k or 32)],
    "er-large": lambda k: [f"er:{random.Random(s).randint(9000, 11000)}:0.02:{s}" for s in range(k or 4)],
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sets", nargs="+", default=["rb-small", "er-small"], choices=list(SETS))
    p.add_argument("--instances", nargs="+", default=[], help="instance specs instead of --sets (set 'listed')")
    p.add_argument("--count", type=int, default=0, help="instances per set (default: the set's size)")
    p.add_argument("--seconds", type=float, default=30.0, help="per instance and method (mcpg, arw, networkx)")
    p.add_argument("--exact-seconds", type=float, default=60.0,
                   help="HiGHS / CP-SAT time limit (0: no exact solver)")
    p.add_argument("--methods", nargs="+", default=["mcpg", "arw", "networkx", "greedy", "exact"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--envs", type=int, default=32)
    args = p.parse_args()
    torch.set_num_threads(1)

    from corral.problems.registry import load_problem, solve

    rows = []
    sets = {"listed": args.instances} if args.instances else {name: SETS[name](args.count) for name in args.sets}
    for name, specs in sets.items():
        for spec in specs:
            problem = load_problem("mis", spec)
            for method in args.methods:
                exact = method in ("exact", "cpsat")
                if exact and args.exact_seconds <= 0:
                    continue
                seconds = args.exact_seconds if exact else args.seconds
                cpu0 = time.process_time()
                _, r = solve("mis", problem, seconds=seconds, method=method, seed=args.seed,
                             batch=8 if method == "bls" else args.envs)
                row = {"set": name, "instance": spec, "n": problem.n, "m": problem.m, "method": method,
                       "value": r.value, "optimum": r.optimum, "seconds": r.seconds, "time_to_best": r.time_to_best,
                       "proven": r.info.get("proven"), "bound": r.info.get("bound"),
                       "cpu": round(time.process_time() - cpu0, 2)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    table(rows, args)


def table(rows, args):
    print(f"\n{args.seconds:g} s per instance and method (exact: {args.exact_seconds:g} s), one torch thread\n")
    methods = [m for m in args.methods if any(r["method"] == m for r in rows)]
    ref = methods[0]  # the ratios are the first method's (corral's, listed first) to the others'
    heads = ["set", "instances", "optimum (mean)", *methods, *(f"{ref} / {m}" for m in methods[1:]),
             f"{ref} / optimum", "reached the optimum (" + ", ".join(m for m in methods if m not in ("exact", "cpsat")) + ")"]
    print("| " + " | ".join(heads) + " |\n" + "| --- " * len(heads) + "|")
    for name in dict.fromkeys(r["set"] for r in rows):
        sub = [r for r in rows if r["set"] == name]
        insts = list(dict.fromkeys(r["instance"] for r in sub))
        val = {(r["instance"], r["method"]): r for r in sub}
        mean = {m: statistics.mean(val[i, m]["value"] for i in insts) for m in methods if (insts[0], m) in val}
        # optimum: planted, or proven by an exact solver
        opt = {}
        for i in insts:
            o = next((val[i, m]["optimum"] for m in methods if (i, m) in val), None)
            best = max(val[i, m]["value"] for m in methods if (i, m) in val)
            for ex in ("exact", "cpsat"):  # proven, or an exact solver's bound met by a checked set
                if o is None and (i, ex) in val and (val[i, ex]["proven"] or val[i, ex]["bound"] == best):
                    o = best
            if o is not None:
                opt[i] = o
        cells = [f"{mean[m]:.2f}" for m in methods]
        ratios = [f"{mean[ref] / mean[m]:.4f}" if mean.get(m) else "-" for m in methods[1:]]
        if opt:
            r_opt = statistics.mean(val[i, ref]["value"] / opt[i] for i in opt)
            hits = [sum(val[i, m]["value"] >= opt[i] for i in opt if (i, m) in val) for m in methods
                    if m not in ("exact", "cpsat")]
            o_cell, r_cell = f"{statistics.mean(opt.values()):.2f} ({len(opt)} known)", f"{r_opt:.4f}"
            h_cell = ", ".join(f"{h} / {len(opt)}" for h in hits)
        else:
            o_cell = r_cell = h_cell = "-"
        print("| " + " | ".join([name, str(len(insts)), o_cell, *cells, *ratios, r_cell, h_cell]) + " |")
    for name in dict.fromkeys(r["set"] for r in rows):
        cpu = {m: [r["cpu"] for r in rows if r["set"] == name and r["method"] == m] for m in methods}
        print(f"\n{name}: CPU seconds per instance (mean, max): " +
              ", ".join(f"{m} {statistics.mean(c):.2f}, {max(c):.2f}" for m, c in cpu.items() if c))
    for method in ("exact", "cpsat"):
        for name in dict.fromkeys(r["set"] for r in rows):
            ex = [r for r in rows if r["set"] == name and r["method"] == method]
            bounds = [r["bound"] for r in ex if r["bound"] is not None]
            if ex and bounds:
                print(f"\n{name}: {method} proven on {sum(bool(r['proven']) for r in ex)} of {len(ex)}; "
                      f"mean upper bound {statistics.mean(bounds):.2f}")


if __name__ == "__main__":
    main()
