"""corral vs Stable-Baselines3 on the rl-zoo off-policy presets, in one process.

DQN on CartPole-v1 (50k steps) and SAC on Pendulum-v1 (20k steps) with the same
hyperparameters, the same Gymnasium env and seed, one torch thread each. Reports the
training time (first env step to the end; construction excluded), the deterministic
eval return of the final policy (10 episodes) and the time ratio.

    pip install 'corral[bench]'
    python benchmarks/bench_offpolicy.py --algos dqn sac --seeds 0
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

PRESETS = {
    # algo: (env, steps, SB3 kwargs mirroring corral/presets/<algo>.yaml)
    "dqn": ("CartPole-v1", 50_000, dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000,
                                        gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
                                        exploration_fraction=0.16, exploration_final_eps=0.04,
                                        policy_kwargs=dict(net_arch=[256, 256]))),
    "sac": ("Pendulum-v1", 20_000, dict(learning_rate=1e-3)),
    "td3": ("Pendulum-v1", 20_000, dict(gamma=0.98, buffer_size=200_000, learning_starts=10_000, learning_rate=1e-3,
                                        policy_kwargs=dict(net_arch=[400, 300]))),
}


def eval_policy(act, env_id, episodes=10, seed=1000):
    import gymnasium as gym

    env = gym.make(env_id)
    rets = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        done, total = False, 0.0
        while not done:
            obs, r, term, trunc, _ = env.step(act(obs))
            total += r
            done = term or trunc
        rets.append(total)
    return float(np.mean(rets))


def run_corral(algo, seed):
    import corral
    from corral.train.learner import Learner, build_config

    env_id, steps, _ = PRESETS[algo]
    cfg = build_config(algo, env_id, steps=steps, seed=seed,
                       sets=["progress=false", "eval.episodes=0", "tensorboard=false"])
    learner = Learner(cfg, None)
    summary = learner.train()
    agent = corral.Agent(learner.algo, cfg)
    return summary["train_seconds"], eval_policy(lambda o: agent.act(o), env_id)


def run_sb3(algo, seed):
    import stable_baselines3 as sb3
    from stable_baselines3.common.noise import NormalActionNoise

    env_id, steps, kwargs = PRESETS[algo]
    kwargs = dict(kwargs)
    if algo == "td3":
        kwargs["action_noise"] = NormalActionNoise(np.zeros(1), 0.1 * np.ones(1))
    cls = {"dqn": sb3.DQN, "sac": sb3.SAC, "td3": sb3.TD3}[algo]
    model = cls("MlpPolicy", env_id, seed=seed, device="cpu", verbose=0, **kwargs)
    t0 = time.perf_counter()
    model.learn(steps)
    secs = time.perf_counter() - t0
    return secs, eval_policy(lambda o: model.predict(o, deterministic=True)[0], env_id)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--algos", nargs="+", default=["dqn", "sac"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--skip-sb3", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    out = []
    for algo in args.algos:
        for seed in args.seeds:
            ct, cr = run_corral(algo, seed)
            row = {"algo": algo, "seed": seed, "corral_s": round(ct, 1), "corral_eval": round(cr, 1)}
            if not args.skip_sb3:
                st, sr = run_sb3(algo, seed)
                row.update(sb3_s=round(st, 1), sb3_eval=round(sr, 1), ratio=round(ct / st, 3))
            print(json.dumps(row), flush=True)
            out.append(row)


if __name__ == "__main__":
    main()
