"""corral vs Stable-Baselines3 (and sb3-contrib) on the rl-zoo off-policy presets, in one process.

DQN and QR-DQN on CartPole-v1 (50k steps) and SAC on Pendulum-v1 (20k steps) with the same
hyperparameters, the same Gymnasium env and seed, one torch thread each. Reports the
training time (first env step to the end; construction excluded) as wall-clock and as
process CPU time (steadier on a shared machine), the deterministic eval return of the
final policy (10 episodes) and the time ratios. ``--rounds 2`` runs corral, SB3, SB3,
corral and reports medians. Each whole run is a fresh Python process (``--worker``), so
neither library inherits the other's process-wide settings (torch threads, corral's
``keep_heap`` malloc setting) or its heap.

    pip install 'corral[bench]'
    python benchmarks/bench_offpolicy.py --algos dqn sac --seeds 0 --rounds 2
    python benchmarks/bench_offpolicy.py --algos qrdqn --seeds 0 1 2   # vs sb3-contrib's QR-DQN
    python benchmarks/bench_offpolicy.py --algos tqc crossq            # vs sb3-contrib's TQC, CrossQ
    python benchmarks/bench_offpolicy.py --algos redq                  # vs SB3's SAC (no REDQ there)

``--per-step`` times one gradient step instead of whole runs, after filling both
libraries' buffers the same way: corral's ``update()``, SB3's ``model.train()``,
and the bare matmul sequence of a step at the preset's shapes (forward, target
forward, backward; no activations, no optimizer, no autograd). The bare sequence
is the floor any implementation of the same math pays on this machine, so
``bare / SB3`` is the smallest training-time ratio reachable by cutting overhead.

    python benchmarks/bench_offpolicy.py --per-step --algos dqn sac
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch

PRESETS = {
    # algo: (env, steps, SB3 kwargs mirroring corral/presets/<algo>.yaml)
    "dqn": ("CartPole-v1", 50_000, dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000,
                                        gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
                                        exploration_fraction=0.16, exploration_final_eps=0.04,
                                        policy_kwargs=dict(net_arch=[256, 256]))),
    # sb3-contrib's QR-DQN at rl-zoo's qrdqn.yml CartPole entry
    "qrdqn": ("CartPole-v1", 50_000, dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                                          learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256,
                                          gradient_steps=128, exploration_fraction=0.16, exploration_final_eps=0.04,
                                          policy_kwargs=dict(net_arch=[256, 256], n_quantiles=10))),
    "sac": ("Pendulum-v1", 20_000, dict(learning_rate=1e-3)),
    # sb3-contrib's TQC and CrossQ at rl-zoo's tqc.yml / crossq.yml Pendulum-v1 entries
    "tqc": ("Pendulum-v1", 20_000, dict(learning_rate=1e-3)),
    "crossq": ("Pendulum-v1", 20_000, dict(policy_delay=2, policy_kwargs=dict(net_arch=[256, 256]))),
    # REDQ has no SB3 / sb3-contrib counterpart: its peer is SB3's SAC at SAC's preset (REDQ does
    # G = 20 critic steps per env step over N = 10 critics, so expect many times SAC's time)
    "redq": ("Pendulum-v1", 20_000, dict(learning_rate=1e-3)),
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


def run_worker(lib, algo, seed, args):
    """One whole run in a fresh process: (train seconds, process CPU seconds, eval return,
    process CPU seconds inside the gradient steps)."""
    import subprocess
    import sys

    cmd = [sys.executable, os.path.abspath(__file__), "--worker", lib, "--algos", algo, "--seeds", str(seed),
           "--threads", str(args.threads)]
    if args.steps:
        cmd += ["--steps", str(args.steps)]
    for s in args.sets:
        cmd += ["--set", s]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return tuple(json.loads(out.strip().splitlines()[-1]))


def run_corral(algo, seed, steps=None, sets=()):
    import corral
    from corral.train.learner import Learner
    from corral.train.setup import build_config

    env_id, preset_steps, _ = PRESETS[algo]
    steps = steps or preset_steps
    cfg = build_config(algo, env_id, steps=steps, seed=seed,
                       sets=["progress=false", "eval.episodes=0", "tensorboard=false",
                             f"threads={torch.get_num_threads()}", *sets])
    learner = Learner(cfg, None)
    update, in_update = learner.algo.update, [0.0]

    def timed_update(progress):  # process CPU inside the gradient steps; the rest is collection
        t = time.process_time()
        out = update(progress)
        in_update[0] += time.process_time() - t
        return out

    learner.algo.update = timed_update
    cpu = time.process_time()
    summary = learner.train()
    cpu = time.process_time() - cpu
    agent = corral.Agent(learner.algo, cfg)
    return summary["train_seconds"], cpu, eval_policy(lambda o: agent.act(o), env_id), in_update[0]


def run_sb3(algo, seed, steps=None):
    import stable_baselines3 as sb3
    from stable_baselines3.common.noise import NormalActionNoise

    env_id, preset_steps, kwargs = PRESETS[algo]
    steps = steps or preset_steps
    kwargs = dict(kwargs)
    if algo == "td3":
        kwargs["action_noise"] = NormalActionNoise(np.zeros(1), 0.1 * np.ones(1))
    if algo in ("qrdqn", "tqc", "crossq"):
        import sb3_contrib

        cls = {"qrdqn": sb3_contrib.QRDQN, "tqc": sb3_contrib.TQC, "crossq": sb3_contrib.CrossQ}[algo]
    else:
        cls = {"dqn": sb3.DQN, "sac": sb3.SAC, "redq": sb3.SAC, "td3": sb3.TD3}[algo]
    model = cls("MlpPolicy", env_id, seed=seed, device="cpu", verbose=0, **kwargs)
    train, in_train = model.train, [0.0]

    def timed_train(*a, **kw):
        t = time.process_time()
        out = train(*a, **kw)
        in_train[0] += time.process_time() - t
        return out

    model.train = timed_train
    t0, cpu = time.perf_counter(), time.process_time()
    model.learn(steps)
    secs, cpu = time.perf_counter() - t0, time.process_time() - cpu
    return secs, cpu, eval_policy(lambda o: model.predict(o, deterministic=True)[0], env_id), in_train[0]


# ---------------------------------------------------------------------------------------------
# per gradient step


def _mlp_forward(x, weights):
    """Matmuls of an MLP forward; returns each layer's input (what its backward reads)."""
    inputs = []
    for w in weights:
        inputs.append(x)
        x = x @ w
    return x, inputs


def _mlp_backward(inputs, weights, g, weight_grads=True, first_input_grad=False):
    for i in reversed(range(len(weights))):
        if weight_grads:
            inputs[i].mT @ g
        if i > 0 or first_input_grad:
            g = g @ weights[i].mT
    return g


def bare_step(algo):
    """A gradient step's matmuls at the preset's shapes, as a closure."""
    r = torch.randn
    if algo == "dqn":  # CartPole 4 -> 256 -> 256 -> 2, batch 64: online, target, backward
        B, q = 64, [r(4, 256), r(256, 256), r(256, 2)]
        obs, nxt, g = r(B, 4), r(B, 4), r(B, 2)

        def step():
            _, ins = _mlp_forward(obs, q)
            _mlp_forward(nxt, q)
            _mlp_backward(ins, q, g)
        return step
    if algo == "sac":  # Pendulum: actor 3 -> 256 -> 256 -> 2, twin critics 4 -> 256 -> 256 -> 1, batch 256
        B = 256
        actor = [r(3, 256), r(256, 256), r(256, 2)]
        critics = [r(2, 4, 256), r(2, 256, 256), r(2, 256, 1)]
        obs, nxt, sa = r(B, 3), r(B, 3), r(2, B, 4)
        gq, ga = r(2, B, 1), r(B, 2)

        def step():
            _mlp_forward(nxt, actor)            # target: next action
            _mlp_forward(sa, critics)           # target critics
            _, ins = _mlp_forward(sa, critics)  # critic loss: forward, backward (weights, hidden inputs)
            _mlp_backward(ins, critics, gq)
            _, a_ins = _mlp_forward(obs, actor)  # actor loss: actor, critics (inputs only), actor backward
            _, c_ins = _mlp_forward(sa, critics)
            _mlp_backward(c_ins, critics, gq, weight_grads=False, first_input_grad=True)
            _mlp_backward(a_ins, actor, ga)
        return step
    raise ValueError(f"no bare step for {algo}")


def per_step(args):
    import sb3_contrib
    import stable_baselines3 as sb3

    from corral.algos.base import Step
    from corral.train.learner import Learner
    from corral.train.setup import build_config

    grad_steps = {"dqn": 128, "qrdqn": 128, "sac": 100, "tqc": 50, "crossq": 50, "redq": 20, "droq": 20}
    classes = {"dqn": sb3.DQN, "qrdqn": sb3_contrib.QRDQN, "sac": sb3.SAC, "tqc": sb3_contrib.TQC,
               "crossq": sb3_contrib.CrossQ, "redq": None, "droq": None}  # REDQ: no SB3 / sb3-contrib counterpart; SB3's SAC step at the same shapes
    for algo in args.algos:
        env_id, _, kwargs = PRESETS.get(algo, PRESETS["sac"])
        G = grad_steps[algo]
        cfg = build_config(algo, env_id, steps=PRESETS.get(algo, PRESETS["sac"])[1], seed=0,
                           sets=["progress=false", "eval.episodes=0", "tensorboard=false", f"threads={args.threads}"])
        learner = Learner(cfg, None)
        corral_algo = learner.algo
        obs = learner.obs
        with torch.no_grad():  # fill the buffer past learning_starts with the algorithm's own actions
            for _ in range(args.fill):
                action, extras = corral_algo.explore(obs)
                nxt, rew, term, trunc, info = learner.env.step(action)
                corral_algo.observe(Step(obs, extras, rew, term, trunc, info["final_obs"], nxt))
                obs = nxt
        corral_algo.cfg.gradient_steps = G
        model = (classes[algo] or sb3.SAC)("MlpPolicy", env_id, seed=0, device="cpu", verbose=0, **kwargs)
        model.learn(args.fill)
        torch.set_num_threads(args.threads)
        runs = {
            "corral": lambda: corral_algo.update(0.5),
            "sb3": lambda: model.train(gradient_steps=G, batch_size=model.batch_size),
        }
        if algo in ("dqn", "sac"):
            bare = bare_step(algo)
            runs["bare"] = lambda: [bare() for _ in range(G)]
        times = {k: [] for k in runs}
        for _ in range(args.repeats):  # interleaved: the machine is shared
            for name, fn in runs.items():
                t0 = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - t0) / G * 1e3)
        best = {k: min(v) for k, v in times.items()}
        med = {k: float(np.median(v)) for k, v in times.items()}
        row = {"algo": algo, "threads": torch.get_num_threads(), "ms_per_step_best": {k: round(v, 3) for k, v in best.items()},
               "ms_per_step_median": {k: round(v, 3) for k, v in med.items()},
               "corral/sb3": round(med["corral"] / med["sb3"], 3),
               **({"bare/sb3": round(med["bare"] / med["sb3"], 3)} if "bare" in med else {}),
               "loadavg": [round(x, 2) for x in __import__("os").getloadavg()]}
        print(json.dumps(row), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--algos", nargs="+", default=["dqn", "sac"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--skip-sb3", action="store_true")
    p.add_argument("--rounds", type=int, default=1, help="whole-run rounds per library, in ABBA order (medians reported)")
    p.add_argument("--per-step", action="store_true", help="time single gradient steps (and the bare matmuls)")
    p.add_argument("--threads", type=int, default=1, help="torch threads, both libraries")
    p.add_argument("--repeats", type=int, default=7, help="--per-step: interleaved repeats")
    p.add_argument("--fill", type=int, default=3000, help="--per-step: env steps collected before timing")
    p.add_argument("--steps", type=int, default=None,
                   help="whole runs: env steps for both libraries instead of the preset's (a shorter timing run)")
    p.add_argument("--worker", choices=["corral", "sb3"], default=None,
                   help="internal: one whole run of this library (first algo and seed), printed as JSON")
    p.add_argument("--set", dest="sets", action="append", default=[],
                   help="corral config overrides for its runs (KEY=VALUE, repeatable), e.g. --set keep_heap=false")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.per_step:
        per_step(args)
        return
    if args.worker:
        if args.worker == "corral":
            out = run_corral(args.algos[0], args.seeds[0], args.steps, args.sets)
        else:
            out = run_sb3(args.algos[0], args.seeds[0], args.steps)
        print(json.dumps(list(out)), flush=True)
        return
    for algo in args.algos:
        for seed in args.seeds:
            runs = {"corral": [], "sb3": []}
            for r in range(args.rounds):
                # ABBA order: on a shared machine the load drifts, so neither side always goes first
                order = ["corral", "sb3"] if r % 2 == 0 else ["sb3", "corral"]
                for lib in order:
                    if lib == "sb3" and args.skip_sb3:
                        continue
                    wall, cpu, ret, grad_cpu = run_worker(lib, algo, seed, args)
                    runs[lib].append((wall, cpu, ret))
                    print(json.dumps({"algo": algo, "seed": seed, "round": r, "lib": lib, "wall_s": round(wall, 1),
                                      "cpu_s": round(cpu, 1), "eval": round(ret, 1),
                                      # process CPU in the gradient steps, and per env step outside them
                                      "grad_cpu_s": round(grad_cpu, 1),
                                      "collect_cpu_ms_per_step": round((cpu - grad_cpu) / (args.steps or PRESETS[algo][1]) * 1e3, 3),
                                      "loadavg": [round(x, 2) for x in os.getloadavg()]}), flush=True)
            row = {"algo": algo, "seed": seed, "rounds": args.rounds, "steps": args.steps or PRESETS[algo][1]}
            for lib, rs in runs.items():
                if rs:
                    row[f"{lib}_wall_s"] = round(float(np.median([x[0] for x in rs])), 1)
                    row[f"{lib}_cpu_s"] = round(float(np.median([x[1] for x in rs])), 1)
                    row[f"{lib}_eval"] = [round(x[2], 1) for x in rs]
            if runs["sb3"]:
                row["ratio_wall"] = round(row["corral_wall_s"] / row["sb3_wall_s"], 3)
                row["ratio_cpu"] = round(row["corral_cpu_s"] / row["sb3_cpu_s"], 3)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
