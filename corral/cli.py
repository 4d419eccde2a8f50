"""``corral train / eval / resume / export / list / plot / bench / report``. Everything here is reachable from the API."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from corral.errors import TrainingError, UserError


def _cmd_train(args) -> int:
    from corral import config as C
    from corral.train.learner import Learner
    from corral.train.setup import build_config, new_run_dir

    cfg = build_config(
        args.algo, args.env, steps=args.steps, seed=args.seed, num_envs=args.num_envs, device=args.device,
        config_file=args.config, sets=args.set or [], stop_at_return=args.stop_at_return,
        use_preset=not args.no_preset, tag=args.tag, imports=args.imports or [], zoo=args.zoo, lenient=args.lenient,
    )
    if args.json:
        cfg.progress = False
    learner = Learner(cfg, None)  # build everything before touching the disk: bad input leaves no run dir
    learner.run_dir = new_run_dir(cfg, args.run_dir)
    (learner.run_dir / "config.yaml").write_text(C.dump_yaml(cfg))
    return _finish(learner, args.json)


def _finish(learner, as_json: bool) -> int:
    """Train to the end; the first Ctrl-C / SIGTERM pauses the run with a checkpoint instead."""
    from corral.train.pause import train_pausable

    summary, paused = train_pausable(learner)
    if as_json:
        print(json.dumps(summary))
    if paused is not None:
        print(f"corral: stopped at {summary['env_steps']:,} steps, unfinished; continue it with: corral resume "
              f"{summary['run_dir']}", file=sys.stderr)
        return paused
    if not as_json:
        ev = f", eval {summary['eval_return']:.1f} ± {summary['eval_return_std']:.1f}" if "eval_return" in summary else ""
        last = summary["last20_return"]
        print(f"done: {summary['env_steps']:,} steps in {summary['train_seconds']:.1f}s, {summary['episodes']} episodes, "
              f"last-20 return {last if last is None else round(last, 1)}{ev}; run: {summary['run_dir']}")
    return 0


def _cmd_resume(args) -> int:
    from corral.train.resume import resume_learner

    learner = resume_learner(args.run_dir, steps=args.steps, device=args.device, sets=args.set or [],
                             progress=False if args.json else None)
    return _finish(learner, args.json)


def _cmd_eval(args) -> int:
    import corral

    agent = corral.load(args.path, device=args.device)
    deterministic = not args.stochastic
    if args.video:
        from corral.envs.video import record_video

        videos = record_video(agent.algo.policy(deterministic), agent.cfg.env.id,
                              args.video, episodes=args.episodes, kwargs=agent.cfg.env.kwargs, seed=args.seed,
                              device=agent.algo.device)
        for v in videos:
            print(f"wrote {v.path} (return {v.episode_return:.1f}, {v.episode_length} steps)", file=sys.stderr)

    def on_episode(finished: int, total: int, mean: float, seconds: float) -> None:
        print(f"episode {finished}/{total}: running mean {mean:.2f}, {seconds:.1f} s", file=sys.stderr, flush=True)

    result = corral.evaluate(agent, episodes=args.episodes, seed=args.seed,
                             deterministic=False if args.stochastic else None,
                             epsilon=args.epsilon, max_episode_steps=args.max_episode_steps,
                             max_seconds=args.max_seconds, on_episode=None if args.quiet else on_episode)
    if args.json:
        print(json.dumps(result))
        return 0
    lo, hi = result["ci95_return"]
    print(f"{result['env']}: mean return {result['mean_return']:.2f} ± {result['std_return']:.2f} "
          f"over {result['episodes']} episodes (median {result['median_return']:.2f}, min {result['min_return']:.2f}, "
          f"max {result['max_return']:.2f}, 95% CI of the mean [{lo:.2f}, {hi:.2f}])")
    from corral.train.evaluate import describe_result

    print(f"protocol: {describe_result(result)}")
    return 0


def _cmd_export(args) -> int:
    import corral
    from corral.export import FORMATS, ExportError

    if args.format not in FORMATS:  # before anything is loaded
        raise UserError(f"unknown export format {args.format!r}; use one of {', '.join(FORMATS)}")
    agent = corral.load(args.path, device="cpu")
    try:
        out = agent.export(args.out, format=args.format)
    except ExportError as e:
        print(f"corral: export failed: {e} (nothing was written)", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(out))
    else:
        inputs = ", ".join(f"{n} [{', '.join(map(str, shape))}] {dtype}" for n, shape, dtype in out["inputs"])
        print(f"wrote {out['path']} ({out['format']}; inputs: {inputs}; outputs: {', '.join(out['outputs'])}); "
              f"parity with the PyTorch policy on {out['checked_batch']} sample observations: "
              f"max abs difference {out['max_abs_diff']:.2g}")
    return 0


def _cmd_ensemble(args) -> int:
    import corral
    from corral.population.ensemble import Ensemble, fuse

    members = [corral.load(p, device="cpu") for p in args.runs]
    weights = args.weights
    if weights is not None and weights != "eval":
        try:
            weights = [float(x) for x in weights.split(",")]
        except ValueError:
            raise UserError(f"--weights {args.weights!r}: give comma-separated numbers (one per run) or 'eval'") from None
    returns = [corral.evaluate(m, episodes=args.episodes, seed=args.seed)["mean_return"] for m in members]
    if weights == "eval":
        from corral.population.ensemble import weights_from_returns

        weights = weights_from_returns(returns)
    agent = fuse(members, weights) if args.fuse else Ensemble(members, weights)
    result = corral.evaluate(agent, episodes=args.episodes, seed=args.seed)
    out = Path(args.out or ("fused.pt" if args.fuse else "ensemble.pt"))
    agent.save(out)
    summary = {"members": [{"run": r, "eval_return": ret} for r, ret in zip(args.runs, returns)],
               "weights": agent.weights if not args.fuse else (weights or [1 / len(members)] * len(members)),
               "kind": "fused" if args.fuse else "ensemble", "eval_return": result["mean_return"],
               "eval_return_std": result["std_return"], "path": str(out)}
    if args.json:
        print(json.dumps(summary))
        return 0
    for m, w in zip(summary["members"], summary["weights"]):
        print(f"  {m['eval_return']:9.2f}  weight {w:.3f}  {m['run']}")
    print(f"{summary['kind']}: eval {result['mean_return']:.2f} ± {result['std_return']:.2f} over "
          f"{result['episodes']} episodes (mean member {sum(returns) / len(returns):.2f}); wrote {out}")
    return 0


def _space_args(items, path) -> dict:
    from corral.population.space import load_space_file, parse_space

    space = load_space_file(path) if path else {}
    space.update(parse_space(items or []))
    return {k: d.text() if d.kind != "choice" else list(d.choices) for k, d in space.items()}


def _cmd_tune(args) -> int:
    from corral.population.tune import format_table, tune

    space = _space_args(args.space, args.space_file)
    s = tune(args.algo, args.env, space, trials=args.trials, steps=args.steps, iterations=args.iterations,
             search=args.search, scheduler=args.scheduler, concurrency=args.concurrency,
             eval_episodes=args.eval_episodes, seed=args.seed, sets=args.set or [], out=args.out,
             num_cpus=args.num_cpus, cpus_per_trial=args.cpus_per_trial, resume=args.resume)
    if args.json:
        print(json.dumps({k: v for k, v in s.items()}, default=str))
        return 0
    print(format_table(s["trials"], list(space)))
    b = s["best"]
    print(f"best: trial {b['trial']}, eval {b['eval_return']:.1f}; wrote {s['best_yaml']} "
          f"(corral train {args.algo} {args.env} --config {s['best_yaml']}), {s['table']}, {s['plot']}")
    return 0


def _cmd_pbt(args) -> int:
    from corral.population.pbt import pbt

    initial = {}
    for item in args.init or []:
        key, eq, values = item.partition("=")
        if not eq:
            raise UserError(f"--init {item!r}: write KEY=V1,V2,... (one value per member)")
        import yaml

        initial[key] = [yaml.safe_load(v) for v in values.split(",")]
    r = pbt(args.algo, args.env, mutations=_space_args(args.mutate, None), initial=initial,
            population=args.population, iterations=args.iterations, steps_per_iteration=args.steps_per_iteration,
            quantile=args.quantile, resample_probability=args.resample_probability, seed=args.seed,
            sets=args.set or [], eval_episodes=args.eval_episodes, out=args.out, num_cpus=args.num_cpus,
            cpus_per_trial=args.cpus_per_trial, resume=args.resume)
    if args.json:
        print(json.dumps({k: v for k, v in r.items() if k != "rows"}, default=str))
        return 0
    for m in sorted(r["final"], key=lambda m: -m["eval_return"]):
        print(f"  {m['trial']}  eval {m['eval_return']:8.1f}  " + "  ".join(f"{k}={v:.4g}" if isinstance(v, float)
                                                                         else f"{k}={v}" for k, v in m.items()
                                                                         if k not in ("trial", "iteration",
                                                                                      "env_steps", "eval_return")))
    print(f"best: {r['best']['trial']} (eval {r['best']['eval_return']:.1f}); schedules: {r['schedules']}, {r['plot']}")
    return 0


def _cmd_bench(args) -> int:
    from corral.bench import cli as bench_cli

    return bench_cli.bench(args)


def _cmd_report(args) -> int:
    from corral.bench import cli as bench_cli

    return bench_cli.report(args)


def _cmd_list(args) -> int:
    from corral.algos import ALGOS, get_algo
    from corral.train.setup import list_presets

    if args.zoo:
        return _list_zoo()

    if args.options:
        from corral import config as C

        spec = get_algo(args.options)
        for prefix, cls in (("", C.TrainConfig), ("env.", C.EnvConfig), ("eval.", C.EvalConfig),
                            ("checkpoint.", C.CheckpointConfig), ("scheme.", C.SchemeConfig), ("log.", C.LogConfig),
                            (args.options + ".", spec.cls.Config)):
            for f in dataclasses.fields(cls):
                if f.name in ("env", "eval", "checkpoint", "scheme", "log", "algo_cfg"):
                    continue
                default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
                if prefix == args.options + ".":
                    default = spec.overrides.get(f.name, default)  # a variant's own values (rainbow: n_step 3)
                elif prefix == "" and f.name == "algo":
                    default = args.options
                print(f"  {prefix + f.name:28s} {str(default):14s} {C.describe(f)}")
        return 0
    print("algorithms:")
    for name, spec in ALGOS.items():
        print(f"  {name:14s} {spec.help}")
    print("presets (algorithm: envs):")
    for algo, envs in list_presets().items():
        print(f"  {algo}: {', '.join(envs)}")
    print("env families:")
    print("  classic control  CartPole-v1, Acrobot-v1, MountainCar-v0, MountainCarContinuous-v0, Pendulum-v1")
    print("  toy text         FrozenLake-v1, FrozenLake8x8-v1, Taxi-v4, CliffWalking-v1, Blackjack-v1")
    print("                   (Discrete observations: one-hot inside the networks, stored as integers)")
    print("  box2d            LunarLander-v3, BipedalWalker-v3, CarRacing-v3   (pip install 'corral[box2d]')")
    print("  mujoco           HalfCheetah-v5, Hopper-v5, Walker2d-v5, Ant-v5    (pip install 'corral[mujoco]')")
    print("  pybullet         HalfCheetahBulletEnv-v0, AntBulletEnv-v0, ...      (pip install 'corral[pybullet]')")
    print("  minigrid         MiniGrid-Empty-5x5-v0, BabyAI-GoToRedBallNoDists-v0, ... (pip install 'corral[minigrid]')")
    print("  atari            ALE/Pong-v5, ALE/Breakout-v5, ...                  (pip install 'corral[atari]')")
    print("  native           native:CartPole-v1, native:Pendulum-v1, ...        (torch-batched, CPU or GPU)")
    print("  multi-agent      mpe:simple_spread_v3, pettingzoo:family.name_vN     (pip install 'corral[multiagent]';")
    print("                   PettingZoo envs for mappo, ippo, qmix, vdn: docs/multiagent.md)")
    print("  your own         package.module:callable, path/to/file.py:Class, corral.register(name, factory)")
    return 0


def _list_zoo() -> int:
    from corral.zoo import list_entries

    rows = list_entries()
    for r in rows:
        why = "; ".join(f"{k}: {v}" for k, v in r["reasons"].items()) if r["status"] == "refused" else ""
        print(f"  {r['algo']:9s} {r['env']:36s} {r['status']}" + (f"  ({why})" if why else ""))
    counts = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(f"{len(rows)} entries: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda x: -x[1]))
          + " (not installed: the env id is not registered here; `corral train ALGO ENV --zoo` runs an entry)")
    return 0


def _cmd_plot(args) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {}
    for rd in args.run_dirs:
        path = Path(rd) / "metrics.jsonl"
        if not path.is_file():
            raise UserError(f"{rd!r} has no metrics.jsonl; give run directories made by `corral train`")
        runs[Path(rd).name] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    # runs with at most their final evaluation: one panel, the evaluation a marker on the curve's
    curves = any(sum("eval_return" in r for r in rows) > 1 for rows in runs.values())
    fig, axes = plt.subplots(1, 2 if curves else 1, figsize=(11, 4) if curves else (6.5, 4), squeeze=False)
    for name, rows in runs.items():
        for ax, key in zip((axes[0][0], axes[0][-1]), ("episode_return", "eval_return")):
            pts = [(r["step"], r[key]) for r in rows if key in r]
            if pts:
                ax.plot(*zip(*pts), label=name if curves or key == "episode_return" else f"{name}: held-out evaluation",
                        marker="o" if key == "eval_return" else None, linestyle="-" if curves or key != "eval_return"
                        else "none")
    for ax, title in zip(axes[0], ("training return", "evaluation return") if curves else ("return",)):
        ax.set_title(title)
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    out = args.out or str(Path(args.run_dirs[0]) / "curves.png")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)
    return 0


def _add_train(sub) -> None:
    t = sub.add_parser("train", help="train an algorithm on an env")
    t.add_argument("algo", help="algorithm, e.g. ppo (see `corral list`)")
    t.add_argument("env", nargs="?", default="CartPole-v1", help="Gymnasium id, module:callable or file.py:Class")
    t.add_argument("--steps", type=int, help="env steps to train for")
    t.add_argument("--seed", type=int)
    t.add_argument("--num-envs", type=int)
    t.add_argument("--device", help="auto, cpu, cuda")
    t.add_argument("--run-dir", help="run directory (default runs/<algo>-<env>-s<seed>-<time>)")
    t.add_argument("--config", help="YAML config file: corral's, or one of rl-zoo's hyperparameter files "
                                    "(hyperparams/ALGO.yml: the entry for ENV, else 'atari' / 'default')")
    t.add_argument("--zoo", action="store_true", help="take ENV's entry from rl-zoo's bundled hyperparams/ALGO.yml "
                                                      "(needs corral[zoo]: rl_zoo3); n_timesteps is the budget "
                                                      "unless --steps is given")
    t.add_argument("--lenient", action="store_true", help="with an rl-zoo file: skip the keys corral cannot honour, "
                                                          "one line each on stderr, instead of refusing the file")
    t.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    t.add_argument("--stop-at-return", type=float, help="stop when the last-20 training return reaches this")
    t.add_argument("--no-preset", action="store_true", help="ignore the (algo, env) preset")
    t.add_argument("--import", dest="imports", action="append", metavar="MODULE",
                   help="import a module (or path/file.py) first: it may register algorithms and envs (repeatable)")
    t.add_argument("--tag", help="a name for the run: added to the run directory's name, recorded in TensorBoard "
                                 "and config.yaml (log.tag)")
    t.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    t.set_defaults(fn=_cmd_train)


def _add_eval_resume_export(sub) -> None:
    e = sub.add_parser("eval", help="evaluate a run directory or checkpoint")
    e.add_argument("path")
    e.add_argument("--episodes", type=int, default=10)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--stochastic", action="store_true", help="sample actions instead of the mode")
    e.add_argument("--epsilon", type=float, help="chance of a random action (default: the run's eval.epsilon; "
                                                 "0.05 for value methods on Atari, else 0)")
    e.add_argument("--max-episode-steps", type=int, help="episode cap in agent steps (default: eval.max_episode_steps; "
                                                         "Atari 27,000, else the env's own limit)")
    e.add_argument("--max-seconds", type=float, help="time budget: report the episodes finished by then")
    e.add_argument("--quiet", action="store_true", help="no line per finished episode on stderr")
    e.add_argument("--device", default="auto")
    e.add_argument("--video", metavar="DIR", help="also write one MP4 per episode into DIR")
    e.add_argument("--json", action="store_true")
    e.set_defaults(fn=_cmd_eval)

    r = sub.add_parser(
        "resume", help="continue a run from its latest checkpoint",
        description="Continue a run from checkpoints/latest.pt. With the same budget the result equals a run "
                    "that never stopped. --steps N sets a new total budget: schedules are fractions of the "
                    "run's budget, so from the resume point on they are those of a run launched with N steps "
                    "(progress = env steps / N: linear lr and clip ranges go to 0 at N, epsilon decays over "
                    "exploration_fraction x N, PER beta reaches per_beta_final at N). A schedule can jump at "
                    "the resume point (a finished run's linear lr from 0 to lr x (1 - old/N); epsilon back up "
                    "while env steps < exploration_fraction x N); see docs/architecture.md.")
    r.add_argument("run_dir")
    r.add_argument("--steps", type=int, help="new total step budget (schedules follow it, see above)")
    r.add_argument("--device", help="device to continue on (default: the run's); random streams saved on "
                                    "another device type are reseeded, with a note")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=_cmd_resume)

    x = sub.add_parser("export", help="write the deterministic policy as ONNX, TorchScript or an ExportedProgram",
                       description="Export a run's (or checkpoint's) deterministic policy, observation normalizer "
                                   "and action scaling included, and check it against the PyTorch policy on "
                                   "sample observations (exit 1 if they differ by more than 1e-5). "
                                   "See docs/export.md for the input convention.")
    x.add_argument("path", help="run directory (best, else latest checkpoint) or checkpoint file")
    x.add_argument("--format", default="onnx", help="onnx (default), torchscript or exported-program")
    x.add_argument("--out", help="output file (default <run_dir>/policy.onnx / .pt / .pt2)")
    x.add_argument("--json", action="store_true", help="print what was written as JSON")
    x.set_defaults(fn=_cmd_export)


def _add_list_plot_ensemble(sub) -> None:
    li = sub.add_parser("list", help="algorithms, presets, env families")
    li.add_argument("--options", metavar="ALGO", help="every config key of ALGO with default and help")
    li.add_argument("--zoo", action="store_true", help="every entry of rl-zoo's bundled hyperparameter files: "
                                                       "ok, or refused with the reason (needs corral[zoo])")
    li.set_defaults(fn=_cmd_list)

    pl = sub.add_parser("plot", help="learning curves of one or more runs")
    pl.add_argument("run_dirs", nargs="+")
    pl.add_argument("--out")
    pl.set_defaults(fn=_cmd_plot)

    en = sub.add_parser("ensemble", help="combine trained runs into one agent (weighted vote or fused parameters)",
                        description="Average the runs' action distributions (policy-gradient family) or Q-values "
                                    "(value family), or with --fuse their parameters (same architecture; "
                                    "normalizer statistics pooled). Evaluates members and the result, and saves "
                                    "the result as one agent (corral eval / corral.load read it). docs/populations.md")
    en.add_argument("runs", nargs="+", help="run directories or checkpoint files (one env)")
    en.add_argument("--weights", help="comma-separated, one per run, or 'eval' (from the members' eval returns); "
                                      "default equal")
    en.add_argument("--fuse", action="store_true", help="average parameters into one network instead of voting")
    en.add_argument("--episodes", type=int, default=10, help="evaluation episodes per member and for the result")
    en.add_argument("--seed", type=int, default=0)
    en.add_argument("--out", help="file to write (default ensemble.pt, or fused.pt with --fuse)")
    en.add_argument("--json", action="store_true")
    en.set_defaults(fn=_cmd_ensemble)


def _add_tune_pbt(sub) -> None:
    for name, helptext in (("tune", "hyper-parameter search on Ray Tune (Optuna TPE or random, ASHA)"),
                           ("pbt", "population-based training on Ray Tune")):
        tp = sub.add_parser(name, help=helptext, description=helptext + "; docs/populations.md")
        tp.add_argument("algo")
        tp.add_argument("env", nargs="?", default="CartPole-v1")
        if name == "tune":
            tp.add_argument("--space", action="append", metavar="KEY=KIND:ARGS",
                            help="a searched key: loguniform:LO:HI, uniform:LO:HI, randint:LO:HI, choice:A,B,... "
                                 "(repeatable), e.g. ppo.lr=loguniform:1e-4:1e-2")
            tp.add_argument("--space-file", help="YAML mapping of keys to the same specs (or under 'space:')")
            tp.add_argument("--trials", type=int, default=8)
            tp.add_argument("--steps", type=int, default=50_000, help="env steps per trial")
            tp.add_argument("--iterations", type=int, default=5, help="evaluations per trial (ASHA's rungs)")
            tp.add_argument("--search", default="optuna", help="optuna (TPE, default) or random")
            tp.add_argument("--scheduler", default="asha", help="asha (early stopping, default) or none")
            tp.add_argument("--concurrency", type=int, default=2, help="trials at once")
            tp.add_argument("--out", default="tune", help="output folder (runs/, trials.csv, best.yaml, tune.png, ray/)")
        else:
            tp.add_argument("--mutate", action="append", metavar="KEY=KIND:ARGS", required=True,
                            help="a hyper-parameter PBT explores (repeatable), e.g. ppo.lr=loguniform:1e-5:1e-2")
            tp.add_argument("--init", action="append", metavar="KEY=V1,V2,...",
                            help="starting values, one per member (default: sampled)")
            tp.add_argument("--population", type=int, default=4)
            tp.add_argument("--iterations", type=int, default=10)
            tp.add_argument("--steps-per-iteration", type=int, default=10_000)
            tp.add_argument("--quantile", type=float, default=0.25, help="bottom / top fraction for exploit")
            tp.add_argument("--resample-probability", type=float, default=0.25)
            tp.add_argument("--out", default="pbt", help="output folder (runs/, schedules.csv/json/png, ray/)")
        tp.add_argument("--eval-episodes", type=int, default=10)
        tp.add_argument("--seed", type=int, default=0)
        tp.add_argument("--set", action="append", metavar="KEY=VALUE", help="a fixed override for every trial")
        tp.add_argument("--num-cpus", type=int, help="CPUs for the local Ray (default: all)")
        tp.add_argument("--cpus-per-trial", type=float, default=1.0)
        tp.add_argument("--resume", action="store_true", help="continue the interrupted search in --out")
        tp.add_argument("--json", action="store_true")
        tp.set_defaults(fn=_cmd_tune if name == "tune" else _cmd_pbt)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="corral", description="corral: deep reinforcement learning on PyTorch")
    sub = p.add_subparsers(dest="cmd", required=True)
    _add_train(sub)
    _add_eval_resume_export(sub)
    _add_list_plot_ensemble(sub)
    _add_tune_pbt(sub)

    from corral.bench.cli import add_parsers as add_bench_parsers

    add_bench_parsers(sub, _cmd_bench, _cmd_report)

    from corral.solve import add_solve_parser

    add_solve_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rc = args.fn(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return rc
    except BrokenPipeError:
        # The reader left (`corral list --options ppo | head`): stop quietly. stdout goes to
        # devnull so the interpreter's last flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # what a shell reports for a process ended by SIGPIPE
    except UserError as e:
        print(f"corral: error: {e}", file=sys.stderr)
        return 2
    except TrainingError as e:
        print(f"corral: training stopped: {e} (the last good checkpoint is kept)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("corral: interrupted (the last checkpoint written is intact)", file=sys.stderr)
        return 130
    except Exception as e:
        from corral.envs.base import EnvError

        if isinstance(e, EnvError):
            print(f"corral: env error: {e}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
