"""Speed of two checkouts of corral in one run: the same measurements alternate between them
(fresh process each, one torch thread), so both see the same machine load. For refactors
that must not cost speed.

    git worktree add /tmp/before <commit>
    python benchmarks/compare_checkouts.py /tmp/before . --repeats 5

Measurements (process CPU seconds of the training loop, steadier than wall time on a shared
machine; wall seconds too):

* ``ppo``: ``corral train ppo CartPole-v1``'s preset through the Learner, 20k steps, no eval;
* ``ondevice``: PPO on native:CartPole-v1 with its preset, 100k steps, no eval (``train_ondevice``
  where the checkout has it, else ``corral.train``);
* ``qrdqn``: ``corral train qrdqn CartPole-v1``'s preset, 20k steps, no eval;
* ``sac``: ``corral train sac Pendulum-v1``'s preset, 4k steps, no eval.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

PRESET_RUN = """
import json, time, torch, corral
torch.set_num_threads(1)
c0, t0 = time.process_time(), time.perf_counter()
agent = corral.train("{algo}", "{env}", steps={steps}, seed=0, save_run=False, **{{"eval.episodes": 0}})
print(json.dumps({{"cpu": time.process_time() - c0, "wall": time.perf_counter() - t0,
                  "episodes": agent.summary["episodes"]}}))
"""

SNIPPETS = {
    "ppo": PRESET_RUN.format(algo="ppo", env="CartPole-v1", steps=20_000),
    "qrdqn": PRESET_RUN.format(algo="qrdqn", env="CartPole-v1", steps=20_000),
    "sac": PRESET_RUN.format(algo="sac", env="Pendulum-v1", steps=4_000),
    # the on-device path: corral.ondevice before the contract refactor, the Learner after it;
    # process CPU and wall time around the whole call (construction included) for both
    "ondevice": """
import json, time, torch, corral
torch.set_num_threads(1)
c0, t0 = time.process_time(), time.perf_counter()
try:
    from corral.ondevice import train_ondevice
    episodes = train_ondevice(env_id="native:CartPole-v1", steps=100_000, seed=0, device="cpu")["summary"]["episodes"]
except ImportError:
    agent = corral.train("ppo", "native:CartPole-v1", steps=100_000, seed=0, save_run=False, **{"eval.episodes": 0})
    episodes = agent.summary["episodes"]
print(json.dumps({"cpu": time.process_time() - c0, "wall": time.perf_counter() - t0, "episodes": episodes}))
""",
}


def run(checkout: str, name: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(checkout)}
    out = subprocess.run([sys.executable, "-c", SNIPPETS[name]], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--only", nargs="*", default=list(SNIPPETS), choices=list(SNIPPETS))
    p.add_argument("--json", help="also write the report to this file")
    args = p.parse_args()
    report = {}
    for name in args.only:
        rows = {"before": [], "after": []}
        pair = (("before", args.before), ("after", args.after))
        for i in range(args.repeats):  # A B, B A, ...: neither checkout always runs first
            for label, path in pair if i % 2 == 0 else pair[::-1]:
                rows[label].append(run(path, name))
        med = {k: {m: statistics.median(r[m] for r in v) for m in ("cpu", "wall")} for k, v in rows.items()}
        report[name] = {"median": med, "cpu_ratio_after_over_before": med["after"]["cpu"] / med["before"]["cpu"],
                        "wall_ratio_after_over_before": med["after"]["wall"] / med["before"]["wall"],
                        "episodes": {k: [r["episodes"] for r in v] for k, v in rows.items()},
                        "cpu": {k: [round(r["cpu"], 3) for r in v] for k, v in rows.items()}}
        print(name, json.dumps(report[name]), flush=True)
    print(json.dumps(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"before": args.before, "after": args.after, "repeats": args.repeats, **report}, f, indent=1)


if __name__ == "__main__":
    main()
