"""Steps per second of native CartPole-v1 against raw Gymnasium, random actions.

    python benchmarks/bench_native_envs.py [--device cuda] [--seconds 2] [--sizes 1 1024 65536 1000000]

Gymnasium: one ``gymnasium.make("CartPole-v1")`` env (its default wrappers included)
stepped with ``action_space.sample()`` and reset when an episode ends. Native: a batch
of N envs stepped with ``torch.randint`` actions drawn on the device, autoreset
included. Both run in this process, one after the other, on one CPU thread unless
``--threads`` says otherwise.

What bounds the CPU numbers: at N=1 the ~40 tensor ops of a step cost more in
dispatch than Gymnasium's whole step (use the sync backend for a handful of envs);
at large N, the fresh output tensors of every step (about 50 MB at N=1,000,000) are
new pages from the OS, and the page faults cost more than the physics. PyTorch's
``THP_MEM_ALLOC_ENABLE=1`` (huge pages) or a caching malloc (jemalloc, tcmalloc via
LD_PRELOAD) lowers that cost; on CUDA the caching allocator removes it.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import torch

from corral.envs.native import make_native


def gym_steps_per_second(env_id: str, seconds: float) -> float:
    env = gym.make(env_id)
    env.reset(seed=0)
    env.action_space.seed(0)
    steps, start = 0, time.perf_counter()
    while True:
        for _ in range(1000):  # check the clock now and then, not every step
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
        steps += 1000
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return steps / elapsed


def native_steps_per_second(env_id: str, num_envs: int, device: torch.device, seconds: float) -> float:
    env = make_native(env_id, num_envs, device=device, seed=0)
    gen = torch.Generator(device=device).manual_seed(0)
    n_actions = env.single_action_space.n

    def step() -> None:
        env.step(torch.randint(0, n_actions, (num_envs,), generator=gen, device=device))

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(5):  # warm up allocator and kernels
        step()
    sync()
    iters, start = 0, time.perf_counter()
    while True:
        step()
        iters += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            sync()
            return iters * num_envs / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seconds", type=float, default=2.0, help="time per measurement")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 1024, 65536, 1_000_000])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    base = gym_steps_per_second(args.env, args.seconds)
    print(f"{args.env}, device={device}, torch threads={args.threads}, {args.seconds:g} s per row")
    print(f"{'backend':<28}{'steps/s':>16}{'vs gymnasium':>14}")
    print(f"{'gymnasium (1 env)':<28}{base:>16,.0f}{1.0:>13.1f}x")
    for n in args.sizes:
        rate = native_steps_per_second(args.env, n, device, args.seconds)
        print(f"{f'native N={n:,}':<28}{rate:>16,.0f}{rate / base:>13.1f}x")


if __name__ == "__main__":
    main()
