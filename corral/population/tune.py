"""Hyper-parameter search on Ray Tune: ``corral.tune(...)`` and ``corral tune ALGO ENV``.

A search space over any config key (``corral.population.space``), Optuna's TPE through Tune's
``OptunaSearch`` by default (``search="random"``: Tune's random search), ASHA early stopping
(``scheduler="asha"``), trials run by :class:`corral.population.trainable.CorralTrainable` (each an
ordinary corral run directory under ``<out>/runs/``), scored by the deterministic evaluation
after every iteration. Writes ``trials.csv`` (the table), ``best.yaml`` (the best trial's
config, a preset ``corral train --config`` takes), ``tune.png`` and Ray's experiment (``ray/``,
which ``resume=True`` continues)."""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import os
from pathlib import Path
from typing import Any, Sequence

import yaml

from corral import config as C
from corral.errors import UserError
from corral.population.space import Dim, parse_space

SEARCHES = ("optuna", "random")
SCHEDULERS = ("asha", "none")


@contextlib.contextmanager
def ray_session(num_cpus: int | None):
    """A local Ray for the search (joined if one is up), shut down afterwards if started here."""
    import ray

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    owns = not ray.is_initialized()
    if owns:
        from corral.schemes.ray_scheme import LOCAL_RAY_CONFIG

        ray.init(num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING, _system_config=LOCAL_RAY_CONFIG)
    try:
        yield
    finally:
        if owns:
            ray.shutdown()


def check_space(space: dict[str, Dim], algo: str, env: Any) -> None:
    """Every key is a config option (checked before Ray starts: one clear error)."""
    import random

    from corral.train.setup import build_config

    for key, dim in space.items():
        build_config(algo, env, overrides={key: dim.sample(random.Random(0))})


def trainable_params(algo: str, env: Any, sets: Sequence[str], seed: int, steps_per_iteration: int,
                     iterations: int, eval_episodes: int, runs_root: Path) -> dict:
    return {"__corral__": {"algo": algo, "env": env, "sets": list(sets), "seed": seed,
                           "steps_per_iteration": int(steps_per_iteration), "iterations": int(iterations),
                           "eval_episodes": int(eval_episodes), "runs_root": str(runs_root)}}


def trial_dirname(trial) -> str:
    return f"trial_{trial.trial_id}"


def run_config(storage: Path, name: str, stop: dict, verbose: int, keep: int = 2):
    from ray import tune

    return tune.RunConfig(name=name, storage_path=str(storage), stop=stop, verbose=verbose,
                          checkpoint_config=tune.CheckpointConfig(num_to_keep=keep, checkpoint_frequency=1,
                                                                  checkpoint_at_end=True))


def fit_trials(out: Path, name: str, resume: bool, cpus_per_trial: float, param_space: dict, tune_config,
               iterations: int, verbose: int, keep: int = 2):
    """Run (or, with ``resume`` and a saved experiment, continue) the trials of ``CorralTrainable``
    under ``out/ray/name``; returns Tune's result grid. Call inside :func:`ray_session`."""
    from ray import tune as rtune

    from corral.population.trainable import CorralTrainable

    trainable = rtune.with_resources(CorralTrainable, {"cpu": cpus_per_trial})
    path = out / "ray" / name
    if resume and path.exists():
        tuner = rtune.Tuner.restore(str(path), trainable, resume_unfinished=True, resume_errored=True)
    else:
        tuner = rtune.Tuner(trainable, param_space=param_space, tune_config=tune_config,
                            run_config=run_config(out / "ray", name, {"training_iteration": iterations}, verbose,
                                                  keep=keep))
    return tuner.fit()


def trial_rows(grid, keys: list[str]) -> list[dict]:
    """Every trial's reported iterations: trial, iteration, env steps, eval return, hyper-parameters."""
    rows = []
    for result in grid:
        df = result.metrics_dataframe
        if df is None or "eval_return" not in df:
            continue
        for rec in df.to_dict("records"):
            row = {"trial": rec.get("trial_id"), "iteration": int(rec["training_iteration"]),
                   "env_steps": int(rec["env_steps"]), "eval_return": float(rec["eval_return"])}
            for k in keys:
                row[k] = rec.get(f"hp/{k}")
            rows.append(row)
    return rows


def tune(algo: str, env: Any = "CartPole-v1", space: dict | list | None = None, *, trials: int = 8,
         steps: int = 50_000, iterations: int = 5, search: str = "optuna", scheduler: str = "asha",
         concurrency: int = 2, eval_episodes: int = 10, seed: int = 0, sets: Sequence[str] = (),
         out: str | Path = "tune", name: str | None = None, num_cpus: int | None = None,
         cpus_per_trial: float = 1.0, resume: bool = False, verbose: int = 0) -> dict:
    """Search ``space`` (``{"ppo.lr": "loguniform:1e-4:1e-2"}`` or ``["ppo.lr=loguniform:1e-4:1e-2"]``)
    for ``algo`` on ``env``: ``trials`` trials of ``steps`` env steps, each evaluated
    (``eval_episodes``, deterministic) after every one of its ``iterations``; at most
    ``concurrency`` at once. ``sets``: fixed ``key=value`` overrides for every trial. Returns
    the table (``trials``), the best trial and the paths written (see the module)."""
    if search not in SEARCHES:
        raise UserError(f"tune: search {search!r} is not one of {', '.join(SEARCHES)}")
    if scheduler not in SCHEDULERS:
        raise UserError(f"tune: scheduler {scheduler!r} is not one of {', '.join(SCHEDULERS)}")
    space = parse_space(space)
    if not space:
        raise UserError("tune: give a search space, e.g. --space ppo.lr=loguniform:1e-4:1e-2")
    if trials < 1 or iterations < 1 or steps < iterations:
        raise UserError(f"tune: need trials >= 1, iterations >= 1 and steps >= iterations "
                        f"(got {trials}, {iterations}, {steps})")
    check_space(space, algo, env)
    from corral.train.setup import build_config

    build_config(algo, env, sets=list(sets))  # the fixed overrides, checked here too
    from ray import tune as rtune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
    from ray.tune.search import BasicVariantGenerator, ConcurrencyLimiter

    out = Path(out).resolve()
    per_iter = steps // iterations
    param_space = {**trainable_params(algo, env, sets, seed, per_iter, iterations, eval_episodes, out / "runs"),
                   **{k: d.to_tune() for k, d in space.items()}}
    if search == "optuna":
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        searcher = ConcurrencyLimiter(OptunaSearch(sampler=optuna.samplers.TPESampler(seed=seed)),
                                      max_concurrent=concurrency)
    else:
        searcher = BasicVariantGenerator(random_state=seed, max_concurrent=concurrency)
    sched = (ASHAScheduler(time_attr="training_iteration", max_t=iterations, grace_period=max(1, iterations // 3),
                           reduction_factor=2) if scheduler == "asha" else FIFOScheduler())
    name = name or f"tune-{algo}-{_safe(env)}"
    path = out / "ray" / name
    with ray_session(num_cpus):
        tune_config = rtune.TuneConfig(metric="eval_return", mode="max", search_alg=searcher, scheduler=sched,
                                       num_samples=trials, trial_dirname_creator=trial_dirname)
        grid = fit_trials(out, name, resume, cpus_per_trial, param_space, tune_config, iterations, verbose)
    rows = trial_rows(grid, list(space))
    if not rows:
        errors = [str(r.error).splitlines()[-1] for r in grid if r.error is not None][:3]
        raise UserError(f"tune: no trial reported a result ({'; '.join(errors) or 'see ' + str(path)})")
    table = trial_table(rows, list(space), out / "runs", iterations)
    best = table[0]
    best_yaml = write_best_yaml(best, out, per_iter)
    write_table(table, list(space), out / "trials.csv")
    plot(rows, table, list(space), out / "tune.png")
    summary = {"best": best, "trials": table, "best_yaml": str(best_yaml), "table": str(out / "trials.csv"),
               "plot": str(out / "tune.png"), "experiment": str(path)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


def _safe(env: Any) -> str:
    import re

    from corral.envs.make import env_name

    return re.sub(r"[^A-Za-z0-9_.-]+", "_", env_name(env))


def trial_table(rows: list[dict], keys: list[str], runs_root: Path, iterations: int) -> list[dict]:
    """One row per trial (its last evaluation, its best, how far it ran), best first: trials
    that ran every iteration rank by their last evaluation, ahead of those ASHA stopped."""
    by_trial: dict[str, list[dict]] = {}
    for r in rows:
        by_trial.setdefault(r["trial"], []).append(r)
    table = []
    for trial, rs in by_trial.items():
        rs.sort(key=lambda r: r["iteration"])
        last = rs[-1]
        table.append({"trial": trial, "eval_return": last["eval_return"],
                      "best_eval_return": max(r["eval_return"] for r in rs), "iterations": last["iteration"],
                      "env_steps": last["env_steps"], "complete": last["iteration"] >= iterations,
                      **{k: last[k] for k in keys}, "run_dir": str(runs_root / trial)})
    table.sort(key=lambda t: (t["complete"], t["eval_return"]), reverse=True)
    return table


def write_table(table: list[dict], keys: list[str], path: Path) -> None:
    cols = ["trial", "eval_return", "best_eval_return", "iterations", "env_steps", "complete", *keys, "run_dir"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(table)


def format_table(table: list[dict], keys: list[str]) -> str:
    head = f"{'trial':14s} {'eval':>8s} {'best':>8s} {'iters':>5s}  " + "  ".join(f"{k:>14s}" for k in keys)
    lines = [head]
    for t in table:
        vals = "  ".join(f"{_fmt(t[k]):>14s}" for k in keys)
        lines.append(f"{t['trial']:14s} {t['eval_return']:8.1f} {t['best_eval_return']:8.1f} {t['iterations']:5d}  {vals}")
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def write_best_yaml(best: dict, out: Path, per_iter: int) -> Path:
    """The best trial's resolved config as a preset for ``corral train --config``: the same
    seed and budget reproduce the trial, with an evaluation after each of its iterations."""
    data = C.load_yaml(str(Path(best["run_dir"]) / "config.yaml"))
    data["progress"] = True
    data.setdefault("eval", {})["every"] = per_iter
    path = out / "best.yaml"
    header = (f"# corral tune: best trial {best['trial']}, eval return {best['eval_return']:.2f} after "
              f"{best['env_steps']:,} steps\n# reproduce: corral train {data['algo']} {data['env']['id']} "
              f"--config {path.name}\n")
    path.write_text(header + yaml.safe_dump(data, sort_keys=False))
    return path


def plot(rows: list[dict], table: list[dict], keys: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 1 + len(keys), figsize=(5 * (1 + len(keys)), 3.6))
    best = table[0]["trial"]
    for t in table:
        mine = sorted((r for r in rows if r["trial"] == t["trial"]), key=lambda r: r["iteration"])
        axes[0].plot([r["env_steps"] for r in mine], [r["eval_return"] for r in mine], marker=".",
                     lw=2.5 if t["trial"] == best else 1, alpha=1 if t["trial"] == best else 0.6, label=t["trial"])
    axes[0].set_title("eval return per trial (best: thick)")
    axes[0].set_xlabel("env steps")
    for ax, k in zip(axes[1:], keys):
        xs = [t[k] for t in table]
        ax.scatter(xs, [t["eval_return"] for t in table], c=["C3" if t["trial"] == best else "C0" for t in table])
        ax.set_xlabel(k)
        ax.set_ylabel("last eval return")
        num = [x for x in xs if isinstance(x, (int, float))]
        if num and min(num) > 0 and max(num) / min(num) > 20:
            ax.set_xscale("log")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


