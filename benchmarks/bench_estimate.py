"""How close `corral bench SUITE --dry-run --probe S` comes to what the runs then cost.

For each chosen cell of a suite (budgets scaled down so the real runs are short): probe its speed
as the dry run does, predict the run's CPU seconds, then run it through `corral bench` and read
the CPU seconds it spent (``result.json``). Prints the ratio estimate / measured per run.

    python benchmarks/bench_estimate.py mujoco --only sac/HalfCheetah tqc/Hopper --steps-scale 0.03
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("suite")
    p.add_argument("--only", nargs="+", required=True)
    p.add_argument("--steps-scale", type=float, default=0.03)
    p.add_argument("--probe", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    from corral.bench import estimate
    from corral.bench.suite import load_suite

    suite = load_suite(args.suite)
    runs = suite.runs(seeds=[args.seed], steps_scale=args.steps_scale, only=args.only)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            speed = estimate.probe_apart(run, args.probe)
            predicted = estimate.seconds(speed, run, estimate.evaluations(run))
            only = ["--only", run.cell, "--seeds", str(run.seed), "--steps-scale", str(args.steps_scale)]
            cmd = [sys.executable, "-c", "import sys; from corral.cli import main; sys.exit(main())", "bench",
                   args.suite, "--out", tmp, "--jobs", "1", "--no-live", *only]
            subprocess.run(cmd, check=True, capture_output=True)
            result = json.loads((Path(tmp) / "runs" / run.name / "result.json").read_text())
            rows.append({"run": run.name, "steps": run.steps, "probe": speed.as_dict(),
                         "estimated_cpu_s": round(predicted, 1), "measured_cpu_s": result["cpu_s"],
                         "ratio": round(predicted / result["cpu_s"], 3)})
            print(json.dumps(rows[-1]), flush=True)
    worst = max(abs(r["ratio"] - 1) for r in rows)
    print(f"largest error of the estimate: {100 * worst:.1f}%")


if __name__ == "__main__":
    main()
