"""Multi-agent pixel envs against single-agent Atari (issue 38): training throughput and peak memory.

``throughput``: IPPO and MAPPO on PettingZoo's ``cooperative_pong_v6`` (2 agents) and
``pistonball_v6`` (20 agents), each against PPO on ``ALE/Pong-v5`` with **as many Atari envs as
the multi-agent run has agents in all** (``N`` envs x ``A`` agents): each agent is one stream
of 84x84 grey frames, 4 stacked, through a Nature CNN with linear heads, as each Atari env is.
Both sides train with the same rollout (``--n-steps`` steps per env), minibatch
(``--batch-size`` agent steps) and epochs (``--epochs``), so each update sees the same number
of samples per minibatch. A multi-agent vector step is ``A`` agent steps; Atari's is ``N x A``
env steps; the figure compared is **samples per second** (agent steps, Atari env steps),
measured over the training window (the Learner's ``train_seconds``: first reset to the last
update, construction excluded). Every run is a fresh process (its own peak RSS, ``ru_maxrss``),
and the runners go A B B A over ``--rounds`` so drift in the machine's load falls on both.

``docs``: the docs' example, ``corral train mappo pettingzoo:butterfly.pistonball_v6`` (its
preset: 4 envs x 64 steps, minibatches of 512 agent steps), for ``--steps`` env steps, in a
fresh process; its peak resident memory (``ru_maxrss`` of the child) against the 4 GB bar.

    python benchmarks/bench_ma_pixels.py throughput --updates 3 --rounds 1
    python benchmarks/bench_ma_pixels.py docs --steps 1024
    python benchmarks/bench_ma_pixels.py learn ippo pettingzoo:butterfly.cooperative_pong_v6 --steps 200000
    python benchmarks/bench_ma_pixels.py learn mappo pettingzoo:sisl.multiwalker_v9 --steps 100000

``learn``: a run at the env's preset (``--set`` on top), then its greedy and its sampled
policy's team returns on held-out episodes (seeds 10,000 + seed onwards) beside a random
team's (episodes one after another in one env; again with its actions held for the run's frame
skip, where it has one).

Timings are of whatever machine runs it: state its load beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

# name: (id, agents, multi-agent envs by default: Atari gets agents x this many)
ENVS = {"cooperative_pong": ("pettingzoo:butterfly.cooperative_pong_v6", 2, 4),
        "pistonball": ("pettingzoo:butterfly.pistonball_v6", 20, 1)}
COMMON = ["progress=false", "tensorboard=false", "eval.episodes=0", "checkpoint.every=0"]


def one(kind: str, algo: str, env: str, num_envs: int, n_steps: int, batch: int, epochs: int, updates: int,
        seed: int) -> dict:
    """One training run in this process: samples per second and this process's peak RSS."""
    import torch

    from corral.train.learner import Learner
    from corral.train.setup import build_config

    torch.set_num_threads(1)
    if kind == "atari":
        sets = [f"env.num_envs={num_envs}", f"ppo.n_steps={n_steps}", f"ppo.batch_size={batch}",
                f"ppo.n_epochs={epochs}", "ppo.hidden=[]"]
        cfg = build_config("ppo", "ALE/Pong-v5", steps=updates * n_steps * num_envs, seed=seed,
                           sets=[*COMMON, *sets])
        agents = 1
    else:
        env_id, agents, _ = ENVS[env]
        sets = [f"env.num_envs={num_envs}", f"{algo}.n_steps={n_steps}", f"{algo}.batch_size={batch}",
                f"{algo}.n_epochs={epochs}", f"{algo}.hidden=[]", "env.pixels={size: 84, grey: true, stack: 4}"]
        cfg = build_config(algo, env_id, steps=updates * n_steps * num_envs, seed=seed, sets=[*COMMON, *sets])
    learner = Learner(cfg, None)
    summary = learner.train()
    seconds = summary["train_seconds"]
    env_steps = summary["env_steps"]
    samples = env_steps * agents
    return {"kind": kind, "algo": algo, "env": env, "num_envs": num_envs, "agents": agents, "env_steps": env_steps,
            "samples": samples, "seconds": seconds, "samples_per_s": samples / seconds,
            "env_steps_per_s": env_steps / seconds,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9}


def child(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, "one", *args], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    if out.returncode:
        raise SystemExit(f"run {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def throughput(a) -> None:
    rows = []
    for env in a.envs:
        _, agents, default_envs = ENVS[env]
        n = a.num_envs or default_envs
        for algo in a.algos:
            common = [str(a.n_steps), str(a.batch_size), str(a.epochs), str(a.updates), str(a.seed)]
            ma = ["ma", algo, env, str(n), *common]
            atari = ["atari", "ppo", env, str(n * agents), *common]
            runs: dict[str, list[dict]] = {"ma": [], "atari": []}
            for r in range(a.rounds):
                order = [ma, atari] if r % 2 == 0 else [atari, ma]
                for args in order + order[::-1]:
                    res = child(args)
                    runs[args[0]].append(res)
                    print(json.dumps(res), flush=True)
            best = {k: max(x["samples_per_s"] for x in v) for k, v in runs.items()}
            row = {"env": env, "algo": algo, "envs": n, "agents": agents, "atari_envs": n * agents,
                   "ma_samples_per_s": best["ma"], "ma_env_steps_per_s": best["ma"] / agents,
                   "atari_samples_per_s": best["atari"], "ratio_atari_over_ma": best["atari"] / best["ma"],
                   "ma_peak_rss_gb": max(x["peak_rss_gb"] for x in runs["ma"]),
                   "atari_peak_rss_gb": max(x["peak_rss_gb"] for x in runs["atari"])}
            rows.append(row)
            print("RESULT " + json.dumps(row), flush=True)
    print("| env | algo | envs x agents | MA agent steps/s | Atari envs | Atari env steps/s | Atari / MA | "
          "peak RSS MA / Atari |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['env']} | {r['algo']} | {r['envs']} x {r['agents']} | {r['ma_samples_per_s']:.0f} | "
              f"{r['atari_envs']} | {r['atari_samples_per_s']:.0f} | {r['ratio_atari_over_ma']:.2f} | "
              f"{r['ma_peak_rss_gb']:.2f} / {r['atari_peak_rss_gb']:.2f} GB |")


def docs_example(a) -> None:
    cmd = [sys.executable, "-m", "corral.cli", "train", "mappo", "pettingzoo:butterfly.pistonball_v6",
           "--steps", str(a.steps), "--seed", str(a.seed), "--set", "progress=false", "--set", "tensorboard=false",
           "--set", f"eval.episodes={a.eval_episodes}"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    print(out.stdout[-2000:])
    if out.returncode:
        raise SystemExit(f"the docs' example failed:\n{out.stderr[-3000:]}")
    print("RESULT " + json.dumps({"command": " ".join(cmd[1:]), "seconds": round(seconds, 1),
                                  "peak_rss_gb": round(peak / 1e9, 3), "under_4gb": peak < 4e9}))


def learn(a) -> None:
    """Train ``algo`` on ``env`` at its preset (``--set`` on top), printing a line every
    ``--log-every`` updates; then the greedy (mode-action) policy's team return over ``--episodes``
    held-out episodes (seeds from 10,000 + seed), the sampled policy's on the same seeds, and a
    random team's (each agent uniform over its own actions) over as many episodes played one
    after another in one env: a vector env's first-finished episodes would favour short ones."""
    import torch
    import yaml

    import corral
    from corral.envs.multiagent import random_team_return
    from corral.train.learner import Learner
    from corral.train.setup import build_config

    torch.set_num_threads(1)
    sets = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in a.set)}
    t0, c0 = time.perf_counter(), time.process_time()

    class Log:  # a Learner hook: called after every update, closed at the end
        def __call__(self, learner, stats):
            if learner.updates % a.log_every == 0:
                print(f"{learner.env_steps} steps {time.process_time() - c0:.0f} cpu-s last20 "
                      f"{learner.last20_return:.2f} ent {stats.get('entropy', 0):.3f} "
                      f"kl {stats.get('approx_kl', 0):.4f} ev {stats.get('explained_variance', 0):.2f}",
                      file=sys.stderr, flush=True)

        def close(self, learner):
            pass

    cfg = build_config(a.algo, a.env, steps=a.steps, seed=a.seed,
                       overrides={"progress": False, "tensorboard": False, "eval.episodes": 0, **sets})
    learner = Learner(cfg, None)
    summary = learner.train(hooks=[Log()])
    agent = corral.Agent(learner.algo, cfg, None, summary=summary)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    if a.save:
        agent.save(a.save)
    res = corral.evaluate(agent, episodes=a.episodes, seed=10_000 + a.seed, deterministic=True)
    sampled = corral.evaluate(agent, episodes=a.episodes, seed=10_000 + a.seed, deterministic=False)
    rnd = random_team_return(a.env, tuple(cfg.env.opponents), a.episodes, 10_000 + a.seed, dict(cfg.env.kwargs),
                             num_envs=1)
    skip = (cfg.env.pixels or {}).get("skip", 1)  # the random team again, its actions held as the policy's are
    rnd_skip = random_team_return(a.env, tuple(cfg.env.opponents), a.episodes, 10_000 + a.seed,
                                  dict(cfg.env.kwargs), num_envs=1, pixels=cfg.env.pixels) if skip > 1 else rnd
    print("RESULT " + json.dumps({"algo": a.algo, "env": a.env, "steps": summary["env_steps"], "seed": a.seed,
                                  "sets": sets, "train_seconds": round(seconds, 1),
                                  "train_cpu_seconds": round(cpu, 1), "episodes": a.episodes,
                                  "mean_return": res["mean_return"], "ci95": res.get("ci95_return"),
                                  "mean_length": res.get("mean_length"),
                                  "sampled_return": sampled["mean_return"], "sampled_ci95": sampled.get("ci95_return"),
                                  "random_team": rnd, "random_team_skip": rnd_skip,
                                  "gain": res["mean_return"] - max(rnd, rnd_skip),
                                  "sampled_gain": sampled["mean_return"] - max(rnd, rnd_skip),
                                  "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9}),
          flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    t.add_argument("--algos", nargs="+", default=["ippo", "mappo"])
    t.add_argument("--num-envs", type=int, default=0,
                   help="multi-agent envs (Atari gets this x agents); 0: cooperative_pong 4, pistonball 1")
    t.add_argument("--n-steps", type=int, default=64)
    t.add_argument("--batch-size", type=int, default=256)
    t.add_argument("--epochs", type=int, default=2)
    t.add_argument("--updates", type=int, default=3)
    t.add_argument("--rounds", type=int, default=1)
    t.add_argument("--seed", type=int, default=0)
    d = sub.add_parser("docs")
    d.add_argument("--steps", type=int, default=1024)
    d.add_argument("--eval-episodes", type=int, default=2)
    d.add_argument("--seed", type=int, default=0)
    le = sub.add_parser("learn")
    le.add_argument("algo")
    le.add_argument("env")
    le.add_argument("--steps", type=int, default=100_000)
    le.add_argument("--seed", type=int, default=0)
    le.add_argument("--episodes", type=int, default=16)
    le.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    le.add_argument("--log-every", type=int, default=10, help="a progress line (stderr) every this many updates")
    le.add_argument("--save", default="", help="save the trained agent here (corral.load reads it)")
    o = sub.add_parser("one")
    for name in ("kind", "algo", "env"):
        o.add_argument(name)
    for name in ("num_envs", "n_steps", "batch", "epochs", "updates", "seed"):
        o.add_argument(name, type=int)
    a = p.parse_args()
    if a.cmd == "one":
        print(json.dumps(one(a.kind, a.algo, a.env, a.num_envs, a.n_steps, a.batch, a.epochs, a.updates, a.seed)))
    elif a.cmd == "throughput":
        throughput(a)
    elif a.cmd == "learn":
        learn(a)
    else:
        docs_example(a)


if __name__ == "__main__":
    main()
