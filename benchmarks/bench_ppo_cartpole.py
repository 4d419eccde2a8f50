"""Time to a last-20 training return of 475 on CartPole-v1: corral PPO vs Stable-Baselines3 PPO.

Three runs per seed, alternating in one process so all see the same machine load:

* corral: what ``corral train ppo CartPole-v1`` does (its preset: rl-zoo's values but 10
  epochs at lr 3e-3 instead of 20 at 1e-3);
* corral-zoo: corral at exactly rl-baselines3-zoo's tuned CartPole hyperparameters (8 envs,
  n_steps 32, batch 256, 20 epochs, gamma 0.98, GAE lambda 0.8, linear lr 1e-3 and clip 0.2,
  tanh 64x64 separate policy and value nets): the framework-for-framework comparison;
* SB3 at those rl-zoo values.

Same Gymnasium env, same seeds, one torch thread each. Time is training time from the
first env step (imports and construction excluded), checked after every update for corral and
after every env step for SB3 (which favours SB3 slightly).

    pip install 'corral[bench]'    # stable-baselines3
    python benchmarks/bench_ppo_cartpole.py --seeds 0 1 2 3 4 5 6 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

TARGET = 475.0
BUDGET = 100_000


# rl-zoo's values where corral's CartPole preset differs (it trains 10 epochs at lr 3e-3)
ZOO = ["ppo.n_epochs=20", "ppo.lr=0.001"]


def run_corral(seed: int, zoo: bool = False) -> dict:
    from corral.train.learner import Learner
    from corral.train.setup import build_config

    cfg = build_config("ppo", "CartPole-v1", steps=BUDGET, seed=seed, stop_at_return=TARGET,
                       sets=["progress=false", "eval.episodes=0", "tensorboard=false"] + (ZOO if zoo else []))
    learner = Learner(cfg, None)
    summary = learner.train()
    reached = summary["stopped_early"]
    return {"seconds": summary["train_seconds"] if reached else None, "steps": summary["env_steps"]}


def run_sb3(seed: int) -> dict:
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    class StopAt(BaseCallback):
        def __init__(self):
            super().__init__()
            self.t0 = None
            self.reached_at = None

        def _on_training_start(self):
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            buf = self.model.ep_info_buffer
            if len(buf) >= 20:
                last = [ep["r"] for ep in list(buf)[-20:]]
                if sum(last) / 20 >= TARGET:
                    self.reached_at = (time.perf_counter() - self.t0, self.num_timesteps)
                    return False
            return True

    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)

    def lin(v):
        return lambda progress: progress * v

    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                ent_coef=0.0, learning_rate=lin(1e-3), clip_range=lin(0.2), seed=seed, device="cpu", verbose=0)
    cb = StopAt()
    model.learn(BUDGET, callback=cb)
    if cb.reached_at is None:
        return {"seconds": None, "steps": model.num_timesteps}
    return {"seconds": cb.reached_at[0], "steps": cb.reached_at[1]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5, 6, 7])
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    runners = {"corral": run_corral, "corral-zoo": lambda s: run_corral(s, zoo=True), "sb3": run_sb3}
    rows = []
    for seed in args.seeds:
        row = {"seed": seed, **{name: run(seed) for name, run in runners.items()}}
        rows.append(row)
        print(f"seed {seed}: " + "   ".join(
            f"{name} {row[name]['seconds'] and round(row[name]['seconds'], 2)} s ({row[name]['steps']} steps)"
            for name in runners), flush=True)
    med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    summary = {}
    for name in runners:
        times = [r[name]["seconds"] for r in rows if r[name]["seconds"] is not None]
        summary[name] = {"median_s": med(times), "reached": f"{len(times)}/{len(rows)}",
                         "median_steps": med([r[name]["steps"] for r in rows])}
    for name in ("corral", "corral-zoo"):
        summary[name]["ratio_vs_sb3"] = summary[name]["median_s"] / summary["sb3"]["median_s"]
    if args.json:
        print(json.dumps(summary))
        return
    print(f"median time to {TARGET} (reached, median steps):")
    for name, v in summary.items():
        ratio = f"   ratio vs SB3 {v['ratio_vs_sb3']:.3f}" if "ratio_vs_sb3" in v else ""
        print(f"  {name:11s} {v['median_s']:6.2f} s  ({v['reached']}, {v['median_steps']:.0f}){ratio}")


if __name__ == "__main__":
    main()
