"""What one gradient step costs on this machine's device, and where it goes: the time per
update (device-synchronised, median of many), the ATen calls the host dispatches per update
(counted with ``torch.profiler``), and the host reads of device values per update (each a
synchronisation on a GPU). On a GPU, a step of RL-sized networks is bound by the host's
dispatch, not by the arithmetic: the count of calls is what to cut (or to capture once as a
CUDA graph).

    python benchmarks/bench_gpu_step.py --device cuda --algos sac tqc crossq rainbow
    python benchmarks/bench_gpu_step.py --device cpu --algos sac        # the same on CPU
    python benchmarks/bench_gpu_step.py --cuda-graph --algos sac td3 tqc dqn --updates 300   # eager vs graphed

``--cuda-graph`` builds each algorithm twice on the GPU, ``cuda_graph=off`` (the eager update)
and ``cuda_graph=on`` (the gradient step captured once per step kind and replayed,
``corral/algos/graphed.py``), and prints both times per update and their ratio; an algorithm
the graphed step refuses prints the reason instead.

Each algorithm runs its own preset (BipedalWalker-v3 for the SAC family, Pong for Rainbow,
CartPole-v1 for DQN and QR-DQN) for a short warm-up, then times ``algo.update``. For the
presets' one gradient step per update (``train_freq`` and ``gradient_steps`` set to 1).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

ENVS = {"sac": "BipedalWalker-v3", "tqc": "BipedalWalker-v3", "crossq": "BipedalWalker-v3", "redq": "Pendulum-v1",
        "droq": "Pendulum-v1", "td3": "BipedalWalker-v3", "rainbow": "Pong", "dqn": "CartPole-v1",
        "qrdqn": "CartPole-v1", "c51": "CartPole-v1"}


def build(algo: str, env: str, device: str, warmup: int, cuda_graph: str | None = None):
    from corral.agent import build_config
    from corral.train.learner import Learner

    over = {"eval.episodes": 0, "device": device, f"{algo}.learning_starts": warmup // 2,
            f"{algo}.train_freq": 1, f"{algo}.gradient_steps": 1, "progress": False}
    if cuda_graph is not None:
        over[f"{algo}.cuda_graph"] = cuda_graph
    cfg = build_config(algo, env, steps=warmup, seed=0, overrides=over)
    learner = Learner(cfg, None, env_spec=env, quiet=True)
    learner.train()
    return learner.algo


def host_reads(algo, n: int) -> float:
    """Host reads of tensor values per update (``.item()``, ``bool()``, ``.tolist()``, ...)."""
    count = collections.Counter()
    names = ("item", "__bool__", "__int__", "__float__", "tolist", "numpy")
    saved = {k: getattr(torch.Tensor, k) for k in names}

    def counting(name):
        def f(self, *a, **k):
            if self.device.type != "cpu":
                count[name] += 1
            return saved[name](self, *a, **k)
        return f

    for k in names:
        setattr(torch.Tensor, k, counting(k))
    try:
        for _ in range(n):
            algo.update(0.5)
    finally:
        for k, f in saved.items():
            setattr(torch.Tensor, k, f)
    return sum(count.values()) / n


def time_updates(algo, n: int, sync) -> float:
    """Median ms per ``algo.update``, device-synchronised."""
    times = []
    for _ in range(n):
        sync()
        t = time.perf_counter()
        algo.update(0.5)
        sync()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def graph_rows(args, sync) -> list[dict]:
    """Eager against graphed updates, each algorithm built twice on the GPU."""
    from corral.errors import UserError

    rows = []
    for name in args.algos:
        env = ENVS.get(name, "Pendulum-v1")
        row: dict = dict(algo=name, device=args.device)
        for mode in ("off", "on"):
            try:
                algo = build(name, env, args.device, args.warmup, mode)
            except UserError as e:
                row["refused"] = str(e)
                break
            row[f"ms_{mode}"] = time_updates(algo, args.updates, sync)
            row[f"host_reads_{mode}"] = host_reads(algo, 20)
        rows.append(row)
        if "refused" in row:
            print(f"{name:8s} graphed step refused: {row['refused']}", flush=True)
            continue
        row["speedup"] = row["ms_off"] / row["ms_on"]
        print(f"{name:8s} {args.device:6s} eager {row['ms_off']:7.3f} ms  graphed {row['ms_on']:7.3f} ms  "
              f"x{row['speedup']:.2f}  host reads/update {row['host_reads_off']:.1f} -> {row['host_reads_on']:.1f}",
              flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algos", nargs="+", default=["sac", "tqc", "crossq"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--updates", type=int, default=200)
    p.add_argument("--warmup", type=int, default=2000, help="env steps before timing (half random, half learning)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--cuda-graph", action="store_true", help="eager against CUDA-graphed updates (GPU only)")
    args = p.parse_args()
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    if args.cuda_graph and not args.device.startswith("cuda"):
        p.error("--cuda-graph needs a CUDA device (--device cuda)")
    rows = graph_rows(args, sync) if args.cuda_graph else []
    for name in args.algos if not args.cuda_graph else ():
        algo = build(name, ENVS.get(name, "Pendulum-v1"), args.device, args.warmup)
        ms = time_updates(algo, args.updates, sync)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(10):
                algo.update(0.5)
        calls = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::")) / 10
        row = dict(algo=name, device=args.device, ms_per_update=ms, aten_calls=calls,
                   host_reads=host_reads(algo, 20))
        rows.append(row)
        print(f"{name:8s} {args.device:6s} {row['ms_per_update']:8.2f} ms/update  {calls:6.0f} ATen calls  "
              f"{row['host_reads']:4.1f} host reads/update", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
