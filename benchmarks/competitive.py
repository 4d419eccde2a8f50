"""Competitive MPE games: each team trained against a fixed random opponent, held out.

For every (game, side) cell, the side's agents are trained (``env.opponents`` makes the other
side act uniformly at random) and the final policy is evaluated on fresh episodes against the
same random opponent; beside it, a random team's return against that opponent under the same
protocol (team return: the sum over the episode of the mean reward of the side's agents).

    python benchmarks/competitive.py --algo ippo --steps 60000 --seeds 0 1 2
    python benchmarks/competitive.py --algo maddpg --steps 60000 --seeds 0 --cells tag-predators

Prints one line per run and a table; ``--json FILE`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import yaml

import corral
from corral.envs.multiagent import random_team_return

# (game, trained side) -> (env id, the other side's agents: the fixed random opponent)
CELLS = {
    "tag-predators": ("mpe:simple_tag_v3", ("agent_*",)),
    "tag-prey": ("mpe:simple_tag_v3", ("adversary_*",)),
    "adversary-good": ("mpe:simple_adversary_v3", ("adversary_*",)),
    "adversary-adversary": ("mpe:simple_adversary_v3", ("agent_*",)),
}


def run_cell(algo: str, cell: str, steps: int, seed: int, episodes: int, overrides: dict) -> dict:
    env_id, opponents = CELLS[cell]
    t0 = time.process_time()
    agent = corral.train(algo, env_id, steps=steps, seed=seed, save_run=False,
                         **{"env.opponents": list(opponents), **overrides})
    cpu = time.process_time() - t0
    ev = corral.evaluate(agent, episodes=episodes, seed=10_000 + seed)  # held out: its own episodes and seeds
    base = random_team_return(env_id, opponents, episodes, 10_000 + seed, agent.cfg.env.kwargs)
    return {"algo": algo, "cell": cell, "env": env_id, "opponents": list(opponents), "seed": seed, "steps": steps,
            "eval": ev["mean_return"], "random": base, "gain": ev["mean_return"] - base, "cpu_s": cpu}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algo", default="ippo")
    p.add_argument("--steps", type=int, default=60_000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--cells", nargs="+", default=list(CELLS), choices=list(CELLS))
    p.add_argument("--episodes", type=int, default=100)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    p.add_argument("--json")
    a = p.parse_args()
    overrides = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in a.set)}  # as --set reads them
    rows = []
    for cell in a.cells:
        for seed in a.seeds:
            r = run_cell(a.algo, cell, a.steps, seed, a.episodes, overrides)
            rows.append(r)
            print(f"{a.algo} {cell} seed {seed}: eval {r['eval']:.2f}  random {r['random']:.2f}  "
                  f"gain {r['gain']:+.2f}  ({r['cpu_s']:.0f} CPU-s)", flush=True)
    print("\n| cell | env | seeds | eval (mean) | random team | gain per seed |\n|---|---|---|---|---|---|")
    for cell in a.cells:
        rs = [r for r in rows if r["cell"] == cell]
        gains = ", ".join(f"{r['gain']:+.2f}" for r in rs)
        print(f"| {cell} | {rs[0]['env']} | {len(rs)} | {np.mean([r['eval'] for r in rs]):.2f} | "
              f"{np.mean([r['random'] for r in rs]):.2f} | {gains} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
