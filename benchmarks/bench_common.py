"""What the time-to-a-return benchmarks share (``bench_ppo_cartpole.py``, ``bench_a2c_cartpole.py``,
``bench_ppo_lstm.py``): a corral run and an SB3 run that stop at a last-20 training return,
timed from the first env step, and the loop over seeds that alternates the runners (so all see
the same machine load) and reports medians and ratios against the peer."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable


def run_corral(algo: str, env: str, budget: int, seed: int, target: float, sets: tuple[str, ...] = ()) -> dict:
    """corral's ``algo`` on ``env`` (its preset, then ``sets``) until the last-20 training return
    reaches ``target`` or ``budget`` env steps: ``{"seconds": training seconds or None, "steps"}``."""
    from corral.train.learner import Learner
    from corral.train.setup import build_config

    cfg = build_config(algo, env, steps=budget, seed=seed, stop_at_return=target,
                       sets=["progress=false", "eval.episodes=0", "tensorboard=false", *sets])
    summary = Learner(cfg, None).train()
    return {"seconds": summary["train_seconds"] if summary["stopped_early"] else None, "steps": summary["env_steps"]}


def stop_at_return(target: float):
    """A fresh SB3 callback: ``reached_at`` becomes ``(seconds, env steps)`` when the mean
    return of the last 20 finished episodes first reaches ``target`` (training then stops)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class StopAt(BaseCallback):
        def __init__(self):
            super().__init__()
            self.t0 = None
            self.reached_at = None

        def _on_training_start(self):
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            buf = self.model.ep_info_buffer
            if len(buf) >= 20 and sum(ep["r"] for ep in list(buf)[-20:]) / 20 >= target:
                self.reached_at = (time.perf_counter() - self.t0, self.num_timesteps)
                return False
            return True

    return StopAt()


def learn_sb3(model, budget: int, target: float) -> dict:
    """``model.learn`` until ``target`` (or the budget): the same record as :func:`run_corral`."""
    cb = stop_at_return(target)
    model.learn(budget, callback=cb)
    if cb.reached_at is None:
        return {"seconds": None, "steps": model.num_timesteps}
    return {"seconds": cb.reached_at[0], "steps": cb.reached_at[1]}


def main(runners: dict[str, Callable[[int], dict]], peer: str, target: float, default_seeds=(0, 1, 2)) -> None:
    """Parse ``--seeds``/``--json``, run every runner per seed (alternating), print each seed's
    row, then medians of the time to ``target``, env steps and microseconds per env step, with
    each corral runner's ratios against ``peer``."""
    import torch

    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, nargs="+", default=list(default_seeds))
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    for seed in args.seeds:
        row = {"seed": seed, **{name: run(seed) for name, run in runners.items()}}
        rows.append(row)
        print(f"seed {seed}: " + "   ".join(
            f"{name} {row[name]['seconds'] and round(row[name]['seconds'], 2)} s ({row[name]['steps']} steps)"
            for name in runners), flush=True)
    med = lambda xs: statistics.median(xs) if xs else float("nan")
    summary = {}
    for name in runners:
        done = [r[name] for r in rows if r[name]["seconds"] is not None]
        summary[name] = {"median_s": med([d["seconds"] for d in done]), "reached": f"{len(done)}/{len(rows)}",
                         "median_steps": med([r[name]["steps"] for r in rows]),
                         # per step: the framework's speed, apart from how many steps each seed took
                         "median_us_per_step": med([d["seconds"] / d["steps"] * 1e6 for d in done])}
    for name in runners:
        if name != peer:
            summary[name][f"ratio_vs_{peer}"] = summary[name]["median_s"] / summary[peer]["median_s"]
            summary[name][f"per_step_ratio_vs_{peer}"] = (summary[name]["median_us_per_step"]
                                                          / summary[peer]["median_us_per_step"])
    if args.json:
        print(json.dumps(summary))
        return
    print(f"median time to a last-20 return of {target} (reached, median steps, us per env step):")
    for name, v in summary.items():
        ratio = (f"   ratio vs {peer} {v[f'ratio_vs_{peer}']:.3f} (per step {v[f'per_step_ratio_vs_{peer}']:.3f})"
                 if name != peer else "")
        print(f"  {name:12s} {v['median_s']:6.2f} s  ({v['reached']}, {v['median_steps']:.0f}, "
              f"{v['median_us_per_step']:.1f}){ratio}")


def held_out(act: Callable, norm: Callable, env_id: str, episodes: int) -> tuple[float, float]:
    """Mean and std of the return of ``episodes`` Gymnasium episodes (env seeds 123 + i):
    ``act`` maps a normalized observation batch ``(1, obs_dim)`` to an action batch, ``norm``
    normalizes a raw one (the same episodes for every library a script compares)."""
    import gymnasium as gym
    import numpy as np

    env = gym.make(env_id)
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=123 + i)
        done, total = False, 0.0
        while not done:
            a = act(norm(np.asarray(obs, dtype=np.float32)[None]))[0]
            obs, r, term, trunc, _ = env.step(a)
            total += float(r)
            done = term or trunc
        returns.append(total)
    env.close()
    return float(np.mean(returns)), float(np.std(returns))
