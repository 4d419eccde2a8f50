"""corral against the fastest peers on one task and one thread budget: SBX (JAX), SB3 /
sb3-contrib, PureJaxRL (PPO CartPole, CPU JAX) and, optionally, CleanRL's single files and
LeanRL's ``torch.compile`` variants run in place from their own checkouts.

Every run is a fresh Python process pinned with ``taskset`` (``--cores 1``: core 0; ``--cores 2``:
cores 0 and 1) with OMP / MKL / OpenBLAS threads, torch threads and XLA's CPU threads set to the
same budget. Per seed the libraries run in A B B A order (``--rounds 2``: forward, then reversed),
so drift in the machine's load falls on both sides. Each run reports

* training time to the cell's budget (first env step to the end; construction excluded; SBX's
  JIT compile is inside it, PureJaxRL's compile is reported apart as ``compile_s``);
* time to a last-20 training return (``target``: 475 on CartPole), from the curve of finished
  training episodes each run records (corral stamps them at its updates, as its own early stop
  checks; PureJaxRL's single XLA program is stamped in proportion to its env steps);
* the deterministic return of the final policy over 10 episodes from the held-out seed 1000,
  so speed is never bought with learning (CleanRL and LeanRL keep no policy: their last-20
  training return stands beside them instead).

A JSON file holds every run, the summary and the versions of each library; a markdown table
(per-seed medians over rounds, the median over all runs, corral's time over each peer's) goes
to stdout.

Setup (the JAX peers in their own venv, so corral's stays as it is)::

    python3 -m venv /work/peers/.venv
    /work/peers/.venv/bin/pip install torch==2.13.0 sbx-rl jax "gymnasium[mujoco]" \\
        stable-baselines3==2.9.2 sb3-contrib==2.9.2 mujoco==3.17.0 distrax brax navix
    # PureJaxRL's ppo.py needs gymnax's 5-value step (0.0.9); Gymnasium as corral's (gymnax pins <1.4)
    /work/peers/.venv/bin/pip install gymnax==0.0.9 gymnasium==1.4.0
    git clone https://github.com/luchris429/purejaxrl /work/peers/purejaxrl
    # optional: CleanRL and LeanRL pin Gymnasium 0.29.1 (its "final_info" API; MuJoCo v4 envs,
    # so their HalfCheetah cells run HalfCheetah-v4), NumPy < 2 and LeanRL a tensordict of its time
    git clone https://github.com/vwxyzjn/cleanrl /work/peers/cleanrl
    git clone https://github.com/pytorch-labs/LeanRL /work/peers/LeanRL
    python3 -m venv /work/peers/.venv-cleanrl
    /work/peers/.venv-cleanrl/bin/pip install torch==2.13.0 "gymnasium[mujoco]==0.29.1" mujoco==3.17.0 \\
        "numpy<2" stable-baselines3==2.9.2 tyro tensorboard wandb tqdm tensordict==0.7.2 torchrl==0.7.2

The measurement (a quiet machine; one pinned core, then both cores)::

    P="--peer-python /work/peers/.venv/bin/python --purejaxrl-dir /work/peers/purejaxrl"
    python benchmarks/bench_peers.py $P --cells sac-pendulum tqc-pendulum dqn-cartpole ppo-cartpole \\
        --seeds 0 1 2 --json benchmarks/data/peers_1core.json
    python benchmarks/bench_peers.py $P --cells sac-halfcheetah tqc-halfcheetah \\
        --seeds 0 1 2 --json benchmarks/data/peers_1core_mujoco.json
    python benchmarks/bench_peers.py $P --cores 2 --seeds 0 1 2 --json benchmarks/data/peers_2core.json
    # CleanRL's and LeanRL's cells (eval: none, their scripts keep no policy; last-20 training return instead)
    python benchmarks/bench_peers.py --script-python /work/peers/.venv-cleanrl/bin/python \\
        --cleanrl-dir /work/peers/cleanrl --leanrl-dir /work/peers/LeanRL --libs corral cleanrl leanrl \\
        --seeds 0 1 2 --json benchmarks/data/peers_1core_cleanrl.json

A check that every cell runs end to end (tiny budgets, one seed, one round)::

    python benchmarks/bench_peers.py $P --steps 2000 --seeds 0 --rounds 1 --json /tmp/peers_smoke.json
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

JAX_LIBS = ("sbx", "purejaxrl")  # run by --peer-python
SCRIPT_LIBS = ("cleanrl", "leanrl")  # run by --script-python (their Gymnasium 0.29.1)
EVAL_EPISODES, EVAL_SEED, WINDOW = 10, 1000, 20


@dataclass(frozen=True)
class Cell:
    algo: str
    env: str
    steps: int
    libs: tuple[str, ...]
    target: float | None = None  # last-20 training return for the time-to-return column
    sb3: dict = field(default_factory=dict)  # SB3 / SBX kwargs beyond bench_offpolicy.PRESETS[algo]
    corral_sets: tuple[str, ...] = ()
    peer_steps: dict = field(default_factory=dict)  # a peer run at its own published budget


MUJOCO = dict(learning_starts=10_000)  # rl-zoo's sac.yml / tqc.yml HalfCheetah entry (&mujoco-defaults)
CELLS = {
    # corral-bf16: corral with its updates' wide matmuls in bfloat16 (matmul=bfloat16, needs AVX512-BF16 / AMX)
    "sac-pendulum": Cell("sac", "Pendulum-v1", 20_000, ("corral", "corral-bf16", "sbx", "sb3", "cleanrl", "leanrl"),
                         -200.0),
    "tqc-pendulum": Cell("tqc", "Pendulum-v1", 20_000, ("corral", "corral-bf16", "sbx", "sb3"), -200.0),
    "sac-halfcheetah": Cell("sac", "HalfCheetah-v5", 30_000,
                            ("corral", "corral-bf16", "sbx", "sb3", "cleanrl", "leanrl"),
                            sb3=MUJOCO, corral_sets=("sac.learning_starts=10000",)),
    "tqc-halfcheetah": Cell("tqc", "HalfCheetah-v5", 30_000, ("corral", "corral-bf16", "sbx", "sb3"), sb3=MUJOCO),
    "dqn-cartpole": Cell("dqn", "CartPole-v1", 50_000, ("corral", "sbx", "sb3", "cleanrl", "leanrl"), 475.0),
    # corral: its preset (`corral train ppo CartPole-v1`); corral-zoo: rl-zoo's exact values;
    # PureJaxRL at its own CartPole config and budget (its lr anneals over that budget)
    "ppo-cartpole": Cell("ppo", "CartPole-v1", 100_000, ("corral", "corral-zoo", "sb3", "sbx", "purejaxrl", "cleanrl"),
                         475.0, peer_steps={"purejaxrl": 500_000}),
}


# ---------------------------------------------------------------------------------------------
# the pure parts (tests/test_bench_peers.py)


def schedule(libs, seeds, rounds: int) -> list[tuple[int, int, str]]:
    """``(seed, round, lib)`` in run order: each round runs every lib, forward and reversed in
    turn (counted over all seeds' rounds), so ``rounds=2`` is A B B A per seed and ``rounds=1``
    is A B for the first seed, B A for the next."""
    out, k = [], 0
    for seed in seeds:
        for r in range(rounds):
            out += [(seed, r, lib) for lib in (libs if k % 2 == 0 else list(reversed(libs)))]
            k += 1
    return out


def time_to_return(curve, target: float, window: int = WINDOW):
    """``(seconds, env steps)`` at the first finished episode whose last-``window`` mean training
    return reaches ``target``; ``curve``: ``[seconds, env steps, return]`` per episode, in the
    order they ended. None when it never does."""
    total = 0.0
    for i, (_, _, ret) in enumerate(curve):
        total += ret
        if i >= window:
            total -= curve[i - window][2]
        if i >= window - 1 and total / window >= target:
            return curve[i][0], curve[i][1]
    return None


def last_return(curve, window: int = WINDOW):
    rets = [c[2] for c in curve[-window:]]
    return sum(rets) / len(rets) if rets else None


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(runs: list[dict], ref: str = "corral") -> dict:
    """Per cell and lib: per-seed medians (over rounds) of training time, time to target and eval,
    the median over every run, and ``ref``'s median over each lib's."""
    out: dict = {}
    for run in runs:
        lib = out.setdefault(run["cell"], {}).setdefault(run["lib"], {"runs": []})
        lib["runs"].append(run)
    for libs in out.values():
        for lib in libs.values():
            rs = lib.pop("runs")
            seeds = sorted({r["seed"] for r in rs})
            for key in ("train_s", "to_target_s", "to_target_incl_compile_s", "eval", "compile_s"):
                vals = [r.get(key) for r in rs]
                if all(v is None for v in vals):
                    continue
                lib[key] = {"per_seed": {s: _median([r.get(key) for r in rs if r["seed"] == s]) for s in seeds},
                            "median": _median(vals)}
            lib["reached"] = f"{sum(r.get('to_target_s') is not None for r in rs)}/{len(rs)}"
            lib["last20"] = _median([r.get("last20") for r in rs])
        for r in (ref, f"{ref}-bf16"):  # corral's float32 and bfloat16 updates, each over every lib
            if r not in libs:
                continue
            for name, lib in libs.items():
                for key in ("train_s", "to_target_s", "to_target_incl_compile_s"):
                    a = libs[r].get("to_target_s" if key == "to_target_incl_compile_s" else key, {}).get("median")
                    b = lib.get(key, {}).get("median")
                    if a is not None and b:
                        lib[f"{r}/lib {key}"] = a / b
    return out


def pinned_command(python: str, worker_args: list[str], cores: int, script: str | None = None):
    """The command line and environment of one pinned run: ``taskset`` on cores ``0..cores-1``
    and every thread pool (OpenMP, MKL, OpenBLAS, XLA's CPU) at ``cores`` threads."""
    cmd = ["taskset", "-c", ",".join(str(i) for i in range(cores)), python, script or os.path.abspath(__file__),
           *worker_args, "--threads", str(cores)]
    eigen = "false" if cores == 1 else "true"
    env = {**{k: str(cores) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")},
           "XLA_FLAGS": f"--xla_cpu_multi_thread_eigen={eigen} intra_op_parallelism_threads={cores}",
           "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "WANDB_MODE": "disabled"}
    return cmd, env


# ---------------------------------------------------------------------------------------------
# workers: one whole run each, in a fresh pinned process, printing one JSON line


def versions(*dists: str) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for d in dists:
        try:
            out[d] = version(d)
        except PackageNotFoundError:
            pass
    return out


def git_commit(path: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def evaluate(act, env_id: str) -> float:
    from bench_offpolicy import eval_policy

    return eval_policy(act, env_id, episodes=EVAL_EPISODES, seed=EVAL_SEED)


def work_corral(cell: Cell, seed: int, steps: int, args, zoo: bool = False, bf16: bool = False) -> dict:
    import torch

    import corral
    from corral.train.learner import Learner
    from corral.train.setup import build_config

    sets = [*cell.corral_sets, *args.sets, *(["matmul=bfloat16"] if bf16 else [])]
    if zoo:
        from bench_ppo_cartpole import ZOO
        sets = [*ZOO, *sets]
    cfg = build_config(cell.algo, cell.env, steps=steps, seed=seed,
                       sets=["progress=false", "eval.episodes=0", "tensorboard=false",
                             f"threads={torch.get_num_threads()}", *sets])
    learner = Learner(cfg, None)
    curve: list = []
    seen = [0]

    def record(lr, stats):  # after every update: the episodes that ended since the last one
        new = lr.episodes - seen[0]
        if new:
            curve.extend([lr.train_seconds, lr.env_steps, r] for r in list(lr.recent_returns)[-min(new, WINDOW):])
            seen[0] = lr.episodes

    record.close = lambda lr: None
    summary = learner.train(hooks=[record])
    agent = corral.Agent(learner.algo, cfg)
    return {"train_s": summary["train_seconds"], "steps": summary["env_steps"], "curve": curve,
            "eval": evaluate(lambda o: agent.act(o), cell.env),
            "versions": {**versions("corral", "torch", "gymnasium", "mujoco", "numpy"), "corral_git": git_commit(HERE)}}


def work_sb3_like(cell: Cell, seed: int, steps: int, lib: str) -> dict:
    """SB3 / sb3-contrib (``lib="sb3"``) or SBX at the same keyword arguments."""
    from stable_baselines3.common.callbacks import BaseCallback

    if cell.algo == "ppo":
        from bench_ppo_cartpole import sb3_zoo_kwargs
        from stable_baselines3.common.env_util import make_vec_env

        env, kwargs = make_vec_env(cell.env, n_envs=8, seed=seed), sb3_zoo_kwargs()
    else:
        from bench_offpolicy import PRESETS

        env, kwargs = cell.env, {**PRESETS[cell.algo][2], **cell.sb3}
    if lib == "sbx":
        import sbx

        cls, dists = getattr(sbx, cell.algo.upper()), ("sbx-rl", "jax", "jaxlib", "flax", "optax")
    else:
        import sb3_contrib
        import stable_baselines3 as sb3

        cls = getattr(sb3_contrib if cell.algo in ("tqc", "qrdqn", "crossq") else sb3, cell.algo.upper())
        kwargs["device"], dists = "cpu", ("stable_baselines3", "sb3_contrib", "torch")
    model = cls("MlpPolicy", env, seed=seed, verbose=0, **kwargs)
    curve: list = []
    t0 = [0.0]

    class Episodes(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    curve.append([time.perf_counter() - t0[0], self.num_timesteps, float(info["episode"]["r"])])
            return True

    t0[0] = time.perf_counter()
    model.learn(steps, callback=Episodes())
    secs = time.perf_counter() - t0[0]
    ret = evaluate(lambda o: model.predict(o, deterministic=True)[0], cell.env)
    return {"train_s": secs, "steps": model.num_timesteps, "curve": curve, "eval": ret,
            "versions": versions(*dists, "stable_baselines3", "gymnasium", "mujoco", "numpy")}


def purejaxrl_config(path: str) -> dict:
    """The ``config = {...}`` literal of PureJaxRL's ``__main__`` block, read (not run) from its file."""
    tree = ast.parse(open(path).read())
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and any(isinstance(t, ast.Name) and t.id == "config" for t in node.targets)):
            return ast.literal_eval(node.value)
    raise SystemExit(f"no `config = {{...}}` in {path}")


def work_purejaxrl(cell: Cell, seed: int, steps: int, args) -> dict:
    import importlib.util

    import jax
    import numpy as np

    src = os.path.join(args.purejaxrl_dir, "purejaxrl")
    sys.path.insert(0, src)  # its ppo.py imports its own wrappers.py
    spec = importlib.util.spec_from_file_location("purejaxrl_ppo", os.path.join(src, "ppo.py"))
    ppo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ppo)
    config = {**purejaxrl_config(os.path.join(src, "ppo.py")), "DEBUG": False, "TOTAL_TIMESTEPS": steps}
    assert config["ENV_NAME"] == cell.env, config["ENV_NAME"]
    rng = jax.random.PRNGKey(seed)
    t0 = time.perf_counter()
    compiled = jax.jit(ppo.make_train(config)).lower(rng).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(rng))
    run_s = time.perf_counter() - t0
    rets = np.asarray(out["metrics"]["returned_episode_returns"])  # [updates, steps, envs]
    done = np.asarray(out["metrics"]["returned_episode"])
    T, E = rets.shape[0] * rets.shape[1], rets.shape[2]
    t_idx, e_idx = np.nonzero(done.reshape(T, E))  # row-major: in the order they ended
    curve = [[run_s * (t + 1) / T, int((t + 1) * E), float(rets.reshape(T, E)[t, e])] for t, e in zip(t_idx, e_idx)]
    net = ppo.ActorCritic(2, activation=config["ACTIVATION"])
    params = out["runner_state"][0].params
    act = jax.jit(lambda o: net.apply(params, o)[0].logits.argmax())
    return {"train_s": run_s, "compile_s": compile_s, "steps": T * E, "curve": curve,
            "eval": evaluate(lambda o: int(act(np.asarray(o, dtype=np.float32))), cell.env),
            "versions": {**versions("jax", "jaxlib", "flax", "optax", "gymnax", "distrax", "gymnasium"),
                         "purejaxrl_git": git_commit(args.purejaxrl_dir)}}


# CleanRL / LeanRL: their scripts run in place as a child process; rl-zoo's values where their
# command line has a flag for them (network sizes and update schemes stay theirs)
SCRIPTS = {
    ("cleanrl", "sac"): "cleanrl/sac_continuous_action.py",
    ("cleanrl", "dqn"): "cleanrl/dqn.py",
    ("cleanrl", "ppo"): "cleanrl/ppo.py",
    ("leanrl", "sac"): "leanrl/sac_continuous_action_torchcompile.py",
    ("leanrl", "dqn"): "leanrl/dqn_torchcompile.py",
}
# CleanRL prints each episode; LeanRL shows the mean of its last 20 in tqdm's description
EPISODE_LINE = re.compile(r"global_step=(\d+), episodic_return=(?:tensor\()?\[?\s*(-?[\d.]+(?:e[-+]?\d+)?)")


def script_env(cell: Cell) -> str:
    """CleanRL and LeanRL pin Gymnasium 0.29.1, which has MuJoCo's v4 envs, not v5."""
    return cell.env.replace("HalfCheetah-v5", "HalfCheetah-v4")


def script_flags(lib: str, cell: Cell, seed: int, steps: int) -> list[str]:
    flags = ["--env-id", script_env(cell), "--total-timesteps", str(steps), "--seed", str(seed), "--no-cuda"]
    if lib == "leanrl":
        flags += ["--compile"]
    if cell.algo == "sac":
        lr = "1e-3" if cell.env == "Pendulum-v1" else "3e-4"
        flags += ["--learning-starts", str(cell.sb3.get("learning_starts", 100)), "--policy-lr", lr, "--q-lr", lr,
                  "--policy-frequency", "1"]
    elif cell.algo == "dqn":  # rl-zoo: 128 gradient steps every 256 env steps; here one every 2
        flags += ["--learning-rate", "2.3e-3", "--buffer-size", "100000", "--target-network-frequency", "10",
                  "--batch-size", "64", "--end-e", "0.04", "--exploration-fraction", "0.16",
                  "--learning-starts", "1000", "--train-frequency", "2"]
    elif cell.algo == "ppo":  # rl-zoo's CartPole values; CleanRL anneals lr, not the clip range
        flags += ["--num-envs", "8", "--num-steps", "32", "--num-minibatches", "1", "--update-epochs", "20",
                  "--gamma", "0.98", "--gae-lambda", "0.8", "--ent-coef", "0.0", "--learning-rate", "1e-3",
                  "--no-clip-vloss"]
    return flags


def work_script(cell: Cell, seed: int, steps: int, lib: str, args) -> dict:
    """Their script as a child process (same pinning, inherited): whole wall time less a bare
    interpreter start with the same imports; episodes stamped as their lines arrive."""
    import tempfile

    root = args.cleanrl_dir if lib == "cleanrl" else args.leanrl_dir
    script = os.path.join(root, SCRIPTS[(lib, cell.algo)])
    imports = "import torch, gymnasium, numpy, tyro" + (", tensordict, torchrl" if lib == "leanrl" else "")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", imports], check=True)
    startup_s = time.perf_counter() - t0
    curve, tail = [], []
    with tempfile.TemporaryDirectory() as tmp:  # their runs/ and wandb/ folders land here
        t0 = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-u", script, *script_flags(lib, cell, seed, steps)], cwd=tmp,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": root})
        buf = ""
        for chunk in iter(lambda: p.stdout.read1(4096).decode(errors="replace"), ""):
            buf += chunk
            *lines, buf = re.split(r"[\r\n]", buf)  # LeanRL reports through tqdm's \r updates
            for line in lines:
                m = EPISODE_LINE.search(line)
                if m and (lib == "cleanrl" or not curve or curve[-1][1] != int(m.group(1))):
                    curve.append([time.perf_counter() - t0 - startup_s, int(m.group(1)), float(m.group(2))])
                tail = (tail + [line])[-20:]
        wall = time.perf_counter() - t0
        if p.wait():
            raise SystemExit(f"{script} failed:\n" + "\n".join(tail))
    return {"train_s": wall - startup_s, "wall_s": wall, "startup_s": startup_s, "steps": steps, "curve": curve,
            "eval": None, "env_run": script_env(cell), "curve_is_last20_mean": lib == "leanrl", "versions": {**versions("torch", "gymnasium", "tyro", "tensordict", "torchrl"),
                                       f"{lib}_git": git_commit(root)}}


def worker(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    cell = CELLS[args.cell]
    steps = args.steps or cell.peer_steps.get(args.worker, cell.steps)
    if args.worker in ("corral", "corral-zoo", "corral-bf16"):
        out = work_corral(cell, args.seed, steps, args, zoo=args.worker == "corral-zoo", bf16=args.worker == "corral-bf16")
    elif args.worker in ("sb3", "sbx"):
        out = work_sb3_like(cell, args.seed, steps, args.worker)
    elif args.worker == "purejaxrl":
        out = work_purejaxrl(cell, args.seed, steps, args)
    else:
        out = work_script(cell, args.seed, steps, args.worker, args)
    window = 1 if out.get("curve_is_last20_mean") else WINDOW  # LeanRL's points are last-20 means already
    if cell.target is not None:
        hit = time_to_return(out["curve"], cell.target, window)
        out["to_target_s"], out["to_target_steps"] = hit if hit else (None, None)
        if hit and "compile_s" in out:  # PureJaxRL: its compile is paid before the first step
            out["to_target_incl_compile_s"] = hit[0] + out["compile_s"]
    out["last20"] = last_return(out["curve"], window)
    print(json.dumps(out), flush=True)


# ---------------------------------------------------------------------------------------------
# the driver


def run_one(lib: str, cell: str, seed: int, args) -> dict:
    python = (args.peer_python if lib in JAX_LIBS else (args.script_python or args.peer_python)
              if lib in SCRIPT_LIBS else args.python)
    wargs = ["--worker", lib, "--cell", cell, "--seed", str(seed)]
    if args.steps:
        wargs += ["--steps", str(args.steps)]
    for s in args.sets:
        wargs += ["--set", s]
    for opt in ("purejaxrl_dir", "cleanrl_dir", "leanrl_dir"):
        if getattr(args, opt):
            wargs += [f"--{opt.replace('_', '-')}", getattr(args, opt)]
    cmd, env = pinned_command(python, wargs, args.cores)
    load = os.getloadavg()[0]
    proc = subprocess.run(cmd, env={**os.environ, **env}, stdout=subprocess.PIPE, text=True)
    if proc.returncode:
        return {"lib": lib, "cell": cell, "seed": seed, "error": f"exit {proc.returncode}", "load": load}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"lib": lib, "cell": cell, "seed": seed, "load": load, **out}


def wanted_libs(cell: Cell, args) -> list[str]:
    have = {"sbx": args.peer_python, "purejaxrl": args.peer_python and args.purejaxrl_dir,
            "cleanrl": (args.script_python or args.peer_python) and args.cleanrl_dir,
            "leanrl": (args.script_python or args.peer_python) and args.leanrl_dir}
    return [lib for lib in cell.libs if (not args.libs or lib in args.libs) and have.get(lib, True)]


def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def table(summary: dict, args) -> str:
    lines = []
    for cell, libs in summary.items():
        c = CELLS[cell]
        lines += [f"\n### {cell}: {c.algo} on {c.env}, {args.steps or c.steps} steps, {args.cores} core(s)", "",
                  "| lib | train s per seed | median | corral/lib | to target s per seed | median | corral/lib |"
                  " reached | eval per seed | last-20 train return | compile s | to target incl. compile | corral/lib |"
                  " corral-bf16/lib |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for name, v in libs.items():
            def col(key, d=1):
                per = v.get(key, {}).get("per_seed", {})
                return " / ".join(fmt(x, d) for x in per.values()) or "-", fmt(v.get(key, {}).get("median"), d)
            tr, tt, ev = col("train_s"), col("to_target_s"), col("eval")
            lines.append(f"| {name} | {tr[0]} | {tr[1]} | {fmt(v.get('corral/lib train_s'), 3)} | {tt[0]} | {tt[1]} | "
                         f"{fmt(v.get('corral/lib to_target_s'), 3)} | {v['reached']} | {ev[0]} | "
                         f"{fmt(v.get('last20'))} | {col('compile_s')[1]} | {col('to_target_incl_compile_s')[1]} | "
                         f"{fmt(v.get('corral/lib to_target_incl_compile_s'), 3)} | "
                         f"{fmt(v.get('corral-bf16/lib train_s'), 3)} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", nargs="+", default=list(CELLS), choices=list(CELLS))
    p.add_argument("--libs", nargs="+", default=None, help="only these libraries (default: every one a cell lists)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=2, help="runs per lib and seed, A B B A (2) or alternating seeds (1)")
    p.add_argument("--cores", type=int, default=1, choices=[1, 2], help="pinned cores = threads of every pool")
    p.add_argument("--steps", type=int, default=None, help="every run at this budget (a smoke test), not the cell's")
    p.add_argument("--python", default=sys.executable, help="interpreter with corral, SB3 and sb3-contrib")
    p.add_argument("--peer-python", default=None, help="interpreter with sbx-rl, JAX and PureJaxRL's deps")
    p.add_argument("--script-python", default=None,
                   help="interpreter for CleanRL's and LeanRL's scripts (Gymnasium 0.29.1; default --peer-python)")
    p.add_argument("--purejaxrl-dir", default=None, help="a checkout of github.com/luchris429/purejaxrl")
    p.add_argument("--cleanrl-dir", default=None, help="a checkout of github.com/vwxyzjn/cleanrl")
    p.add_argument("--leanrl-dir", default=None, help="a checkout of github.com/pytorch-labs/LeanRL")
    p.add_argument("--set", dest="sets", action="append", default=[], help="corral config override (repeatable)")
    p.add_argument("--json", default="bench_peers.json", help="where the runs, summary and versions go")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--cell", default=None, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    runs = []
    for cell in args.cells:
        libs = wanted_libs(CELLS[cell], args)
        for seed, rnd, lib in schedule(libs, args.seeds, args.rounds):
            run = run_one(lib, cell, seed, args)
            run["round"] = rnd
            runs.append(run)
            print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in run.items()
                              if k not in ("curve", "versions")}), file=sys.stderr, flush=True)
    ok = [r for r in runs if "error" not in r]
    summary = summarize(ok)
    libs_versions = {r["lib"]: r["versions"] for r in ok}
    meta = {"argv": sys.argv, "cores": args.cores, "seeds": args.seeds, "rounds": args.rounds, "steps": args.steps,
            "cpu": next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
                        None), "date": time.strftime("%Y-%m-%d %H:%M:%S"), "versions": libs_versions,
            "eval": f"deterministic, {EVAL_EPISODES} episodes from seed {EVAL_SEED}", "window": WINDOW}
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "summary": summary, "runs": runs}, f, indent=1)
    print(table(summary, args))
    failed = [f"{r['cell']} {r['lib']} seed {r['seed']}" for r in runs if "error" in r]
    if failed:
        print("\nfailed: " + "; ".join(failed))


if __name__ == "__main__":
    main()
