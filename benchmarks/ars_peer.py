"""ARS at rl-zoo's entry, corral against sb3-contrib, the same seeds on this machine.

rl-zoo's benchmark.md gives sb3-contrib's ARS one run per env (Pendulum-v1: -212.5 +- 160.4 at
2M steps). This script trains both libraries at rl-zoo's own entry of ``ars.yml`` (Pendulum-v1:
1 env, MLP [16], lr 0.018, n_delta 4, n_top 1, delta_std 0.1, random initial policy, observation
normalization) on each seed and scores each final policy the same way: the mean return of
``--episodes`` held-out episodes of Gymnasium's env (env seeds 123, 124, ...; the policy's
deterministic action; the observation statistics frozen as at the end of training).

- corral: ``build_config("ars", ENV, zoo=True)``, as ``corral train ars ENV --zoo`` runs, on
  ``--corral-envs`` env columns (default 8: an iteration's 8 candidates play their episodes side
  by side instead of one after another; the same algorithm, a shorter run).
- sb3-contrib: ``ARS("MlpPolicy", VecNormalize(DummyVecEnv([ENV]), norm_obs=True,
  norm_reward=False), ...)`` with the entry's values, which is what rl-zoo's ``train.py`` builds
  from it (its Monitor wrapper changes nothing ARS sees).

Each run is a fresh process with one torch thread; one JSON line per run, then a summary.

    pip install 'corral[bench,zoo]'
    python benchmarks/ars_peer.py --env Pendulum-v1 --seeds 0 1 2 --json benchmarks/data/ars_pendulum.json
    python benchmarks/ars_peer.py --env Pendulum-v1 --seeds 0 --steps 20000 --episodes 3   # a check
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from bench_common import held_out


def run_corral(env_id: str, seed: int, steps: int | None, episodes: int, num_envs: int = 8) -> dict:
    import torch

    from corral.train.learner import Learner
    from corral.train.setup import build_config

    cfg = build_config("ars", env_id, zoo=True, seed=seed, steps=steps, num_envs=num_envs,
                       sets=["eval.episodes=0", "progress=false", "tensorboard=false", "checkpoint.every=1000000000"])
    learner = Learner(cfg, None, quiet=True)
    t0 = time.process_time()
    learner.train()
    cpu = time.process_time() - t0
    policy = learner.algo.actor  # normalizes inside act(), with the statistics frozen as at the end

    mean, std = held_out(lambda x: policy.act(x).numpy(), torch.as_tensor, env_id, episodes)
    return {"lib": "corral", "seed": seed, "steps": cfg.steps, "num_envs": num_envs, "return": mean, "std": std, "cpu_s": round(cpu, 1)}


def run_sb3(env_id: str, seed: int, steps: int | None, episodes: int) -> dict:
    import gymnasium as gym
    from sb3_contrib import ARS
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from corral.zoo import load_entry

    entry = dict(load_entry("ars", env_id).pairs)  # the same entry, read once (its n_timesteps as 'steps')
    venv = VecNormalize(DummyVecEnv([lambda: gym.make(env_id)]), norm_obs=True, norm_reward=False)
    model = ARS("MlpPolicy", venv, n_delta=entry["ars.n_delta"], n_top=entry["ars.n_top"],
                learning_rate=entry["ars.lr"], delta_std=entry["ars.delta_std"], zero_policy=entry["ars.zero_policy"],
                policy_kwargs=dict(net_arch=list(entry["ars.hidden"])), seed=seed, device="cpu")
    total = steps or int(entry["steps"])
    t0 = time.process_time()
    model.learn(total_timesteps=total)
    cpu = time.process_time() - t0
    venv.training = False
    mean, std = held_out(lambda x: model.predict(x, deterministic=True)[0], venv.normalize_obs, env_id, episodes)
    return {"lib": "sb3-contrib", "seed": seed, "steps": total, "return": mean, "std": std, "cpu_s": round(cpu, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="Pendulum-v1")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=None, help="budget (default: the entry's n_timesteps)")
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--libs", nargs="+", default=["corral", "sb3-contrib"])
    p.add_argument("--corral-envs", type=int, default=8, help="corral's env columns (rl-zoo's entry: 1)")
    p.add_argument("--json", help="write every run and the summary here")
    p.add_argument("--one", nargs=2, metavar=("LIB", "SEED"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        import torch

        torch.set_num_threads(1)
        if a.one[0] == "corral":
            row = run_corral(a.env, int(a.one[1]), a.steps, a.episodes, a.corral_envs)
        else:
            row = run_sb3(a.env, int(a.one[1]), a.steps, a.episodes)
        print(json.dumps(row))
        return
    rows = []
    for seed in a.seeds:
        for lib in a.libs:
            cmd = [sys.executable, __file__, "--one", lib, str(seed), "--env", a.env, "--episodes", str(a.episodes),
                   "--corral-envs", str(a.corral_envs)]
            if a.steps:
                cmd += ["--steps", str(a.steps)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            rows.append(json.loads(out))
            print(out, flush=True)
    summary = {lib: {"mean_of_seeds": statistics.fmean(r["return"] for r in rows if r["lib"] == lib),
                     "returns": [round(r["return"], 1) for r in rows if r["lib"] == lib]}
               for lib in a.libs}
    print(json.dumps(summary))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"env": a.env, "episodes": a.episodes, "runs": rows, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
