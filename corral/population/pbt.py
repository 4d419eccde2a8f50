"""Population-based training (Jaderberg et al. 2017, arXiv:1711.09846) on Ray Tune.

Ray Tune's ``PopulationBasedTraining`` scheduler runs the population; corral gives it
:class:`corral.population.trainable.CorralTrainable` (a stepped Learner that saves and restores
corral's exact checkpoints) and :func:`explore`, called by the scheduler as its
``custom_explore_fn``. Exploit is Tune's truncation selection: a member in the bottom
``quantile`` takes the checkpoint *and* the hyper-parameters of one in the top ``quantile``;
explore then perturbs or resamples the named hyper-parameters, and the trainable restores the
winner's state under the new values (loading a state keeps the optimizer
hyper-parameters the trial's own config built).

:func:`toy` is the paper's toy problem (section 4, figure 2) driven in-process with the
same :func:`exploit` / :func:`explore`."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path
from typing import Any, Sequence

from corral.errors import UserError
from corral.population.space import Dim, parse_space


def explore(hparams: dict, space: dict[str, Dim], rng: random.Random, resample_probability: float = 0.25,
            factors: tuple[float, float] = (0.8, 1.2)) -> dict:
    """PBT's explore: each hyper-parameter in ``space`` is resampled from its dimension with
    ``resample_probability``, else perturbed (times 0.8 or 1.2, clipped to the bounds; a
    choice moves to a neighbour). Keys not in ``space`` are kept."""
    out = dict(hparams)
    for key, dim in space.items():
        if key not in out or rng.random() < resample_probability:
            out[key] = dim.sample(rng)
        else:
            out[key] = dim.perturb(out[key], rng, factors)
    return out


def exploit(scores: Sequence[float], rng: random.Random, quantile: float = 0.25) -> list[tuple[int, int]]:
    """PBT's exploit by truncation selection (as Tune's scheduler): ``(loser, winner)`` pairs,
    each member of the bottom ``quantile`` paired with a random member of the top ``quantile``
    (at least one each). Ties are ordered by index, as any sort would break them."""
    n = len(scores)
    k = max(1, int(round(n * quantile)))
    if n < 2:
        return []
    order = sorted(range(n), key=lambda i: scores[i])
    bottom, top = order[:k], order[-k:]
    return [(i, rng.choice(top)) for i in bottom if i not in top]


# --- the paper's toy: maximise Q(theta) = 1.2 - (theta0^2 + theta1^2), seen by each member only
# through the surrogate Q_hat(theta | h) = 1.2 - (h0 theta0^2 + h1 theta1^2)
def toy_q(theta: Sequence[float]) -> float:
    return 1.2 - (theta[0] ** 2 + theta[1] ** 2)


def toy(steps: int = 100, ready: int = 4, use_exploit: bool = True, use_explore: bool = True, seed: int = 0,
        lr: float = 0.05, h_min: float = 1e-3, resample_probability: float = 0.0) -> dict:
    """Two members from theta = [0.9, 0.9] with h = [1, h_min] and [h_min, 1] (log-uniform in
    [h_min, 1]) take gradient-ascent steps on their surrogate; every ``ready`` steps they are
    scored with the true Q, the worse one takes the better's theta and h (exploit) and its h
    is perturbed (explore; without exploit every member explores). Returns the best member's
    Q after each step and the first step where it is within 1e-3 of the optimum 1.2."""
    rng = random.Random(seed)
    space = {"h0": Dim("h0", "loguniform", h_min, 1.0), "h1": Dim("h1", "loguniform", h_min, 1.0)}
    pop = [{"theta": [0.9, 0.9], "h": {"h0": 1.0, "h1": h_min}}, {"theta": [0.9, 0.9], "h": {"h0": h_min, "h1": 1.0}}]
    best, reached = [], None
    for t in range(1, steps + 1):
        for m in pop:  # d Q_hat / d theta_i = -2 h_i theta_i
            m["theta"] = [th + lr * (-2.0 * m["h"][f"h{i}"] * th) for i, th in enumerate(m["theta"])]
        scores = [toy_q(m["theta"]) for m in pop]
        best.append(max(scores))
        if reached is None and best[-1] >= 1.2 - 1e-3:
            reached = t
        if t % ready:
            continue
        changed = set()
        if use_exploit:
            for loser, winner in exploit(scores, rng, quantile=0.5):
                pop[loser] = {"theta": list(pop[winner]["theta"]), "h": dict(pop[winner]["h"])}
                changed.add(loser)
        if use_explore:
            for i in (changed if use_exploit else range(len(pop))):
                pop[i]["h"] = explore(pop[i]["h"], space, rng, resample_probability)
    return {"best_q": best, "final": best[-1], "reached": reached, "population": pop}


# --- on Ray Tune
def pbt(algo: str, env: Any = "CartPole-v1", *, mutations: dict | list, initial: dict | None = None,
        population: int = 4, iterations: int = 10, steps_per_iteration: int = 10_000, interval: int = 1,
        quantile: float = 0.25, resample_probability: float = 0.25, seed: int = 0, sets: Sequence[str] = (),
        eval_episodes: int = 10, out: str | Path = "pbt", name: str | None = None, num_cpus: int | None = None,
        cpus_per_trial: float = 1.0, resume: bool = False, synch: bool = True, verbose: int = 0) -> dict:
    """Population-based training of ``algo`` on ``env`` with Ray Tune's PBT scheduler.

    ``mutations``: the hyper-parameters PBT explores, a space (``{"ppo.lr": "loguniform:1e-5:1e-2"}``
    or ``["ppo.lr=loguniform:1e-5:1e-2"]``; keys that can change mid-run: rates, coefficients,
    discount, clip range, not network sizes or rollout lengths). ``initial``: each key's starting
    values, one per member (default: sampled from the space). Every ``interval`` iterations of
    ``steps_per_iteration`` env steps each member is scored by a deterministic evaluation
    (``eval_episodes``). Writes under ``out``: ``runs/<trial>/`` (each member an ordinary corral
    run directory), ``schedules.csv`` / ``schedules.json`` (every member's hyper-parameters and
    eval return per iteration), ``schedules.png``, and Ray's experiment (``ray/``; ``resume=True``
    continues an interrupted one). Returns the best member's summary and the paths."""
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining

    from corral.population.tune import check_space, fit_trials, ray_session, trainable_params, trial_dirname, trial_rows

    space = parse_space(mutations)
    if not space:
        raise UserError("pbt: name at least one hyper-parameter to explore (mutations)")
    check_space(space, algo, env)
    initial = dict(initial or {})
    for key, values in initial.items():
        if key not in space:
            raise UserError(f"pbt: initial values for {key!r}, which is not in the mutations ({', '.join(space)})")
        if len(values) != population:
            raise UserError(f"pbt: {len(values)} initial values for {key!r} and a population of {population}; "
                            "give one per member")
    out = Path(out).resolve()
    rng = random.Random(seed)
    members = []
    for i in range(population):
        hp = {k: (initial[k][i] if k in initial else dim.sample(rng)) for k, dim in space.items()}
        members.append(hp)
    base = trainable_params(algo, env, sets, seed, steps_per_iteration, iterations, eval_episodes, out / "runs")
    param_space = {**base, "__member__": tune.grid_search(list(range(population)))}
    for key in space:
        param_space[key] = tune.sample_from(lambda spec, k=key: members[spec.config["__member__"]][k])
    explore_rng = random.Random(seed + 1)

    def custom_explore(config: dict) -> dict:
        return explore(config, space, explore_rng, resample_probability)

    scheduler = PopulationBasedTraining(
        time_attr="training_iteration", perturbation_interval=interval, quantile_fraction=quantile,
        custom_explore_fn=custom_explore, synch=synch)
    with ray_session(num_cpus):
        name = name or f"pbt-{algo}-{_safe(env)}"
        tune_config = tune.TuneConfig(metric="eval_return", mode="max", scheduler=scheduler, reuse_actors=False,
                                      trial_dirname_creator=trial_dirname)
        grid = fit_trials(out, name, resume, cpus_per_trial, param_space, tune_config, iterations, verbose,
                          keep=max(4, population))
        rows = trial_rows(grid, list(space))
    final = {}
    for r in rows:  # each trial's last row
        final[r["trial"]] = r
    best = max(final.values(), key=lambda r: r["eval_return"])
    write_schedules(rows, list(space), out)
    return {"best": best, "final": list(final.values()), "schedules": str(out / "schedules.csv"),
            "plot": str(out / "schedules.png"), "rows": rows, "initial": members}


def _safe(env: Any) -> str:
    import re

    from corral.envs.make import env_name

    return re.sub(r"[^A-Za-z0-9_.-]+", "_", env_name(env))


def write_schedules(rows: list[dict], keys: list[str], out: Path) -> None:
    """Every member's hyper-parameters and eval return per iteration, as CSV, JSON and a plot."""
    out.mkdir(parents=True, exist_ok=True)
    cols = ["trial", "iteration", "env_steps", "eval_return", *keys]
    with open(out / "schedules.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    (out / "schedules.json").write_text(json.dumps(rows, indent=1, default=str))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 1 + len(keys), figsize=(5 * (1 + len(keys)), 3.6))
    trials = sorted({r["trial"] for r in rows})
    for t in trials:
        mine = [r for r in rows if r["trial"] == t]
        axes[0].plot([r["iteration"] for r in mine], [r["eval_return"] for r in mine], marker=".", label=t)
        for ax, k in zip(axes[1:], keys):
            ax.step([r["iteration"] for r in mine], [r[k] for r in mine], where="post", marker=".", label=t)
    axes[0].set_title("eval return")
    for ax, k in zip(axes[1:], keys):
        ax.set_title(k)
        vals = [r[k] for r in rows if isinstance(r.get(k), (int, float))]
        if vals and min(vals) > 0 and max(vals) / min(vals) > 20:
            ax.set_yscale("log")
    for ax in axes:
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "schedules.png", dpi=100)
    plt.close(fig)
