"""Stable-Baselines3 trained by rl-zoo itself on a cell of corral's ``zoo`` suite, scored as corral's runs are.

rl-zoo's benchmark.md has one trained agent per cell, on older env ids (LunarLander-v2). To
tell seed noise from a difference between the libraries, this script trains SB3 / sb3-contrib
with rl-zoo's own training script (``python -m rl_zoo3.train --algo ALGO --env ENV --seed S``,
the bundled hyperparameters unchanged) on the seeds corral's suite uses, then scores each final
model on ``--episodes`` held-out episodes (env seeds 123, 124, ...; deterministic actions, as
rl-zoo's benchmark; VecNormalize statistics frozen where the entry normalizes). One JSON line
per run; CPU seconds of the training process.

    pip install 'corral[bench,zoo]'
    python benchmarks/zoo_peer.py a2c LunarLander-v3 --seeds 0 1 2 --json benchmarks/data/zoo_peer_a2c_ll.json
    python benchmarks/zoo_peer.py sac Pendulum-v1 --seeds 0 --steps 2000 --episodes 2   # a check that it runs
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_common import held_out


def train(algo: str, env_id: str, seed: int, folder: Path, steps: int | None = None) -> tuple[Path, float]:
    """rl-zoo's own training run (``steps``: its ``-n``, else the entry's budget); the experiment
    folder and its CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    budget = ["-n", str(steps)] if steps else []
    subprocess.run([sys.executable, "-m", "rl_zoo3.train", "--algo", algo, "--env", env_id, "--seed", str(seed),
                    "-f", str(folder), "--eval-freq", "-1", "--verbose", "0", "--num-threads", "1", *budget],
                   check=True, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    (run,) = sorted((folder / algo).glob(f"{env_id}_*"))
    return run, cpu


def score(algo: str, env_id: str, run: Path, episodes: int) -> tuple[float, float]:
    import gymnasium as gym
    from rl_zoo3 import ALGOS
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    model = ALGOS[algo].load(run / f"{env_id}.zip", device="cpu")
    stats = run / env_id / "vecnormalize.pkl"
    norm = None
    if stats.is_file():
        norm = VecNormalize.load(str(stats), DummyVecEnv([lambda: gym.make(env_id)]))
        norm.training = False
    return held_out(lambda x: model.predict(x, deterministic=True)[0], norm.normalize_obs if norm else (lambda x: x),
                    env_id, episodes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("algo")
    p.add_argument("env")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--steps", type=int, default=None, help="budget (default: the entry's n_timesteps)")
    p.add_argument("--json", help="write the runs and their mean here")
    a = p.parse_args()
    rows = []
    for seed in a.seeds:
        with tempfile.TemporaryDirectory() as tmp:
            run, cpu = train(a.algo, a.env, seed, Path(tmp), a.steps)
            mean, std = score(a.algo, a.env, run, a.episodes)
        rows.append({"lib": "rl-zoo (SB3)", "algo": a.algo, "env": a.env, "seed": seed, "return": mean, "std": std,
                     "cpu_s": round(cpu, 1)})
        print(json.dumps(rows[-1]), flush=True)
    summary = {"mean_of_seeds": statistics.fmean(r["return"] for r in rows), "returns": [r["return"] for r in rows]}
    print(json.dumps(summary))
    if a.json:
        Path(a.json).write_text(json.dumps({"episodes": a.episodes, "runs": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
