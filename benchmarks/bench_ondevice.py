"""The on-device path on native envs.

PPO on native:CartPole-v1 (its preset in ``presets/ppo.yaml``, through the Learner like every
run): training seconds until the deterministic policy first averages >= 475 over 50 native
episodes (checked every 2 updates, evaluation time excluded), then the same policy on
Gymnasium's own CartPole-v1 (10 episodes). Also raw throughput: env steps per second of
collection + update with the preset.

SAC on Pendulum-v1 (``--sac``): corral's single-env SAC on Gymnasium Pendulum-v1 (the rl-zoo
preset through the Learner) against SAC on native:Pendulum-v1 with many envs. Both run through
``Learner.stream()``; every ``--sac-eval-every`` env steps the deterministic policy plays 5
episodes of Gymnasium Pendulum-v1 (not timed); the figure is the training time at the first
evaluation >= -200, in wall and in process CPU seconds (steadier on a shared machine), and
the gradient steps taken by then (what costs the time).

    python benchmarks/bench_ondevice.py --seeds 0 1 2 3 4
    python benchmarks/bench_ondevice.py --sac --seeds 0
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def run_ppo(seed: int, device: str) -> dict:
    import corral
    from corral.train.learner import Learner
    from corral.train.setup import build_config

    # the native:CartPole-v1 preset through the Learner; every 2 updates the deterministic
    # policy plays 50 native episodes (not counted), stopping at the first mean >= 475
    cfg = build_config("ppo", "native:CartPole-v1", seed=seed, device=device,
                       overrides={"eval.every": 2 * 16 * 64, "eval.episodes": 50, "eval.num_envs": 50,
                                  "eval.stop_at_return": 475.0, "progress": False, "tensorboard": False})
    learner = Learner(cfg, None, quiet=True)
    c0 = time.process_time()
    learner.train()
    cpu = time.process_time() - c0  # evaluations included: a bound, not the figure
    reached = next((e for e in learner.eval_history if e["eval_return"] >= 475.0), None)
    agent = corral.Agent(learner.algo, cfg)
    gym_eval = corral.evaluate(agent, "CartPole-v1", episodes=10, seed=123)["mean_return"]
    return {"seed": seed, "seconds_to_475": reached["train_seconds"] if reached else None,
            "env_steps": reached["step"] if reached else learner.env_steps, "process_cpu_seconds": round(cpu, 3),
            "native_eval": learner.eval_history[-1]["eval_return"], "gym_eval": gym_eval}


def throughput(device: str, updates: int = 20) -> dict:
    """Env steps per second of the Learner's loop on the native:CartPole-v1 preset (collection
    alone: no update is due before the rollout fills; then collection + updates)."""
    from corral.train.learner import Learner
    from corral.train.setup import build_config

    cfg = build_config("ppo", "native:CartPole-v1", seed=0, device=device,
                       overrides={"eval.episodes": 0, "progress": False, "tensorboard": False})
    learner = Learner(cfg, None, quiet=True)
    T, n = cfg.algo_cfg.n_steps, cfg.env.num_envs
    stream = learner.stream()
    next(stream)  # warm-up: one rollout and update
    t = time.perf_counter()
    for _ in range(updates):
        next(stream)
    total = time.perf_counter() - t
    steps = updates * T * n
    return {"train_steps_per_second": round(steps / total)}


def run_sac(seed: int, env_id: str, num_envs: int, steps: int, eval_every: int, sets: list[str]) -> dict:
    from corral.envs import make_vec_env
    from corral.train.evaluate import run_episodes, summarize
    from corral.train.learner import Learner
    from corral.train.setup import build_config

    cfg = build_config("sac", env_id, steps=steps, seed=seed, num_envs=num_envs,
                       sets=["progress=false", "eval.episodes=0", "tensorboard=false", *sets])
    learner = Learner(cfg, None)
    eval_env = make_vec_env("Pendulum-v1", 5, device=learner.device)
    train_s, cpu_s, next_eval, reached, last = 0.0, 0.0, eval_every, None, None
    t, c = time.perf_counter(), time.process_time()
    for _ in learner.stream():
        if learner.env_steps >= next_eval:
            train_s += time.perf_counter() - t
            cpu_s += time.process_time() - c
            next_eval += eval_every
            learner.algo.actor.eval()
            last = summarize(run_episodes(lambda o: learner.algo.act(o), eval_env, 5, seed=1000))["mean_return"]
            learner.algo.actor.train()
            if last >= -200:
                reached = (train_s, cpu_s)
                break
            t, c = time.perf_counter(), time.process_time()
    else:
        train_s += time.perf_counter() - t
        cpu_s += time.process_time() - c
    return {"seed": seed, "env": env_id, "num_envs": num_envs,
            "seconds_to_-200": round(reached[0], 1) if reached else None,
            "cpu_seconds_to_-200": round(reached[1], 1) if reached else None,
            "env_steps": learner.env_steps, "gradient_steps": learner.algo.grad_steps, "last_eval": last}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--device", default="cpu")
    p.add_argument("--sac", action="store_true", help="run the SAC comparison instead of PPO")
    p.add_argument("--sac-envs", type=int, default=16)
    p.add_argument("--sac-eval-every", type=int, default=1000)
    p.add_argument("--sac-native-set", nargs="*", default=["sac.gradient_steps=2", "sac.learning_starts=1000"],
                   help="--set overrides for the many-env native run")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    if args.sac:
        for seed in args.seeds:
            rows.append(run_sac(seed, "Pendulum-v1", 1, 20_000, args.sac_eval_every, []))
            print(rows[-1], flush=True)
            rows.append(run_sac(seed, "native:Pendulum-v1", args.sac_envs, 100_000, args.sac_eval_every,
                                args.sac_native_set))
            print(rows[-1], flush=True)
    else:
        print(throughput(args.device), flush=True)
        for seed in args.seeds:
            rows.append(run_ppo(seed, args.device))
            print(rows[-1], flush=True)
        times = [r["seconds_to_475"] for r in rows if r["seconds_to_475"] is not None]
        if times:
            print(f"seconds to deterministic eval >= 475: median {statistics.median(times):.2f}, "
                  f"max {max(times):.2f}, reached {len(times)}/{len(rows)}; "
                  f"Gymnasium eval of those policies: {[r['gym_eval'] for r in rows]}")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
