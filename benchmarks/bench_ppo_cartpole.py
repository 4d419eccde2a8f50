"""Time to a last-20 training return of 475 on CartPole-v1: corral PPO vs Stable-Baselines3 PPO.

Both use rl-baselines3-zoo's tuned CartPole hyperparameters (8 envs, n_steps 32, batch 256,
20 epochs, gamma 0.98, GAE lambda 0.8, linear lr 1e-3 and clip 0.2, tanh 64x64 separate
policy and value nets), the same Gymnasium env, the same seeds, one torch thread each, in
one process, alternating so both see the same machine load. Time is training time from the
first env step (imports and construction excluded), checked after every update for corral and
after every env step for SB3 (which favours SB3 slightly).

    pip install 'corral[bench]'    # stable-baselines3
    python benchmarks/bench_ppo_cartpole.py --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

TARGET = 475.0
BUDGET = 100_000


def run_corral(seed: int) -> dict:
    from corral.train.learner import Learner, build_config

    cfg = build_config("ppo", "CartPole-v1", steps=BUDGET, seed=seed, stop_at_return=TARGET,
                       sets=["progress=false", "eval.episodes=0", "tensorboard=false"])
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
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    for seed in args.seeds:
        c = run_corral(seed)
        s = run_sb3(seed)
        rows.append({"seed": seed, "corral": c, "sb3": s})
        print(f"seed {seed}: corral {c['seconds'] and round(c['seconds'], 2)} s ({c['steps']} steps)   "
              f"sb3 {s['seconds'] and round(s['seconds'], 2)} s ({s['steps']} steps)", flush=True)
    med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    c_t = [r["corral"]["seconds"] for r in rows if r["corral"]["seconds"] is not None]
    s_t = [r["sb3"]["seconds"] for r in rows if r["sb3"]["seconds"] is not None]
    summary = {
        "corral_median_s": med(c_t), "sb3_median_s": med(s_t),
        "corral_reached": f"{len(c_t)}/{len(rows)}", "sb3_reached": f"{len(s_t)}/{len(rows)}",
        "ratio_corral_over_sb3": med(c_t) / med(s_t) if c_t and s_t else None,
        "corral_median_steps": med([r["corral"]["steps"] for r in rows]),
        "sb3_median_steps": med([r["sb3"]["steps"] for r in rows]),
    }
    print(json.dumps(summary) if args.json else
          f"median time to {TARGET}: corral {summary['corral_median_s']:.2f} s, SB3 {summary['sb3_median_s']:.2f} s, "
          f"ratio {summary['ratio_corral_over_sb3']:.3f}  (reached: corral {summary['corral_reached']}, "
          f"SB3 {summary['sb3_reached']})")


if __name__ == "__main__":
    main()
