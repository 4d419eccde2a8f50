"""Aggregate statistics and plots for benchmark scores, after rliable (Agarwal et al. 2021,
"Deep RL at the Edge of the Statistical Precipice").

Scores are laid out as rliable's: ``score_dict = {algo: array of shape [runs, tasks]}``, one row
per seed and one column per env, already normalized (see :func:`normalize`) when aggregated
across tasks. The point metrics have rliable's definitions (``rliable/metrics.py``); the
intervals are stratified-bootstrap percentile intervals (``rliable/library.py``: each task's
runs are resampled with replacement on their own, the tasks are kept), drawn from a seeded
numpy ``Generator`` so that a seed gives the same interval every time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from corral.train.evaluate import iqm

_TITLES = {"iqm": "IQM", "median": "Median", "mean": "Mean",
           "optimality_gap": "Optimality gap (lower is better)"}


def _matrix(scores) -> np.ndarray:
    """``scores`` as a float [runs, tasks] matrix; a 1-D array is one task's runs."""
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.size == 0:
        raise ValueError(f"scores must be a non-empty [runs, tasks] matrix, got shape {arr.shape}")
    return arr


def normalize(scores, low, high) -> np.ndarray:
    """``(scores - low) / (high - low)``: 0 at ``low`` (say a random policy's score), 1 at
    ``high`` (a reference score); ``low`` and ``high`` may be per-task arrays."""
    low, high = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    return (np.asarray(scores, dtype=np.float64) - low) / (high - low)


def aggregate_iqm(scores) -> float:
    """Interquartile mean over all runs and tasks together (25% trimmed from each end)."""
    return iqm(_matrix(scores))


def aggregate_median(scores) -> float:
    """Median over tasks of each task's mean score across runs."""
    return float(np.median(_matrix(scores).mean(axis=0)))


def aggregate_mean(scores) -> float:
    """Mean over tasks of each task's mean score across runs."""
    return float(_matrix(scores).mean(axis=0).mean())


def aggregate_optimality_gap(scores, gamma: float = 1.0) -> float:
    """How far below ``gamma`` the scores are on average, scores above ``gamma`` counted as
    ``gamma``: ``gamma - mean(min(scores, gamma))``."""
    return float(gamma - np.minimum(_matrix(scores), gamma).mean())


AGGREGATES: dict[str, Callable[[np.ndarray], float]] = {
    "iqm": aggregate_iqm,
    "median": aggregate_median,
    "mean": aggregate_mean,
    "optimality_gap": aggregate_optimality_gap,
}


def stratified_bootstrap_ci(scores, statistic: Callable, reps: int = 2000,
                            confidence: float = 0.95, seed: int = 0):
    """``(point, lo, hi)``: ``statistic`` on ``scores`` ([runs, tasks], or one task's runs as
    a 1-D array) and its stratified-bootstrap percentile interval. Each of ``reps`` resamples
    draws, for every task on its own, as many runs as there are with replacement from that
    task's runs; ``lo`` and ``hi`` are the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2``
    percentiles (linear interpolation) of ``statistic`` over the resamples. A statistic that
    returns an array (say a profile over thresholds) gets arrays back. With one run every
    resample is the data itself, so the interval is the point."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if reps < 1:
        raise ValueError(f"reps must be at least 1, got {reps}")
    arr = _matrix(scores)
    runs, tasks = arr.shape
    rng = np.random.default_rng(seed)
    cols = np.arange(tasks)
    boot = np.array([statistic(arr[rng.integers(0, runs, size=(runs, tasks)), cols])
                     for _ in range(reps)], dtype=np.float64)
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.percentile(boot, [100.0 * alpha, 100.0 * (1.0 - alpha)], axis=0)
    point = np.asarray(statistic(arr), dtype=np.float64)
    if point.ndim == 0:
        return float(point), float(lo), float(hi)
    return point, lo, hi


def interval_estimates(score_dict: Mapping[str, np.ndarray], reps: int = 2000,
                       confidence: float = 0.95, seed: int = 0) -> dict[str, dict[str, tuple]]:
    """``{algo: {metric: (point, lo, hi)}}`` for the metrics IQM, median, mean and optimality
    gap (``gamma=1``), each interval from :func:`stratified_bootstrap_ci` with ``seed``."""
    return {algo: {name: stratified_bootstrap_ci(scores, fn, reps, confidence, seed)
                   for name, fn in AGGREGATES.items()}
            for algo, scores in score_dict.items()}


def run_score_distribution(scores, taus) -> np.ndarray:
    """For each threshold ``tau``, the fraction of all (run, task) scores above it."""
    arr = _matrix(scores)
    taus = np.asarray(taus, dtype=np.float64)
    return (arr.ravel()[:, None] > taus.ravel()[None, :]).mean(axis=0).reshape(taus.shape)


def performance_profile(score_dict: Mapping[str, np.ndarray], taus, reps: int = 2000,
                        confidence: float = 0.95, seed: int = 0) -> dict[str, tuple]:
    """``{algo: (profile, lo, hi)}``, each an array over ``taus``: the run-score distribution
    (the fraction of runs, over all tasks, that score above ``tau``) with its
    stratified-bootstrap band."""
    taus = np.asarray(taus, dtype=np.float64)
    out = {}
    for algo, scores in score_dict.items():
        point, lo, hi = stratified_bootstrap_ci(
            scores, lambda m: run_score_distribution(m, taus), reps, confidence, seed)
        out[algo] = (np.atleast_1d(point), np.atleast_1d(lo), np.atleast_1d(hi))
    return out


def _figure(**kwargs):
    """A matplotlib Figure outside pyplot (no global state, no display): ``savefig`` renders
    it with Agg."""
    from matplotlib.figure import Figure
    return Figure(**kwargs)


def _colors(names: Sequence[str]) -> dict[str, tuple]:
    import matplotlib
    cmap = matplotlib.colormaps["tab10"]
    return {name: cmap(i % 10) for i, name in enumerate(names)}


def plot_aggregates(estimates: Mapping[str, Mapping[str, tuple]], path,
                    xlabel: str = "Normalized score") -> str:
    """rliable's interval-estimate plot from :func:`interval_estimates`' output: one panel per
    metric, one horizontal bar per algorithm spanning its interval, a tick at its point.
    Writes a PNG to ``path`` and returns the path."""
    algos = list(estimates)
    metrics = list(dict.fromkeys(m for a in algos for m in estimates[a]))
    colors = _colors(algos)
    fig = _figure(figsize=(3.4 * len(metrics), 0.55 * len(algos) + 1.6))
    axes = fig.subplots(1, len(metrics), squeeze=False)
    for k, (ax, metric) in enumerate(zip(axes[0], metrics)):
        for i, algo in enumerate(algos):
            if metric not in estimates[algo]:
                continue
            point, lo, hi = estimates[algo][metric]
            ax.barh(i, hi - lo, left=lo, height=0.6, color=colors[algo], alpha=0.75)
            ax.vlines(point, i - 0.3, i + 0.3, color="k", linewidth=1.5)
            ax.plot([point], [i], "o", color=colors[algo], markeredgecolor="k", markersize=5)
        ends = [v for a in algos if metric in estimates[a] for v in estimates[a][metric][1:]]
        if ends:  # padded, so an interval at the panel's edge (one seed: a point) stays visible
            span = (max(ends) - min(ends)) or max(abs(max(ends)), 1.0)
            ax.set_xlim(min(ends) - 0.1 * span, max(ends) + 0.1 * span)
        ax.set_yticks(range(len(algos)))
        ax.set_yticklabels(algos if k == 0 else [])
        ax.set_ylim(-0.7, len(algos) - 0.3)
        ax.invert_yaxis()
        ax.set_title(_TITLES.get(metric, metric))
        ax.grid(axis="x", alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
    fig.supxlabel(xlabel)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return str(path)


def plot_profiles(profiles: Mapping[str, tuple], taus, path,
                  xlabel: str = r"Normalized score ($\tau$)") -> str:
    """Performance profiles from :func:`performance_profile`' output: each algorithm's
    run-score distribution over ``taus`` with its bootstrap band. Writes a PNG to ``path``
    and returns the path."""
    taus = np.asarray(taus, dtype=np.float64)
    colors = _colors(list(profiles))
    fig = _figure(figsize=(6, 4))
    ax = fig.subplots()
    for algo, (point, lo, hi) in profiles.items():
        ax.plot(taus, point, color=colors[algo], linewidth=2, label=algo)
        ax.fill_between(taus, lo, hi, color=colors[algo], alpha=0.2, linewidth=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(r"Fraction of runs with score > $\tau$")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return str(path)
