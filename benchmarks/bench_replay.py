"""Replay buffer throughput against Stable-Baselines3, and the memory of a 5M-transition buffer.

    python benchmarks/bench_replay.py              # insert / sample throughput, with ratios to SB3
    python benchmarks/bench_replay.py --memory     # resident memory of 5M BipedalWalker transitions

Shapes are BipedalWalker's (24-dim float obs, 4-dim float action). Each library
gets its native inputs (torch tensors for corral, numpy arrays for SB3), made
before timing. SB3 has no prioritized replay, so the prioritized figures are
compared with SB3's uniform buffer as a reference point only.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

torch.set_num_threads(1)

OBS_DIM, ACT_DIM = 24, 4


def spaces():
    import gymnasium as gym

    return (
        gym.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32),
        gym.spaces.Box(-1.0, 1.0, (ACT_DIM,), np.float32),
    )


def stream(steps: int, num_envs: int, seed: int = 0, done_every: int = 200):
    """Random transitions; about one episode end per ``done_every`` steps per env."""
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((steps + 1, num_envs, OBS_DIM), dtype=np.float32)
    return dict(
        obs=obs[:-1],
        next_obs=obs[1:],
        action=rng.uniform(-1, 1, (steps, num_envs, ACT_DIM)).astype(np.float32),
        reward=rng.standard_normal((steps, num_envs), dtype=np.float32),
        terminated=rng.random((steps, num_envs)) < 0.5 / done_every,
        truncated=rng.random((steps, num_envs)) < 0.5 / done_every,
    )


def rss_bytes() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "RssAnon:", "RssFile:")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) * 1024
    return out


# ---------------------------------------------------------------------------------------------
# throughput


def corral_runner(cls, data, capacity, num_envs, batch_size, sample_iters, **kw):
    obs_space, act_space = spaces()
    t = {k: torch.from_numpy(v) for k, v in data.items()}
    steps = data["obs"].shape[0]
    rows = [tuple(t[k][i] for k in ("obs", "action", "reward", "terminated", "truncated", "next_obs"))
            for i in range(steps)]

    def run() -> tuple[float, float, float]:
        buf = cls(capacity, num_envs, obs_space, act_space, seed=0, **kw)
        start = time.perf_counter()
        for row in rows:
            buf.add(*row)
        insert = steps * num_envs / (time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(sample_iters):
            buf.sample(batch_size)
        sample = sample_iters / (time.perf_counter() - start)
        update = float("nan")
        if hasattr(buf, "update_priorities"):
            td = torch.rand(batch_size)
            start = time.perf_counter()
            for _ in range(sample_iters):
                batch = buf.sample(batch_size)
                buf.update_priorities(batch.indices, td)
            update = sample_iters / (time.perf_counter() - start)
        return insert, sample, update

    return run


def sb3_runner(data, capacity, num_envs, batch_size, sample_iters):
    from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer

    obs_space, act_space = spaces()
    steps = data["obs"].shape[0]
    done = data["terminated"] | data["truncated"]
    infos = [[{"TimeLimit.truncated": bool(tr)} for tr in row] for row in data["truncated"]]
    rows = [(data["obs"][i], data["next_obs"][i], data["action"][i], data["reward"][i], done[i], infos[i])
            for i in range(steps)]

    def run() -> tuple[float, float, float]:
        buf = SB3ReplayBuffer(capacity, obs_space, act_space, device="cpu", n_envs=num_envs)
        start = time.perf_counter()
        for row in rows:
            buf.add(*row)
        insert = steps * num_envs / (time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(sample_iters):
            buf.sample(batch_size)
        sample = sample_iters / (time.perf_counter() - start)
        return insert, sample, float("nan")

    return run


def throughput(args) -> None:
    from corral.storage.prioritized import PrioritizedReplayBuffer
    from corral.storage.replay import ReplayBuffer

    print(f"torch {torch.__version__}, threads={torch.get_num_threads()}, batch={args.batch_size}, "
          f"capacity={args.capacity}, obs={OBS_DIM} action={ACT_DIM} (float32), "
          f"best of {args.repeats} interleaved repeats")
    print(f"{'num_envs':>8} {'buffer':<24} {'insert trans/s':>15} {'sample batch/s':>15} "
          f"{'sample+update/s':>16} {'insert vs SB3':>14} {'sample vs SB3':>14}")
    for num_envs in args.num_envs:
        data = stream(args.insert_transitions // num_envs, num_envs)
        common = (data, args.capacity, num_envs, args.batch_size, args.sample_iters)
        runners = {
            "sb3 ReplayBuffer": sb3_runner(*common),
            "corral ReplayBuffer": corral_runner(ReplayBuffer, *common),
            "corral ReplayBuffer n=3": corral_runner(ReplayBuffer, *common, n_step=3),
            "corral Prioritized": corral_runner(PrioritizedReplayBuffer, *common),
        }
        # The machine is shared: interleave the runs and keep each one's best.
        best = {name: [0.0, 0.0, 0.0] for name in runners}
        for _ in range(args.repeats):
            for name, run in runners.items():
                result = run()
                best[name] = [max(b, r) if r == r else b for b, r in zip(best[name], result)]
        sb3_insert, sb3_sample, _ = best["sb3 ReplayBuffer"]
        for name, (ins, smp, upd) in best.items():
            upd_text = f"{upd:,.0f}" if upd else "-"
            print(f"{num_envs:>8} {name:<24} {ins:>15,.0f} {smp:>15,.0f} {upd_text:>16} "
                  f"{ins / sb3_insert:>13.2f}x {smp / sb3_sample:>13.2f}x")


# ---------------------------------------------------------------------------------------------
# memory


def memory(args) -> None:
    from corral.storage.replay import ReplayBuffer

    base = rss_bytes()
    obs_space, act_space = spaces()
    num_envs = args.memory_envs
    buf = ReplayBuffer(args.memory_capacity, num_envs, obs_space, act_space, seed=0)
    allocated = rss_bytes()
    chunk = stream(1000, num_envs, done_every=500)
    t = {k: torch.from_numpy(v) for k, v in chunk.items()}
    rows = buf.capacity_per_env
    start = time.perf_counter()
    for i in range(rows):
        j = i % 1000
        buf.add(t["obs"][j], t["action"][j], t["reward"][j], t["terminated"][j], t["truncated"][j], t["next_obs"][j])
    fill_s = time.perf_counter() - start
    filled = rss_bytes()
    batch = buf.sample(256)
    assert batch.obs.shape == (256, OBS_DIM)

    mib = lambda n: f"{n / 2**20:8.1f} MiB"  # noqa: E731
    print(f"{buf.capacity:,} transitions, num_envs={num_envs}, filled in {fill_s:.1f} s "
          f"({buf.capacity / fill_s:,.0f} transitions/s); final-obs store {buf._final_keys.numel():,} entries")
    line = lambda label, value: print(f"  {label:<38}{value}")  # noqa: E731
    line("storage tensors (buffer.nbytes)", mib(buf.nbytes))
    for name, tensor in (("obs", buf._obs), ("action", buf._action), ("reward", buf._reward),
                         ("flags", buf._flags), ("final_obs", buf._final_obs), ("final_keys", buf._final_keys)):
        print(f"    {name:<12} {str(tuple(tensor.shape)):<18} {str(tensor.dtype):<14} {mib(tensor.nbytes)}")
    line("VmRSS after imports (torch, corral)", mib(base["VmRSS"]))
    line("VmRSS after allocating", mib(allocated["VmRSS"]))
    line("VmRSS after filling", f"{mib(filled['VmRSS'])}  (RssAnon {mib(filled['RssAnon']).strip()}, "
         f"RssFile {mib(filled['RssFile']).strip()})")
    line("growth from allocating and filling", mib(filled["VmRSS"] - base["VmRSS"]))
    gb = lambda n: f"{n / 1e9:.3f} GB"  # noqa: E731
    growth = filled["VmRSS"] - base["VmRSS"]
    per = buf.nbytes / buf.capacity
    print(f"  bytes per transition: {per:.1f} (obs {buf._obs[0, 0].nbytes}, action {buf._action[0, 0].nbytes}, "
          "reward 4, flags 1, + final-obs side store)")
    goal = 0.75e9
    print(f"  goal <= 0.75 GB: buffer (allocated and filled) {gb(growth)} -> {'met' if growth <= goal else 'NOT met'}; "
          f"whole process {gb(filled['VmRSS'])} -> {'met' if filled['VmRSS'] <= goal else 'NOT met'} "
          f"(of which {gb(base['VmRSS'])} before the buffer: the interpreter, torch, gymnasium, corral)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memory", action="store_true", help="measure resident memory of a 5M buffer instead")
    parser.add_argument("--capacity", type=int, default=100_000)
    parser.add_argument("--insert-transitions", type=int, default=20_000)
    parser.add_argument("--sample-iters", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory-capacity", type=int, default=5_000_000)
    parser.add_argument("--memory-envs", type=int, default=16)
    args = parser.parse_args()
    memory(args) if args.memory else throughput(args)


if __name__ == "__main__":
    main()
