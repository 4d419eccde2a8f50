"""Atari throughput on a CPU (issue 34): PPO training on Pong, frames per second, for corral
with Gymnasium's ALE (backend sync), with EnvPool (backend envpool), with ``matmul=bfloat16``
(the Nature CNN under bfloat16 autocast inside updates; needs AVX512-BF16 or AMX), and
CleanRL's ``ppo_atari_envpool.py`` run in place from its checkout; and the value family's
gradient step on Nature-CNN batches (DQN, batch 32) against Stable-Baselines3's ``DQN.train``.

``ppo``: every run is a fresh process pinned with ``taskset`` to one core (``--core``) with
OpenMP / MKL / OpenBLAS and torch at one thread (EnvPool's pool at its default size, pinned
to the same core, on both sides). Both sides run the same iterations of 8 envs x 128 steps
(``--frames`` rounded down to whole iterations; frames = 4 x agent steps) with corral's
``atari`` preset = CleanRL's settings. Time is the training window: corral's
``train_seconds`` (first reset to the last update), CleanRL's from its first ``envs.reset()``
to its ``envs.close()``. Per round the runners go in one order, then the reverse (A B B A),
so drift in the machine's load falls on all of them. CleanRL's script is unchanged; the one
shim: EnvPool 1.2.5 speaks Gymnasium's 5-tuple step and spaces where the script (written for
EnvPool 0.6 and gym 0.23) expects 4 values and gym's spaces, so ``envpool.make`` is wrapped to
return ``done = terminated | truncated``, ``reset()``'s observation alone and gym's spaces.

``step``: one pinned process builds corral's DQN on Pong (``dqn.hidden=[]``: Nature CNN then
a linear Q head, SB3's CnnPolicy) and SB3's DQN on the same game (AtariWrapper, 4 stacked
frames), fills both replays with ``--warmup`` env steps, then times single gradient steps at
batch 32 alternately (corral float32, corral bfloat16, SB3, SB3, corral bfloat16, corral
float32, ...): medians in ms per step and corral's over SB3's.

``profile``: where a corral PPO Pong iteration's time goes on one core (torch.profiler over
the run, the env timed around ``step``, the update around ``algo.update``). Measured once at a
tiny budget (12 updates) on the busy 2-core VM, so shares, not speeds (float32, sync backend;
EnvPool's in brackets): the update takes 79% (82%) of training time, acting (the CNN forward
on 8 observations a step) 9%, the env 11% (9%: ALE emulation and Gymnasium's wrappers are
cheap beside the network on one core). By op, of all training time: convolutions 66% (68%),
of which ``convolution_backward`` alone is over half (44 ms a call on average over the three
layers at minibatch 256), the linear layers 12% (the 3136x512 layer's
``mm`` / ``addmm``), copies and gathers 4% (``copy_``, minibatch ``index``), and the
uint8 -> float conversion under 0.1% (one ``_to_copy`` per minibatch; its memory traffic
lands in ``copy_``). So the convolutions are the bill: ``matmul=bfloat16`` (1.6-1.8x here),
and next the convolutions' backward, are where a CPU step gets faster; the env is not.

Exact commands (a quiet machine; the figures go to docs/benchmarks.md)::

    # once: EnvPool for corral and for CleanRL's venv (CleanRL's script imports gym)
    .venv/bin/pip install 'corral[envpool,atari,bench]'
    /work/peers/.venv-cleanrl/bin/pip install envpool==1.2.5 gym==0.23.1
    # PPO Pong, 100k frames each (24 updates), 3 rounds of A B B A
    python benchmarks/bench_atari.py ppo --frames 100000 --rounds 3 --json benchmarks/results/atari_ppo.json
    # DQN gradient step at batch 32, 300 steps each, interleaved
    python benchmarks/bench_atari.py step --warmup 2000 --steps 300 --json benchmarks/results/atari_step.json
    python benchmarks/bench_atari.py profile --frames 16384

Tiny validation (what was run here, under load)::

    nice -n 10 python benchmarks/bench_atari.py ppo --frames 8192 --rounds 1
    nice -n 10 python benchmarks/bench_atari.py step --warmup 300 --steps 5 --buffer 2000
    nice -n 10 python benchmarks/bench_atari.py profile --frames 12288 --backend sync   # and envpool
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RUNNERS = ("corral-gym", "corral-envpool", "corral-bf16", "cleanrl")
ITERATION = 8 * 128  # agent steps per PPO iteration (CleanRL's num_envs x num_steps)


def agent_steps(frames: int) -> int:
    """Whole iterations, at least one: corral and CleanRL run the same updates."""
    return max(1, frames // (4 * ITERATION)) * ITERATION


def pinned(python: str, args: list[str], core: int) -> tuple[list[str], dict]:
    cmd = ["taskset", "-c", str(core), python, os.path.abspath(__file__), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled"}
    return cmd, env


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# workers (each in its own pinned process; one JSON line on stdout, last)


def work_corral(runner: str, steps: int, seed: int) -> dict:
    import torch

    from corral.train.learner import Learner
    from corral.train.setup import build_config

    torch.set_num_threads(1)
    sets = ["progress=false", "eval.episodes=0", "tensorboard=false", "threads=1", "checkpoint.every=0",
            f"env.backend={'envpool' if runner == 'corral-envpool' else 'sync'}"]
    if runner == "corral-bf16":
        sets.append("matmul=bfloat16")
    cfg = build_config("ppo", "ALE/Pong-v5", steps=steps, seed=seed, sets=sets)
    summary = Learner(cfg, None, quiet=True).train()
    return {"train_s": summary["train_seconds"], "agent_steps": summary["env_steps"]}


class OldGymAPI:
    """EnvPool 1.2.5's gym env as the API CleanRL's script was written for: 4-value steps, and
    gym's spaces (EnvPool 1.2.5 returns Gymnasium's)."""

    def __init__(self, env, marks: dict):
        import gym

        a, o = env.action_space, env.observation_space
        self.__dict__.update(_env=env, _marks=marks, action_space=gym.spaces.Discrete(int(a.n)),
                             observation_space=gym.spaces.Box(o.low, o.high, o.shape, o.dtype))

    def __getattr__(self, name):
        return getattr(self._env, name)

    def reset(self, **kwargs):
        self._marks.setdefault("reset", time.perf_counter())
        return self._env.reset(**kwargs)[0]

    def step(self, action):
        obs, rew, term, trunc, info = self._env.step(action)
        return obs, rew, term | trunc, info

    def close(self):
        # the end of training; the pool is left to the process's exit (EnvPool 1.2.5's close
        # calls Gymnasium 1.x's VectorEnv.close, which fails under CleanRL's Gymnasium 0.29.1)
        self._marks["close"] = time.perf_counter()


def work_cleanrl(steps: int, seed: int, cleanrl_dir: str) -> dict:
    import contextlib
    import runpy
    import tempfile

    import envpool
    import torch

    torch.set_num_threads(1)
    marks: dict = {}
    make = envpool.make

    def make_old(*a, **k):
        env = make(*a, **k)
        return OldGymAPI(env, marks) if k.get("env_type") == "gym" else env

    envpool.make = make_old
    script = os.path.join(cleanrl_dir, "cleanrl", "ppo_atari_envpool.py")
    sys.argv = [script, "--env-id", "Pong-v5", "--total-timesteps", str(steps), "--seed", str(seed), "--no-cuda"]
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(sys.stderr):
        os.chdir(tmp)  # its runs/ folder lands here
        runpy.run_path(script, run_name="__main__")
    return {"train_s": marks["close"] - marks["reset"], "agent_steps": steps}


def work_step(args) -> dict:
    """corral's DQN step (float32 and bfloat16) and SB3's, interleaved, in this process."""
    import gymnasium as gym
    import numpy as np
    import torch

    from corral.envs.atari import register_ale
    from corral.kernels.precision import native_bfloat16_cpu, update_matmul
    from corral.train.learner import Learner
    from corral.train.setup import build_config

    torch.set_num_threads(1)
    over = {"eval.episodes": 0, "progress": False, "tensorboard": False, "dqn.learning_starts": args.warmup,
            "dqn.train_freq": 1, "dqn.gradient_steps": 1, "dqn.batch_size": 32, "dqn.hidden": [],
            "dqn.buffer_size": args.buffer, "env.num_envs": 1}
    learner = Learner(build_config("dqn", "ALE/Pong-v5", steps=args.warmup + 1, seed=0, overrides=over), None,
                      quiet=True)
    learner.train()
    algo = learner.algo

    from stable_baselines3 import DQN
    from stable_baselines3.common.atari_wrappers import AtariWrapper
    from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack

    register_ale()
    venv = VecFrameStack(DummyVecEnv([lambda: AtariWrapper(gym.make("ALE/Pong-v5", frameskip=1))]), 4)
    model = DQN("CnnPolicy", venv, buffer_size=args.buffer, learning_starts=args.warmup, batch_size=32,
                train_freq=1, gradient_steps=0, seed=0, device="cpu")
    model.learn(args.warmup + 1)  # fills the replay; gradient_steps=0: no training yet

    def corral32():
        algo.update(0.5)

    def corral16():
        with update_matmul("bfloat16"):
            algo.update(0.5)

    def sb3():
        model.train(gradient_steps=1, batch_size=32)

    # without bfloat16 dot products torch emulates bfloat16 (slow reference convolutions, ~13x
    # float32's step here), and a corral run refuses matmul=bfloat16 there: no row for it
    bf16 = native_bfloat16_cpu()
    fns = {"corral": corral32, "corral-bf16": corral16, "sb3": sb3} if bf16 else {"corral": corral32, "sb3": sb3}
    times: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns)
    for i in range(args.steps):
        for name in order if i % 2 == 0 else order[::-1]:
            t = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t)
    ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    out = {"ms_per_step": ms, "corral_over_sb3": ms["corral"] / ms["sb3"], "steps": args.steps,
           "warmup": args.warmup, "replay": args.buffer, "frames_in_replay": int(np.asarray(model.replay_buffer.pos)),
           "cpu_capability": torch.backends.cpu.get_cpu_capability(), "native_bfloat16": bf16}
    if bf16:
        out["corral_bf16_over_sb3"] = ms["corral-bf16"] / ms["sb3"]
    return out


def work_profile(args) -> dict:
    """Shares of a corral PPO Pong iteration: the env (timed around ``step``), the update and
    acting, and the profiler's op groups over the whole run."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from corral.envs.host import HostVecEnv
    from corral.train.learner import Learner
    from corral.train.setup import build_config

    torch.set_num_threads(1)
    env_s = [0.0]
    step = HostVecEnv.step

    def timed(self, action):
        t = time.perf_counter()
        try:
            return step(self, action)
        finally:
            env_s[0] += time.perf_counter() - t

    HostVecEnv.step = timed
    sets = ["progress=false", "eval.episodes=0", "tensorboard=false", "threads=1", f"env.backend={args.backend}"]
    learner = Learner(build_config("ppo", "ALE/Pong-v5", steps=agent_steps(args.frames), seed=0, sets=sets), None,
                      quiet=True)
    update_s = [0.0]
    update = learner.algo.update

    def timed_update(progress):
        t = time.perf_counter()
        try:
            return update(progress)
        finally:
            update_s[0] += time.perf_counter() - t

    learner.algo.update = timed_update
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        summary = learner.train()
    total = summary["train_seconds"]
    groups = {"convolution": ("conv", "mkldnn"), "linear": ("addmm", "aten::mm", "linear", "bmm"),
              "uint8->float": ("_to_copy", "aten::to"), "copies": ("copy_", "index", "cat", "stack", "clone")}
    self_us = {g: 0.0 for g in groups}
    for e in prof.key_averages():
        for g, keys in groups.items():
            if any(k in e.key for k in keys):
                self_us[g] += e.self_cpu_time_total
                break
    out = {"train_s": total, "env_share": env_s[0] / total, "update_share": update_s[0] / total,
           "acting_and_rest_share": 1 - (env_s[0] + update_s[0]) / total,
           **{f"{g}_share": us / 1e6 / total for g, us in self_us.items()}}
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12), file=sys.stderr)
    return out


# ---------------------------------------------------------------------------------------------
# the driver


def run(runner: str, args) -> dict:
    steps = agent_steps(args.frames)
    wargs = ["--worker", runner, "--steps", str(steps), "--seed", str(args.seed)]
    if runner == "cleanrl":
        wargs += ["--cleanrl-dir", args.cleanrl_dir]
    cmd, env = pinned(args.cleanrl_python if runner == "cleanrl" else sys.executable, wargs, args.core)
    load = os.getloadavg()[0]
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
    if proc.returncode:
        return {"runner": runner, "error": f"exit {proc.returncode}", "load": load}
    out = last_json(proc.stdout)
    fps = 4 * out["agent_steps"] / out["train_s"]
    return {"runner": runner, "load": load, "frames": 4 * out["agent_steps"], "fps": fps, **out}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", nargs="?", choices=("ppo", "step", "profile"), default="ppo")
    p.add_argument("--frames", type=int, default=100_000, help="frames per PPO run (4 per agent step)")
    p.add_argument("--rounds", type=int, default=2, help="ppo: rounds, each the runners forward then reversed")
    p.add_argument("--runners", nargs="+", default=list(RUNNERS), choices=RUNNERS)
    p.add_argument("--core", type=int, default=0, help="the core every run is pinned to")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cleanrl-dir", default="/work/peers/cleanrl")
    p.add_argument("--cleanrl-python", default="/work/peers/.venv-cleanrl/bin/python")
    p.add_argument("--warmup", type=int, default=2000, help="step: env steps that fill the replays first")
    p.add_argument("--steps", type=int, default=300, help="step: timed gradient steps per side")
    p.add_argument("--buffer", type=int, default=100_000, help="step: replay capacity (rl-zoo's Atari 100k)")
    p.add_argument("--backend", default="sync", help="profile: corral's env backend")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()

    if "corral-bf16" in args.runners and not args.worker:
        from corral.kernels.precision import native_bfloat16_cpu

        if not native_bfloat16_cpu():  # a corral run refuses matmul=bfloat16 on this CPU
            args.runners = [r for r in args.runners if r != "corral-bf16"]
            print("corral-bf16 left out: this CPU has no bfloat16 dot products", flush=True)
    if args.worker:  # one pinned run
        if args.worker == "cleanrl":
            out = work_cleanrl(args.steps, args.seed, args.cleanrl_dir)
        elif args.worker == "step":
            out = work_step(args)
        elif args.worker == "profile":
            out = work_profile(args)
        else:
            out = work_corral(args.worker, args.steps, args.seed)
        print(json.dumps(out), flush=True)
        return

    if args.mode in ("step", "profile"):
        wargs = ["--worker", args.mode, "--warmup", str(args.warmup), "--steps", str(args.steps), "--buffer",
                 str(args.buffer), "--frames", str(args.frames), "--backend", args.backend]
        cmd, env = pinned(sys.executable, wargs, args.core)
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True)
        result = last_json(proc.stdout)
        print(json.dumps(result, indent=1))
    else:
        rows = []
        for r in range(args.rounds):
            order = list(args.runners)
            for runner in order + order[::-1]:
                row = run(runner, args)
                rows.append({"round": r, **row})
                print(f"round {r} {runner:15s} " + (f"{row['fps']:8.0f} frames/s ({row['frames']} frames in "
                      f"{row['train_s']:.1f} s, load {row['load']:.1f})" if "fps" in row else row["error"]),
                      flush=True)
        fps = {n: statistics.median([x["fps"] for x in rows if x["runner"] == n and "fps" in x] or [float("nan")])
               for n in args.runners}
        result = {"frames_per_run": 4 * agent_steps(args.frames), "median_fps": fps, "runs": rows}
        if "cleanrl" in fps:
            result["over_cleanrl"] = {n: fps[n] / fps["cleanrl"] for n in fps if n != "cleanrl"}
        print("median frames/s: " + ", ".join(f"{n} {v:.0f}" for n, v in fps.items()))
        for n, v in result.get("over_cleanrl", {}).items():
            print(f"  {n} / cleanrl: {v:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
