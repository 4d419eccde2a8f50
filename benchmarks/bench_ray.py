"""Distributed collection and training on Ray.

1. Collection throughput on an env-bound task: env steps per second collected in this
   process (no Ray), then by 1 and by 2 Ray collectors running flat out (each sends a
   fragment, gets the same parameters back, repeats). The env is CartPole whose step
   burns ``--env-us`` microseconds of CPU (a stand-in for a simulator), so the envs, not
   the network, bound the rate.
2. Time to a mean training return of 450 on CartPole-v1 with PPO, wall clock from the
   script's start (imports, Ray start-up and worker start-up included) to the update that
   reached it (shutdown excluded, on both sides): corral in-process,
   corral with 2 Ray collectors, and, with ``--rllib-python``, RLlib's PPO (2 env runners)
   in the same run. RLlib pins other Gymnasium versions than corral, so it runs from its
   own interpreter (a venv with ``pip install "ray[rllib]" torch``). The criteria differ
   slightly: corral stops on the mean of its last 20 training episodes, RLlib on its own
   ``episode_return_mean`` (smoothed over recent episodes, reported once per iteration).

    python benchmarks/bench_ray.py --cpus 2
    python benchmarks/bench_ray.py --cpus 2 --rllib-python /path/to/rllib-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time

import gymnasium as gym

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = 450.0


class BusyCartPole(gym.Wrapper):
    """CartPole whose ``step`` also burns ``us`` microseconds of CPU, like a heavier simulator."""

    def __init__(self, us: int = 200):
        super().__init__(gym.make("CartPole-v1"))
        self.us = us

    def step(self, action):
        end = time.perf_counter() + self.us * 1e-6
        while time.perf_counter() < end:
            pass
        return self.env.step(action)


# ---------------------------------------------------------------------------
# 1. collection throughput


def collection(args) -> dict:
    import ray

    from corral.schemes.collector import Collector, collector_state, driver_paths
    from corral.schemes.ray_scheme import RayPool
    from corral.train.setup import build_config

    spec = f"{os.path.join(HERE, 'bench_ray.py')}:BusyCartPole"
    cfg = build_config("ppo", spec, overrides={"env.num_envs": args.envs, "env.kwargs": {"us": args.env_us},
                                               "ppo.n_steps": args.fragment, "ppo.batch_size": 8})
    out = {}
    local = Collector(cfg, spec, 0, 1, paths=driver_paths())
    params = collector_state(local.algo)
    t0, steps = time.perf_counter(), 0
    while time.perf_counter() - t0 < args.seconds:
        meta, _ = local.collect(params, 0)
        steps += meta.steps
    out["in_process"] = steps / (time.perf_counter() - t0)
    local.close()

    for k in (1, 2):
        pool = RayPool(cfg, spec, k, cpus=min(1.0, args.cpus / k))
        ref = pool.put(params)
        for i in range(k):
            pool.submit(i, ref, 0, 0)
        for _ in range(k):  # warm-up: the first fragment of each collector
            for i, meta, data, err in pool.wait():
                pool.submit(i, ref, 0, 0)
        t0, steps, per = time.perf_counter(), 0, {i: 0 for i in range(k)}
        while time.perf_counter() - t0 < args.seconds:
            for i, meta, data, err in pool.wait():
                assert err is None, err
                ray.get(data)  # the learner would fetch it
                steps += meta.steps
                per[i] += meta.steps
                pool.submit(i, ref, 0, 0)
        dt = time.perf_counter() - t0
        out[f"ray_{k}_collectors"] = steps / dt
        out[f"ray_{k}_collectors_per_worker"] = [round(v / dt) for v in per.values()]
        pool.close()
    return out


# ---------------------------------------------------------------------------
# 2. time to a training return of 450 on CartPole-v1, start-up included


CORRAL_SCRIPT = textwrap.dedent("""
    import json, sys, time
    t0 = time.perf_counter()
    from corral.train.learner import Learner
    from corral.train.setup import build_config
    collectors, seed, target = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    sets = ["eval.episodes=0", "tensorboard=false", "progress=false", f"scheme.collectors={collectors}"]
    if collectors > 1:
        # each collector runs 4 envs: the batch is the in-process preset's 8 envs x 32 steps
        sets += ["env.num_envs=4", "ppo.batch_size=128"]
    learner = Learner(build_config("ppo", "CartPole-v1", steps=300_000, seed=seed, stop_at_return=target,
                                   sets=sets), None)
    t_train = time.perf_counter()
    s = learner.train()  # train_seconds: Ray start-up and the updates, up to the one that reached target
    reached = s["stopped_early"]
    print(json.dumps({"wall_seconds": t_train - t0 + s["train_seconds"] if reached else None,
                      "train_seconds": s["train_seconds"], "env_steps": s["env_steps"], "reached": reached}))
""")


def corral_ppo(collectors: int, seed: int) -> dict:
    """Seconds from the script's start (imports, Ray and worker start-up included) to the update
    that reached the target, measured as RLLIB_SCRIPT measures RLlib; shutdown not counted on
    either side."""
    res = subprocess.run([sys.executable, "-c", CORRAL_SCRIPT, str(collectors), str(seed), str(TARGET)],
                         capture_output=True, text=True)
    lines = [line for line in res.stdout.splitlines() if line.startswith("{")]
    if res.returncode != 0 or not lines:
        return {"error": (res.stderr or res.stdout)[-800:]}
    return json.loads(lines[-1])


RLLIB_SCRIPT = textwrap.dedent("""
    import json, sys, time
    t0 = time.perf_counter()
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig
    cpus, seed, target = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    ray.init(num_cpus=cpus, include_dashboard=False, logging_level="ERROR")
    # the same rl-zoo CartPole hyperparameters: 2 runners x 4 envs x 32 steps = 256 per batch
    config = (PPOConfig().environment("CartPole-v1").framework("torch").debugging(seed=seed)
              .env_runners(num_env_runners=2, num_envs_per_env_runner=4, rollout_fragment_length=32)
              .training(train_batch_size_per_learner=256, minibatch_size=256, num_epochs=20, lr=1e-3,
                        gamma=0.98, lambda_=0.8, clip_param=0.2, vf_loss_coeff=0.5, entropy_coeff=0.0,
                        grad_clip=0.5, model={"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh",
                                              "vf_share_layers": False}))
    algo = config.build()
    steps, ret = 0, float("nan")
    while steps < 300_000:
        r = algo.train()
        runners = r.get("env_runners", {})
        ret = runners.get("episode_return_mean", ret)
        steps = r.get("num_env_steps_sampled_lifetime", runners.get("num_env_steps_sampled_lifetime", steps))
        ret, steps = float(ret), int(steps)
        print(steps, ret, round(time.perf_counter() - t0, 1), file=sys.stderr, flush=True)
        if ret == ret and ret >= target:
            break
    reached = bool(ret >= target)
    print(json.dumps({"wall_seconds": time.perf_counter() - t0 if reached else None,
                      "env_steps": steps, "return": ret, "reached": reached}))
""")


def rllib_ppo(python: str, cpus: int, seed: int) -> dict:
    t0 = time.perf_counter()
    res = subprocess.run([python, "-c", RLLIB_SCRIPT, str(cpus), str(seed), str(TARGET)], capture_output=True, text=True)
    lines = [line for line in res.stdout.splitlines() if line.startswith("{")]
    if res.returncode != 0 or not lines:
        return {"error": (res.stderr or res.stdout)[-800:]}
    out = json.loads(lines[-1])
    out["process_seconds"] = time.perf_counter() - t0
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpus", type=int, default=os.cpu_count(), help="CPUs Ray may use (the rest stay free)")
    p.add_argument("--seconds", type=float, default=10.0, help="measurement window per collection setting")
    p.add_argument("--envs", type=int, default=8, help="envs per collector")
    p.add_argument("--fragment", type=int, default=64, help="steps per env in a fragment")
    p.add_argument("--env-us", type=int, default=200, help="CPU microseconds each env step burns")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--skip-collection", action="store_true")
    p.add_argument("--skip-ppo", action="store_true")
    p.add_argument("--rllib-python", help="interpreter of a venv with ray[rllib] and torch")
    args = p.parse_args()
    results: dict = {"cpus": args.cpus, "machine_cpus": os.cpu_count()}

    if not args.skip_collection:
        import ray

        ray.init(num_cpus=args.cpus, include_dashboard=False, logging_level="WARNING")
        c = collection(args)
        ray.shutdown()
        c["speedup_2_vs_1"] = c["ray_2_collectors"] / c["ray_1_collectors"]
        c["ray_1_vs_in_process"] = c["ray_1_collectors"] / c["in_process"]
        results["collection_steps_per_second"] = c
        print(json.dumps({"collection": c}), flush=True)

    if not args.skip_ppo:
        runs = {"corral_in_process": [], "corral_ray_2_collectors": [], "rllib_2_env_runners": []}
        for seed in args.seeds:  # alternate, so every contender sees the same machine load
            runs["corral_in_process"].append(corral_ppo(1, seed))
            runs["corral_ray_2_collectors"].append(corral_ppo(2, seed))
            if args.rllib_python:
                runs["rllib_2_env_runners"].append(rllib_ppo(args.rllib_python, args.cpus, seed))
            print(json.dumps({k: v[-1] for k, v in runs.items() if v}), flush=True)
        results["time_to_450"] = runs
        med = {}
        for k, v in runs.items():
            times = sorted(r["wall_seconds"] for r in v if r.get("wall_seconds"))
            if times:
                med[k] = times[len(times) // 2]
        results["median_wall_seconds"] = med
        # per seed, from the same run: how many times longer RLlib took than corral on Ray
        results["rllib_over_corral_ray_per_seed"] = [
            round(r["wall_seconds"] / c["wall_seconds"], 2) if r.get("wall_seconds") and c.get("wall_seconds") else None
            for c, r in zip(runs["corral_ray_2_collectors"], runs["rllib_2_env_runners"])]
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
