"""``corral bench`` and ``corral report``: argument parsing and printing; the work is in
``suite``, ``execute``, ``estimate`` and ``report``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from corral.errors import UserError


def parse_duration(text: str) -> float:
    """Seconds from ``5400``, ``90m``, ``2h30m``, ``1h5m30s``."""
    import argparse
    import re

    m = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?", text.strip())
    if not text.strip() or m is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; write seconds (5400) or e.g. 90m, 2h30m")
    h, mi, sec = (float(g) if g else 0.0 for g in m.groups())
    return h * 3600 + mi * 60 + sec


def add_parsers(sub, bench_fn, report_fn) -> None:
    b = sub.add_parser(
        "bench", help="run a benchmark suite (a grid of algos x envs x seeds) that resumes where it stopped",
        description="Run every run of a suite, each a process of its own (locally: at most --jobs at once, "
                    "within --memory; with --ray: Ray tasks on a cluster). Running the same command again "
                    "continues: finished runs are skipped, interrupted ones resume from their latest checkpoint, "
                    "failed ones are retried --retries times. `corral report OUT` publishes the results. "
                    "docs/benchmarking.md")
    b.add_argument("suite", nargs="?", help="a built-in suite (--list) or a suite YAML file")
    b.add_argument("--list", action="store_true", help="the built-in suites")
    b.add_argument("--dry-run", action="store_true", help="print the runs with estimated CPU-hours and memory; run nothing")
    b.add_argument("--probe", type=float, metavar="SECONDS",
                   help="with --dry-run: measure each cell's speed here for about SECONDS of CPU (default: the "
                        "speeds recorded in the suite)")
    b.add_argument("--out", help="output folder (default bench/<suite name>)")
    b.add_argument("--jobs", type=int, help="runs at once (default: the CPU cores / the suite's threads per run)")
    b.add_argument("--memory", type=float, metavar="GIB", help="memory the runs may use together (default: what is "
                                                                 "available now less 1 GiB)")
    b.add_argument("--ray", metavar="ADDRESS", help="run on a Ray cluster (e.g. auto, or ray://host:10001); the "
                                                     "output folder must be on a file system every node sees")
    b.add_argument("--stop-after", metavar="DURATION", type=parse_duration,
                   help="stop after DURATION (5400, 90m, 2h30m): the running runs pause with a checkpoint, no more "
                        "start; the same command continues (a job's wall-time limit, a working session)")
    b.add_argument("--retries", type=int, default=2, help="times a failed run is retried (default 2)")
    b.add_argument("--allow-code-change", action="store_true",
                   help="resume runs whose checkpoints were written by other code (the report marks them)")
    b.add_argument("--seeds", help="comma-separated seeds instead of the suite's")
    b.add_argument("--only", action="append", metavar="TEXT", help="only the cells whose algo/env contains TEXT "
                                                                    "(repeatable)")
    b.add_argument("--steps-scale", type=float, default=1.0, help="scale every budget (a smoke run: 0.01)")
    b.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="given",
                   help="a config key for every run, over the suite's (repeatable; e.g. matmul=bfloat16); part of "
                        "each run's spec, so a rerun must give the same keys, and the report names them")
    b.add_argument("--no-live", action="store_true", help="one line per state change instead of the live table")
    b.add_argument("--json", action="store_true", help="print a JSON summary (or the dry run's rows) last")
    b.set_defaults(fn=bench_fn)

    r = sub.add_parser(
        "report", help="CSV, markdown tables and figures of a suite's results",
        description="Write evals.csv, runs.csv, report.md and PNG figures from a suite's output folder (or from "
                    "a results folder holding evals.csv and runs.csv). --page writes a documentation page from "
                    "one or more results folders. docs/benchmarking.md")
    r.add_argument("paths", nargs="+", help="suite output folders (corral bench --out) or results folders")
    r.add_argument("--out", help="where to write (default <path>/report); with several paths of one suite, "
                   "their runs merged into one report (the furthest run of each cell and seed, the later path on a "
                   "tie): e.g. a committed results folder and a new output folder, written back over the first")
    r.add_argument("--page", help="write one markdown page for all the paths (e.g. docs/results.md)")
    r.add_argument("--figures", help="with --page: folder for the figures (default: beside the page, img/results)")
    r.add_argument("--reps", type=int, default=2000, help="bootstrap resamples (default 2000)")
    r.add_argument("--no-figures", action="store_true", help="the CSVs and report.md only (a results folder to "
                                                             "commit: --page draws the figures)")
    r.set_defaults(fn=report_fn)


def _runs(args, suite):
    from corral.config import parse_set

    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    given = dict(parse_set(getattr(args, "given", [])))
    runs = suite.runs(seeds=seeds, steps_scale=args.steps_scale, only=args.only, given=given)
    if not runs:
        raise UserError("no run matches --only / --seeds")
    if given:
        _check_given(runs)
    return runs


def _check_given(runs) -> None:
    """Build each cell's config with the ``--set`` keys before anything starts: a key or value
    that no run can take is refused here, naming it, rather than failing every run."""
    from corral.train.setup import build_config

    seen = set()
    for run in runs:
        if run.cell in seen:
            continue
        seen.add(run.cell)
        try:
            build_config(run.algo, run.env, steps=run.steps, seed=run.seed, overrides=dict(run.sets),
                         zoo=bool(run.zoo), lenient=run.zoo == "lenient")
        except UserError as e:
            keys = " ".join(f"--set {k}={v}" for k, v in run.given)
            raise UserError(f"{run.cell} with {keys}: {e}") from None


def bench(args) -> int:
    from corral.bench.suite import builtin_suites, load_suite

    if args.list:
        for name, path in sorted(builtin_suites().items()):
            try:
                s = load_suite(path)
            except UserError as e:  # e.g. the zoo suite without rl_zoo3
                print(f"  {name:10s} cannot be run here: {e}")
                continue
            print(f"  {name:10s} {len(s.cells):3d} cells x {len(s.seeds)} seeds  {s.description.splitlines()[0] if s.description else ''}")
        return 0
    if not args.suite:
        raise UserError("name a suite (corral bench --list shows the built-in ones) or a suite file")
    suite = load_suite(args.suite)
    runs = _runs(args, suite)
    if args.dry_run:
        return _dry_run(args, suite, runs)
    if args.probe is not None:
        raise UserError("--probe measures speeds for --dry-run; add --dry-run")
    from corral.bench import execute

    out = Path(args.out or Path("bench") / suite.name)
    if args.ray and args.stop_after is not None:
        raise UserError("--stop-after stops local runs: leave out --ray, or --stop-after")
    execute.prepare(suite, out, runs)
    live = not args.no_live and not args.json
    if args.ray:
        outcome = execute.run_ray(suite, out, runs, address=args.ray, retries=args.retries,
                                  allow_code_change=args.allow_code_change, live=live)
    else:
        jobs = args.jobs or max(1, (os.cpu_count() or 1) // max(1, suite.threads))
        memory = int(args.memory * 2**30) if args.memory else None
        outcome = execute.run_local(suite, out, runs, jobs=jobs, memory=memory, retries=args.retries,
                                    allow_code_change=args.allow_code_change, live=live, stop_after=args.stop_after)
    summary = {"out": str(out), "runs": len(runs), "done": len(outcome.done), "failed": outcome.failed,
               "refused": outcome.refused, "busy": outcome.busy, "stopped": outcome.stopped}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{len(outcome.done)} of {len(runs)} runs done in {out}")
        for name, err in outcome.failed.items():
            print(f"failed: {name} (retries used up); the end of its log:\n  " + err.replace("\n", "\n  "))
        if outcome.refused:
            print(f"refused (their checkpoints were written by other code; --allow-code-change continues them, "
                  f"the report marks them): {', '.join(outcome.refused)}")
        if outcome.busy:
            print(f"running in another process: {', '.join(outcome.busy)}")
        if outcome.timed_out:
            print(f"stopped at the time limit (--stop-after {args.stop_after:g} s)")
        if outcome.stopped:
            print(f"stopped with a checkpoint (the same command continues them): {', '.join(outcome.stopped)}")
        if len(outcome.done) == len(runs):
            print(f"report: corral report {out}")
    if outcome.signum is not None:
        return 128 + outcome.signum
    return 0 if len(outcome.done) == len(runs) else 1


def _dry_run(args, suite, runs) -> int:
    from corral.bench import estimate

    speeds = {}
    source = f"recorded in the suite ({suite.machine})" if suite.machine else "recorded in the suite"
    if args.probe is not None:
        source = f"measured here ({args.probe:g} s probes)"
        for run in runs:
            if run.cell not in speeds:
                print(f"probing {run.cell} ...", file=sys.stderr, flush=True)
                speeds[run.cell] = estimate.probe_apart(run, args.probe)
    else:
        speeds = {r.cell: sp for r in runs if (sp := estimate.recorded(suite, r)) is not None}
    rows = estimate.plan(suite, runs, speeds)
    if args.json:
        print(json.dumps({"rows": rows, "speeds": {k: v.as_dict() for k, v in speeds.items()}}))
        return 0
    print(f"{'run':40s} {'steps':>11s} {'evals':>5s} {'CPU-h':>7s} {'memory':>9s}")
    for r in rows:
        cpu = "?" if r["cpu_hours"] is None else f"{r['cpu_hours']:.2f}"
        mem = "?" if r["memory_mb"] is None else f"{r['memory_mb'] / 1024:.2f} GiB"
        print(f"{r['run']:40s} {r['steps']:>11,} {r['evals']:>5d} {cpu:>7s} {mem:>9s}")
    known = [r["cpu_hours"] for r in rows if r["cpu_hours"] is not None]
    jobs = args.jobs or max(1, (os.cpu_count() or 1) // max(1, suite.threads))
    total = sum(known)
    print(f"{len(runs)} runs; estimated {total:.1f} CPU-hours ({total / jobs:.1f} h on {jobs} parallel jobs) "
          f"from steps/s {source}" + (f"; {len(rows) - len(known)} runs without a speed (--probe SECONDS measures "
                                      "them)" if len(known) < len(rows) else ""))
    mems = sorted((r["memory_mb"] for r in rows if r["memory_mb"]), reverse=True)
    if mems:
        print(f"memory: up to {mems[0] / 1024:.2f} GiB a run, {sum(mems[:jobs]) / 1024:.2f} GiB for the {jobs} largest at once")
    return 0


def report(args) -> int:
    from corral.bench import report as R

    if args.page:
        page = R.write_page([Path(p) for p in args.paths], Path(args.page),
                            Path(args.figures) if args.figures else None, reps=args.reps)
        print(page)
        return 0
    if args.out:  # one report from all the paths (one suite's folders, merged)
        groups = [[Path(p) for p in args.paths]]
    else:
        groups = [[Path(p)] for p in args.paths]
    for paths in groups:
        written = R.write_report(paths, Path(args.out) if args.out else None, reps=args.reps,
                                 figures=not args.no_figures)
        print("\n".join(str(w) for w in written))
    return 0
