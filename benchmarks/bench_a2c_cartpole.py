"""Time to a last-20 training return of 475 on CartPole-v1: corral A2C vs Stable-Baselines3 A2C.

Both at rl-baselines3-zoo's CartPole values (``a2c.yml``: 8 envs, ``ent_coef`` 0, SB3's A2C
defaults otherwise: n_steps 5, lr 7e-4, RMSprop alpha 0.99 eps 1e-5, gae_lambda 1.0,
vf_coef 0.5, max_grad_norm 0.5, tanh 64x64 separate policy and value nets), which is what
``corral train a2c CartPole-v1`` runs. Runs alternate per seed in one process so both see
the same machine load; same Gymnasium env, same seeds, one torch thread each. Time is
training time from the first env step (imports and construction excluded), checked after
every update for corral and after every env step for SB3 (which favours SB3 slightly).

    pip install 'corral[bench]'    # stable-baselines3
    python benchmarks/bench_a2c_cartpole.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

TARGET = 475.0
BUDGET = 500_000  # rl-zoo's n_timesteps


def run_corral(seed: int) -> dict:
    from corral.train.learner import Learner
    from corral.train.setup import build_config

    cfg = build_config("a2c", "CartPole-v1", steps=BUDGET, seed=seed, stop_at_return=TARGET,
                       sets=["progress=false", "eval.episodes=0", "tensorboard=false"])
    summary = Learner(cfg, None).train()
    reached = summary["stopped_early"]
    return {"seconds": summary["train_seconds"] if reached else None, "steps": summary["env_steps"]}


def run_sb3(seed: int) -> dict:
    from stable_baselines3 import A2C
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
    model = A2C("MlpPolicy", env, ent_coef=0.0, seed=seed, device="cpu", verbose=0)
    cb = StopAt()
    model.learn(BUDGET, callback=cb)
    if cb.reached_at is None:
        return {"seconds": None, "steps": model.num_timesteps}
    return {"seconds": cb.reached_at[0], "steps": cb.reached_at[1]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    runners = {"corral": run_corral, "sb3": run_sb3}
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
        steps = [r[name]["steps"] for r in rows if r[name]["seconds"] is not None]
        # per step: the framework's speed, apart from how many steps each seed took
        rate = [r[name]["seconds"] / r[name]["steps"] * 1e6 for r in rows if r[name]["seconds"] is not None]
        summary[name] = {"median_s": med(times), "reached": f"{len(times)}/{len(rows)}",
                         "median_steps": med(steps), "median_us_per_step": med(rate)}
    summary["corral"]["ratio_vs_sb3"] = summary["corral"]["median_s"] / summary["sb3"]["median_s"]
    summary["corral"]["per_step_ratio_vs_sb3"] = (summary["corral"]["median_us_per_step"]
                                                  / summary["sb3"]["median_us_per_step"])
    if args.json:
        print(json.dumps(summary))
        return
    print(f"median time to {TARGET} (reached, median steps, us per env step):")
    for name, v in summary.items():
        ratio = (f"   ratio vs SB3 {v['ratio_vs_sb3']:.3f} (per step {v['per_step_ratio_vs_sb3']:.3f})"
                 if "ratio_vs_sb3" in v else "")
        print(f"  {name:7s} {v['median_s']:6.2f} s  ({v['reached']}, {v['median_steps']:.0f}, "
              f"{v['median_us_per_step']:.1f}){ratio}")


if __name__ == "__main__":
    main()
