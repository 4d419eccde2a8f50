"""What a suite will cost before it runs: CPU-hours and memory per run, from steps/s measured
on this machine (``probe``) or recorded in the suite (``speeds:``, with the machine they were
measured on).

A probe builds the cell's run exactly as the suite would and trains it for a few seconds. Runs
have two speeds: before ``learning_starts`` (off-policy: acting only) and after it (acting and
gradient steps); the probe times both, plus one evaluation, and the estimate adds them up over
the budget. Memory is the probe's resident size plus the part of the replay buffer it has not
filled yet.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass

from corral.bench.suite import Run, Suite


@dataclass
class Speed:
    learn_sps: float  # env steps/s with gradient steps
    warmup_sps: float | None = None  # env steps/s before learning_starts
    learning_starts: int = 0
    eval_s: float = 0.0  # one evaluation
    rss_mb: float | None = None

    def as_dict(self) -> dict:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in self.__dict__.items() if v is not None}


def seconds(speed: Speed, run: Run, evals: int) -> float:
    warm = min(speed.learning_starts, run.steps) if speed.warmup_sps else 0
    t = (run.steps - warm) / speed.learn_sps + (warm / speed.warmup_sps if warm else 0.0)
    return t + evals * speed.eval_s


def evaluations(run: Run) -> int:
    sets = dict(run.sets)
    every = int(sets.get("eval.every", 0))
    return (run.steps // every if every else 0) + (1 if int(sets.get("eval.episodes", 10)) > 0 else 0)


def probe(run: Run, seconds_: float = 20.0) -> Speed:
    """Train ``run`` for about ``seconds_`` here (past ``learning_starts`` when the algorithm
    has one, up to 4x longer) and time one evaluation."""
    import torch

    from corral.train.learner import Learner
    from corral.train.setup import build_config

    sets = {**dict(run.sets), "eval.every": 0, "checkpoint.every": 0, "progress": False, "tensorboard": False}
    cfg = build_config(run.algo, run.env, steps=run.steps, seed=run.seed, overrides=sets, zoo=bool(run.zoo),
                       lenient=run.zoo == "lenient")
    torch.set_num_threads(max(1, cfg.threads))
    learner = Learner(cfg, None, quiet=True)
    starts = int(getattr(cfg.algo_cfg, "learning_starts", 0) or 0)
    learner.start()
    clock = time.process_time  # CPU seconds: what the runs are charged, whatever else the machine runs
    t0 = clock()
    trace = [(0, 0.0)]
    try:
        while not learner.done():
            if learner.step() is None:
                break
            now = clock() - t0
            trace.append((learner.env_steps, now))
            past = learner.env_steps > starts
            if now > seconds_ and (past or now > 4 * seconds_):
                # and at least a second past learning_starts, to time the gradient steps
                first = next((t for s, t in trace if s > starts), now)
                if now - first >= min(seconds_ / 2, 5.0) or now > 4 * seconds_:
                    break
        t_eval = clock()
        learner.evaluate()
        eval_s = clock() - t_eval
        unfilled = learner.algo.unfilled_bytes()
    finally:
        learner.close()
    # An algorithm that only acts before learning_starts yields its first update just past it:
    # the time to there is the warm-up, the updates after it the learning phase.
    first = next((i for i, (s, _) in enumerate(trace) if s > starts), None) if starts else None
    warm_sps = None
    if first is not None and first > 0:
        warm_steps, warm_t = trace[first]
        warm_sps = warm_steps / max(warm_t, 1e-9)
        starts = warm_steps
    learn = trace[first:] if first is not None else trace[1:]
    if len(learn) >= 2:  # the later half of the learning phase: past its start-up
        a, b = learn[len(learn) // 2 if len(learn) >= 4 else 0], learn[-1]
        learn_sps = (b[0] - a[0]) / max(b[1] - a[1], 1e-9)
    else:
        s, t = trace[-1]
        learn_sps = s / max(t, 1e-9)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return Speed(learn_sps=learn_sps, warmup_sps=warm_sps, learning_starts=starts if warm_sps else 0,
                 eval_s=eval_s, rss_mb=rss + unfilled / 2**20)


def probe_apart(run: Run, seconds_: float = 20.0) -> Speed:
    """:func:`probe` in a fresh process: its peak resident size is the run's alone, and
    nothing the probe allocates stays in this one."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(probe, run, seconds_).result()


def recorded(suite: Suite, run: Run) -> Speed | None:
    s = suite.speeds.get(run.cell)
    if not s:
        return None
    return Speed(learn_sps=float(s["learn_sps"]), warmup_sps=s.get("warmup_sps"),
                 learning_starts=int(s.get("learning_starts", 0)), eval_s=float(s.get("eval_s", 0.0)),
                 rss_mb=s.get("rss_mb"))


def plan(suite: Suite, runs: list[Run], speeds: dict[str, Speed]) -> list[dict]:
    """One row per run: its budget, evaluations, estimated CPU-hours and memory (None where no
    speed is known)."""
    rows = []
    for run in runs:
        sp = speeds.get(run.cell)
        n_eval = evaluations(run)
        rows.append({"run": run.name, "algo": run.algo, "env": run.env, "seed": run.seed, "steps": run.steps,
                     "evals": n_eval, "cpu_hours": seconds(sp, run, n_eval) / 3600 if sp else None,
                     "memory_mb": sp.rss_mb if sp else None})
    return rows
