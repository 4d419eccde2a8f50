"""Env steps per second of corral's vector backends next to raw Gymnasium, random actions.

    python benchmarks/bench_envs.py [--envs CartPole-v1 Pong] [--num-envs 8] [--seconds 2]
                                    [--rounds 3] [--backends sync subproc envpool] [--json out.json]

For each env, in this process and one after the other (rounds interleaved, the best
round kept, so load from other processes on the machine hurts every variant alike):

* raw: a plain loop over N ``gymnasium.make(id)`` envs (for Atari, the same Gymnasium
  preprocessing wrappers corral applies), ``env.step`` with actions pre-generated as
  numpy, ``env.reset()`` by hand when an episode ends;
* raw-lean: the same loop over envs built as corral builds them, which for Gymnasium's own
  ids leaves out the two pass-through wrappers ``gymnasium.make`` adds (OrderEnforcing and
  the env checker; see ``corral.envs.make.lean_spec``): "sync / raw-lean" is what corral's
  own code costs, "sync / raw" what a user gets against their own loop;
* gym-vector: Gymnasium's ``SyncVectorEnv`` over the same envs, for context;
* corral backends: ``make_vec_env(id, N, backend=...)`` stepped with the same actions
  pre-generated as torch tensors; their steps include everything the contract gives
  (torch tensors, final observations, episode statistics, action and finite checks).

"vs raw" is steps/s over raw steps/s (wall clock); "CPU vs raw" the same with this
process's CPU time, for the variants that step in this process only: on a machine shared
with other work it is the steadier measure of what a backend adds. The goal for ``sync``
is at least 0.91 (at most 10% slower than raw). A family whose package is missing is
skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import gymnasium as gym
import numpy as np
import torch

from corral.envs import make_factory, make_vec_env
from corral.errors import UserError

DEFAULT_ENVS = ["CartPole-v1", "LunarLander-v3", "HalfCheetah-v5", "Pong"]
POOL = 1024  # distinct action rows, cycled


def make_actions(space: gym.Space, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if isinstance(space, gym.spaces.Discrete):
        return (space.start + rng.integers(0, space.n, size=(POOL, n))).astype(np.int64)
    low, high = np.broadcast_to(space.low, space.shape), np.broadcast_to(space.high, space.shape)
    return rng.uniform(low, high, size=(POOL, n, *space.shape)).astype(space.dtype)


def timed(step, seconds: float) -> tuple[int, float, float]:
    """Call ``step(k)`` for k = 0, 1, ... for about ``seconds``; (calls, wall s, CPU s of this process)."""
    k, start, cpu = 0, time.perf_counter(), time.process_time()
    while True:
        for _ in range(50):  # check the clock now and then, not every step
            step(k)
            k += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return k, elapsed, time.process_time() - cpu


def default_factory(factory):
    """``gymnasium.make`` as a user calls it, for the id ``factory`` (corral's) builds."""
    if getattr(factory, "atari", None) is not None or not hasattr(factory, "make_id"):
        return factory  # Atari: the preprocessing is corral's; its envs are not made lean
    return lambda: gym.make(factory.make_id, **factory.kwargs)


def bench_raw(factory, n: int, actions: np.ndarray, seconds: float) -> float:
    envs = [factory() for _ in range(n)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    rows = list(actions)

    def step(k: int) -> None:
        for env, a in zip(envs, rows[k % POOL]):
            _, _, terminated, truncated, _ = env.step(a)
            if terminated or truncated:
                env.reset()

    calls, elapsed, cpu = timed(step, seconds)
    for env in envs:
        env.close()
    return calls * n / elapsed, calls * n / cpu


def bench_gym_vector(factory, n: int, actions: np.ndarray, seconds: float) -> float:
    env = gym.vector.SyncVectorEnv([factory] * n)
    env.reset(seed=0)
    rows = list(actions)
    calls, elapsed, cpu = timed(lambda k: env.step(rows[k % POOL]), seconds)
    env.close()
    return calls * n / elapsed, calls * n / cpu


def bench_corral(env_id: str, n: int, backend: str, actions: np.ndarray, seconds: float) -> float:
    env = make_vec_env(env_id, n, backend=backend)
    env.reset(seed=0)
    rows = [torch.from_numpy(a.copy()) for a in actions]
    try:
        calls, elapsed, cpu = timed(lambda k: env.step(rows[k % POOL]), seconds)
    finally:
        env.close()
    return calls * n / elapsed, calls * n / cpu


def available_backends(wanted: list[str]) -> list[str]:
    out = []
    for b in wanted:
        if b == "envpool":
            try:
                import envpool  # noqa: F401
            except ImportError:
                print("envpool is not installed: skipping its backend (pip install 'corral[envpool]')")
                continue
        out.append(b)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", nargs="+", default=DEFAULT_ENVS)
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best is kept")
    p.add_argument("--backends", nargs="+", default=["sync", "subproc", "envpool"])
    p.add_argument("--no-gym-vector", action="store_true", help="leave out Gymnasium's SyncVectorEnv")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    n = args.num_envs
    backends = available_backends(args.backends)
    print(f"{os.cpu_count()} CPU cores, torch {torch.__version__}, gymnasium {gym.__version__}, N={n} envs, "
          f"{args.rounds} rounds of {args.seconds:g}s, best kept\n")
    results = []
    for env_id in args.envs:
        try:
            factory = make_factory(env_id)
            probe = factory()
        except UserError as e:
            print(f"{env_id}: skipped ({e})\n")
            continue
        actions = make_actions(probe.action_space, n)
        probe.close()
        variants = {"raw": lambda: bench_raw(default_factory(factory), n, actions, args.seconds),
                    "raw-lean": lambda: bench_raw(factory, n, actions, args.seconds)}
        if not args.no_gym_vector:
            variants["gym-vector"] = lambda: bench_gym_vector(default_factory(factory), n, actions, args.seconds)
        for b in backends:
            variants[b] = lambda b=b: bench_corral(env_id, n, b, actions, args.seconds)
        best: dict[str, float] = {}
        best_cpu: dict[str, float] = {}
        for _ in range(args.rounds):
            for name, run in variants.items():
                try:
                    sps, cpu_sps = run()
                except UserError as e:  # e.g. an id EnvPool does not implement
                    print(f"{env_id} / {name}: skipped ({e})")
                    variants = {k: v for k, v in variants.items() if k != name}
                    break
                best[name] = max(best.get(name, 0.0), sps)
                best_cpu[name] = max(best_cpu.get(name, 0.0), cpu_sps)
        raw, raw_cpu = best["raw"], best_cpu["raw"]
        print(f"{env_id}")
        print(f"  {'variant':<12} {'steps/s':>10} {'vs raw':>7} {'CPU vs raw':>11}")
        for name, sps in best.items():
            # CPU time of this process: robust to other load, but meaningless where the work
            # runs in other processes (subproc) or threads (envpool).
            in_process = name in ("raw", "raw-lean", "gym-vector", "sync")
            cpu_ratio = f"{best_cpu[name] / raw_cpu:>11.3f}" if in_process else f"{'-':>11}"
            print(f"  {name:<12} {sps:>10,.0f} {sps / raw:>7.3f} {cpu_ratio}")
            results.append({"env": env_id, "variant": name, "num_envs": n, "steps_per_s": sps, "ratio_vs_raw": sps / raw,
                            "cpu_ratio_vs_raw": best_cpu[name] / raw_cpu if in_process else None})
        if "sync" in best:
            print(f"  sync / raw-lean (corral's own cost): {best['sync'] / best['raw-lean']:.3f}, "
                  f"CPU {best_cpu['sync'] / best_cpu['raw-lean']:.3f}")
        print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
