"""TRPO step time on CartPole-v1: corral's ``trpo`` against sb3-contrib's ``TRPO``, same settings.

Both at rl-baselines3-zoo's CartPole-v1 entry (``trpo.yml``: 2 envs, n_steps 512, batch_size 512,
cg_damping 1e-3, gae_lambda 0.98, gamma 0.99, lr 1e-3, 20 critic epochs; sb3-contrib's defaults
otherwise: target_kl 0.01, 15 CG steps, line search 0.8 x 10, 64x64 tanh networks), which is what
``corral train trpo CartPole-v1`` runs. Each measurement is a fresh process (imports, env and
model construction excluded from the timing; one torch thread), run in the order A B B A per
round so both see the same drift in machine load. Reported per env step: wall and process CPU
microseconds, and the ratios corral / sb3-contrib (below 1: corral is faster).

    pip install 'corral[bench]' sb3-contrib
    python benchmarks/trpo_speed.py --steps 100000 --rounds 3
    python benchmarks/trpo_speed.py --steps 2048 --rounds 1     # a check that it runs
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

ENV = "CartPole-v1"
ZOO = dict(n_envs=2, n_steps=512, batch_size=512, cg_damping=1e-3, gae_lambda=0.98, gamma=0.99, learning_rate=1e-3,
           n_critic_updates=20)


def time_corral(steps: int, seed: int) -> dict:
    from corral.train.learner import Learner
    from corral.train.setup import build_config

    cfg = build_config("trpo", ENV, steps=steps, seed=seed,
                       sets=["eval.episodes=0", "progress=false", "tensorboard=false", "checkpoint.every=1000000000",
                             f"env.num_envs={ZOO['n_envs']}", f"trpo.n_steps={ZOO['n_steps']}",
                             f"trpo.batch_size={ZOO['batch_size']}", f"trpo.cg_damping={ZOO['cg_damping']}",
                             f"trpo.gae_lambda={ZOO['gae_lambda']}", f"trpo.gamma={ZOO['gamma']}",
                             f"trpo.lr={ZOO['learning_rate']}", f"trpo.n_critic_updates={ZOO['n_critic_updates']}"])
    learner = Learner(cfg, None, quiet=True)
    w0, c0 = time.perf_counter(), time.process_time()
    learner.train()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    return {"steps": learner.env_steps, "wall": wall, "cpu": cpu, "last20_return": learner.last20_return}


def time_sb3(steps: int, seed: int) -> dict:
    from sb3_contrib import TRPO
    from stable_baselines3.common.env_util import make_vec_env

    kw = {k: v for k, v in ZOO.items() if k != "n_envs"}
    env = make_vec_env(ENV, n_envs=ZOO["n_envs"], seed=seed)
    model = TRPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kw)
    w0, c0 = time.perf_counter(), time.process_time()
    model.learn(total_timesteps=steps)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    returns = [ep["r"] for ep in list(model.ep_info_buffer)[-20:]]
    return {"steps": int(model.num_timesteps), "wall": wall, "cpu": cpu,
            "last20_return": sum(returns) / len(returns) if returns else float("nan")}


RUNNERS = {"corral": time_corral, "sb3": time_sb3}


def one(which: str, steps: int, seed: int) -> dict:
    """Run one measurement in a fresh Python process; its result as a dict."""
    out = subprocess.run([sys.executable, __file__, "--one", which, "--steps", str(steps), "--seed", str(seed)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100_000, help="env steps per measurement (rl-zoo's budget: 100k)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of A B B A (corral sb3 sb3 corral)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--one", choices=sorted(RUNNERS), help=argparse.SUPPRESS)  # a child: one measurement
    args = p.parse_args()
    if args.one:
        import torch

        torch.set_num_threads(1)
        print(json.dumps(RUNNERS[args.one](args.steps, args.seed)))
        return
    runs: dict[str, list[dict]] = {"corral": [], "sb3": []}
    for r in range(args.rounds):
        for which in ("corral", "sb3", "sb3", "corral"):
            res = one(which, args.steps, args.seed + r)
            runs[which].append(res)
            print(f"round {r} {which:6s}: {res['steps']} steps, wall {res['wall']:.2f} s, cpu {res['cpu']:.2f} s, "
                  f"{1e6 * res['wall'] / res['steps']:.1f} us/step wall, last-20 return {res['last20_return']:.1f}",
                  flush=True)
    per = {k: {m: statistics.median(x[m] / x["steps"] for x in v) * 1e6 for m in ("wall", "cpu")}
           for k, v in runs.items()}
    print(f"\nmedian us per env step ({args.rounds} rounds of A B B A, {args.steps} steps each):")
    for k, v in per.items():
        print(f"  {k:6s}: wall {v['wall']:.1f}, cpu {v['cpu']:.1f}")
    print(f"ratio corral / sb3-contrib: wall {per['corral']['wall'] / per['sb3']['wall']:.2f}x, "
          f"cpu {per['corral']['cpu'] / per['sb3']['cpu']:.2f}x")


if __name__ == "__main__":
    main()
