"""corral's training throughput on a GPU at LeanRL's settings, beside LeanRL's published H100 figures.

LeanRL (CleanRL rewritten with ``torch.compile`` and CUDA graphs) publishes the env steps per
second of its fastest scripts on an H100 (its README's table, compile + cudagraphs):

    SAC HalfCheetah-v4 725, TD3 HalfCheetah-v4 936, PPO continuous HalfCheetah-v4 1,774,
    PPO Atari Breakout-v5 (EnvPool, 8 envs) 6,809.

This script runs corral's full training loop (env steps, acting, replay, gradient steps) at the
same settings: one env, batch 256 and 5,000 random steps first for SAC / TD3; one env, 2,048
steps, 10 epochs of 32 minibatches for PPO continuous; 8 envs of 128 steps, 4 epochs of 4
minibatches for PPO Atari (corral's ``atari`` preset). Speed is measured as LeanRL measures it:
env steps per second from a few updates after learning starts (``--burnin``) to the end. The
replay algorithms run twice, ``cuda_graph=off`` (eager) and ``on`` (the captured gradient step).

    python benchmarks/bench_leanrl_gpu.py --device cuda --json gpu.json
    python benchmarks/bench_leanrl_gpu.py --device cuda --cells sac td3 --timed 20000

LeanRL's figures were measured on their machine, not in this run: the ratio is a pointer, not a
same-run comparison. On a CPU (``--device cpu``) the script runs too, for a check of itself.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

LEANRL_H100 = {"sac": 725.0, "td3": 936.0, "ppo_mujoco": 1774.0, "ppo_atari": 6809.0, "dqn_atari": None}

CELLS = {
    # name: (algo, env, overrides at LeanRL's settings, learning_starts)
    "sac": ("sac", "HalfCheetah-v4", {"sac.batch_size": 256, "sac.learning_starts": 5000, "sac.buffer_size": 1_000_000,
                                      "sac.hidden": [256, 256], "sac.train_freq": 1, "sac.gradient_steps": 1,
                                      "env.num_envs": 1}, 5000),
    "td3": ("td3", "HalfCheetah-v4", {"td3.batch_size": 256, "td3.learning_starts": 5000, "td3.buffer_size": 1_000_000,
                                      "td3.hidden": [256, 256], "td3.train_freq": 1, "td3.gradient_steps": 1,
                                      "env.num_envs": 1}, 5000),
    "ppo_mujoco": ("ppo", "HalfCheetah-v4", {"env.num_envs": 1, "ppo.n_steps": 2048, "ppo.n_epochs": 10,
                                             "ppo.batch_size": 64}, 0),
    "ppo_atari": ("ppo", "Breakout", {"env.num_envs": 8, "env.backend": "subproc"}, 0),
    # no LeanRL figure: the value family's Atari loop (rl-zoo's DQN preset, its gradient step every 4 env steps)
    "dqn_atari": ("dqn", "Breakout", {"dqn.learning_starts": 5000, "dqn.buffer_size": 100_000}, 5000),
}


def run_cell(name: str, device: str, timed: int, burnin: int, cuda_graph: str | None, seed: int) -> dict:
    from corral.agent import build_config
    from corral.train.learner import Learner

    algo, env, over, starts = CELLS[name]
    over = {**over, "eval.episodes": 0, "device": device, "progress": False}
    if cuda_graph is not None:
        over[f"{algo}.cuda_graph"] = cuda_graph
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    cfg = build_config(algo, env, steps=10**9, seed=seed, overrides=over)
    t_build = time.perf_counter()
    learner = Learner(cfg, None, env_spec=env, quiet=True)
    learner.start()
    updates, t0, s0 = 0, None, 0
    t_first = time.perf_counter()
    while True:
        learner.step()
        steps = learner.env_steps
        if steps <= starts:
            continue
        updates += 1
        if t0 is None and updates >= burnin:
            sync()
            t0, s0 = time.perf_counter(), steps
        elif t0 is not None and steps - s0 >= timed:
            sync()
            t1 = time.perf_counter()
            break
    learner.stop = True
    learner.close()
    fps = (steps - s0) / (t1 - t0)
    row = dict(cell=name, algo=algo, env=env, device=device, cuda_graph=cuda_graph, timed_steps=steps - s0,
               seconds=t1 - t0, fps=fps, setup_seconds=t_first - t_build, leanrl_h100=LEANRL_H100[name],
               ratio_to_leanrl=fps / LEANRL_H100[name] if LEANRL_H100[name] else None)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", nargs="+", default=list(CELLS), choices=list(CELLS))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--timed", type=int, default=10000, help="env steps timed per run (after the burn-in)")
    p.add_argument("--burnin", type=int, default=3, help="updates after learning starts before the clock starts")
    p.add_argument("--graph-modes", nargs="+", default=["off", "on"], help="replay algorithms: cuda_graph values")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    rows = []
    for name in args.cells:
        modes = args.graph_modes if CELLS[name][0] in ("sac", "td3", "dqn") and args.device.startswith("cuda") else [None]
        for mode in modes:
            timed = args.timed * (4 if name.startswith("ppo") else 1)
            try:
                row = run_cell(name, args.device, timed, args.burnin, mode, args.seed)
            except Exception as e:  # one cell's failure must not cost the others (a lent GPU's minutes)
                row = dict(cell=name, cuda_graph=mode, error=f"{type(e).__name__}: {e}")
                print(json.dumps(row), flush=True)
                rows.append(row)
                continue
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(rows, f, indent=1)
    dev = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"\n{dev}, torch {torch.__version__}")
    print("| cell | cuda_graph | corral env steps/s | LeanRL H100 (published) | corral / LeanRL |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['cell']} | {r['cuda_graph']} | error: {r['error'][:80]} | | |")
            continue
        ref, ratio = r["leanrl_h100"], r["ratio_to_leanrl"]
        print(f"| {r['cell']} | {r['cuda_graph'] or '-'} | {r['fps']:.0f} | {f'{ref:.0f}' if ref else '-'} | "
              f"{f'{ratio:.2f}' if ratio else '-'} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
