"""Time to a last-20 training return of 475 on CartPoleNoVel-v1 (CartPole without its
velocities): corral's recurrent PPO vs sb3-contrib's RecurrentPPO.

Both at rl-baselines3-zoo's ``ppo_lstm.yml`` values for the env (8 envs, n_steps 32, batch
256, 20 epochs, gamma 0.98, GAE lambda 0.8, linear lr 1e-3 and clip 0.2, normalized
observations, a 64-unit LSTM, ReLU heads of 64), alternating per seed in one process so both
see the same machine load, one torch thread each, the same Gymnasium env (corral registers
``CartPoleNoVel-v1``; SB3 builds it with ``gym.make``). Runs:

* corral: ``corral train ppo_lstm CartPoleNoVel-v1`` (its preset: those values, one LSTM
  shared by the policy and value heads);
* corral-sep: the same with separate policy and value LSTMs (``ppo_lstm.shared_core=false``),
  the architecture of rl-zoo's preset (``enable_critic_lstm=True``): framework for framework;
* sb3-contrib at rl-zoo's values.

Time is training time from the first env step, checked after every update for corral and
after every env step for SB3 (which favours SB3 slightly).

    pip install 'corral[bench]'    # stable-baselines3, sb3-contrib
    python benchmarks/bench_ppo_lstm.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from sb3_common import stop_at_return

TARGET = 475.0
BUDGET = 150_000
ENV = "CartPoleNoVel-v1"


def run_corral(seed: int, sets: tuple[str, ...] = ()) -> dict:
    from corral.train.learner import Learner
    from corral.train.setup import build_config

    cfg = build_config("ppo_lstm", ENV, steps=BUDGET, seed=seed, stop_at_return=TARGET,
                       sets=["progress=false", "eval.episodes=0", "tensorboard=false", *sets])
    summary = Learner(cfg, None).train()
    reached = summary["stopped_early"]
    return {"seconds": summary["train_seconds"] if reached else None, "steps": summary["env_steps"]}


def run_sb3(seed: int) -> dict:
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    import corral.envs  # noqa: F401  (registers CartPoleNoVel-v1)

    env = VecNormalize(make_vec_env(ENV, n_envs=8, seed=seed), norm_obs=True, norm_reward=False)

    def lin(v):
        return lambda progress: progress * v

    model = RecurrentPPO("MlpLstmPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                         ent_coef=0.0, learning_rate=lin(1e-3), clip_range=lin(0.2), seed=seed, device="cpu",
                         verbose=0, policy_kwargs=dict(ortho_init=False, activation_fn=torch.nn.ReLU,
                                                       lstm_hidden_size=64, enable_critic_lstm=True,
                                                       net_arch=dict(pi=[64], vf=[64])))
    cb = stop_at_return(TARGET)
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
    runners = {"corral": run_corral, "corral-sep": lambda s: run_corral(s, ("ppo_lstm.shared_core=false",)),
               "sb3-contrib": run_sb3}
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
        times = [r[name]["seconds"] for r in rows if r[name]["seconds"] is not None]
        summary[name] = {"median_s": med(times), "reached": f"{len(times)}/{len(rows)}",
                         "median_steps": med([r[name]["steps"] for r in rows])}
    for name in ("corral", "corral-sep"):
        summary[name]["ratio_vs_sb3_contrib"] = summary[name]["median_s"] / summary["sb3-contrib"]["median_s"]
    if args.json:
        print(json.dumps(summary))
        return
    print(f"median time to a last-20 return of {TARGET} (reached, median steps):")
    for name, v in summary.items():
        ratio = f"   ratio vs sb3-contrib {v['ratio_vs_sb3_contrib']:.3f}" if "ratio_vs_sb3_contrib" in v else ""
        print(f"  {name:11s} {v['median_s']:6.2f} s  ({v['reached']}, {v['median_steps']:.0f}){ratio}")


if __name__ == "__main__":
    main()
