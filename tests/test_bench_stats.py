"""corral.bench.stats: rliable's aggregate metrics, stratified-bootstrap intervals and
performance profiles, checked on hand-worked matrices and against rliable itself.

The rliable comparison reads ``tests/data/rliable_reference.json``, made once by rliable
1.2.0 (arch 7.2.0, numpy 2.4.6, scipy 1.17.1, pandas 2.3.3) in a throwaway venv:

    python -m venv /tmp/rly-venv && /tmp/rly-venv/bin/pip install rliable "pandas<3"
    /tmp/rly-venv/bin/python make_rliable_ref.py tests/data/rliable_reference.json

where ``make_rliable_ref.py`` is the script stored verbatim in the file's ``generator_source``
(fixed matrices from ``np.random.default_rng(2021)``; ``rliable.library.get_interval_estimates``
and ``create_performance_profile`` with reps=5000, the global numpy RNG seeded before each).
A throwaway venv because in the project venv (pandas 3.x) ``import rliable.library`` fails:
arch 7.2 (rliable pins arch<8) calls pandas' ``deprecate_kwarg`` with the pre-3.0 signature.
Where rliable does import, the last tests compare against it live as well.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from corral.bench import stats
from corral.train.evaluate import iqm

REFERENCE = json.loads((Path(__file__).parent / "data" / "rliable_reference.json").read_text())

# runs x tasks = 4 x 3, worked by hand below
M = np.array([[0.0, 1.0, 0.5],
              [0.2, 1.4, 0.5],
              [0.4, 0.6, 0.5],
              [1.0, 2.0, 0.9]])


def test_point_metrics_by_hand():
    # IQM: the 12 scores sorted are 0 .2 .4 | .5 .5 .5 .6 .9 1 | 1 1.4 2; dropping
    # floor(12/4) = 3 from each end leaves .5 .5 .5 .6 .9 1.0, mean 4.0 / 6
    assert stats.aggregate_iqm(M) == pytest.approx(4.0 / 6, abs=1e-12)
    # per-task means over runs: 1.6/4 = 0.4, 5.0/4 = 1.25, 2.4/4 = 0.6
    assert stats.aggregate_median(M) == pytest.approx(0.6, abs=1e-12)  # of 0.4 0.6 1.25
    assert stats.aggregate_mean(M) == pytest.approx(2.25 / 3, abs=1e-12)
    # optimality gap: min(x, 1) sums to 1.6 + 3.6 + 2.4 = 7.6 per column, mean 7.6/12,
    # gap 1 - 7.6/12 = 11/30; with gamma 0.5: sums 1.1 + 2.0 + 2.0, gap 0.5 - 5.1/12 = 0.075
    assert stats.aggregate_optimality_gap(M) == pytest.approx(11 / 30, abs=1e-12)
    assert stats.aggregate_optimality_gap(M, gamma=0.5) == pytest.approx(0.075, abs=1e-12)
    # the IQM is the project's own
    assert stats.aggregate_iqm(M) == iqm(M.ravel())


def test_normalize_and_profile_by_hand():
    # task 0 from 0 to 10, task 1 from 10 to 20
    assert np.allclose(stats.normalize([[5, 10], [10, 25]], low=[0, 10], high=[10, 20]),
                       [[0.5, 0.0], [1.0, 1.5]])
    # scores strictly above tau: everything at -1; at 0.5 the 1.0 and 0.9 and the four of
    # task 1 (0.5 itself does not count): 6/12; at 1.0 only 1.4 and 2.0: 2/12; none at 2
    profile = stats.run_score_distribution(M, [-1.0, 0.5, 1.0, 2.0])
    assert np.allclose(profile, [1.0, 0.5, 2 / 12, 0.0])


def test_ci_of_constant_and_of_one_run_is_the_point():
    const = np.full((6, 3), 0.7)
    one_run = M[1:2]  # 1 x 3: every resample is the data itself
    # columns constant within themselves: a stratified bootstrap never mixes tasks, so the
    # mean is 0.5 in every resample (resampling whole rows or all cells would not be)
    per_task_const = np.array([[0.0, 1.0]] * 5)
    for scores in (const, one_run, per_task_const):
        for name, fn in stats.AGGREGATES.items():
            pt, lo, hi = stats.stratified_bootstrap_ci(scores, fn, reps=200)
            assert lo == pytest.approx(pt, abs=1e-12) and hi == pytest.approx(pt, abs=1e-12), name


def test_ci_deterministic_contains_point_narrows_with_runs():
    rng = np.random.default_rng(0)
    few = rng.normal([0.2, 0.8, 1.4], 0.4, size=(5, 3))
    many = rng.normal([0.2, 0.8, 1.4], 0.4, size=(50, 3))
    for fn in stats.AGGREGATES.values():
        a = stats.stratified_bootstrap_ci(few, fn, reps=500, seed=3)
        assert a == stats.stratified_bootstrap_ci(few, fn, reps=500, seed=3)
        assert a != stats.stratified_bootstrap_ci(few, fn, reps=500, seed=4)
        pt, lo, hi = a
        assert lo <= pt <= hi and lo < hi
        _, lo50, hi50 = stats.stratified_bootstrap_ci(many, fn, reps=500, seed=3)
        assert hi50 - lo50 < 0.6 * (hi - lo)  # ~ 1/sqrt(10) as wide


def test_one_task_is_the_ci_of_the_iqm_of_its_seeds():
    seeds = np.array([0.3, 0.9, 0.5, 0.7, 0.1, 0.6])
    pt, lo, hi = stats.stratified_bootstrap_ci(seeds, stats.aggregate_iqm, reps=500)
    assert pt == iqm(seeds)
    assert (pt, lo, hi) == stats.stratified_bootstrap_ci(seeds[:, None], stats.aggregate_iqm,
                                                         reps=500)
    assert 0.1 <= lo < pt < hi <= 0.9


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        stats.aggregate_mean(np.zeros((2, 2, 2)))
    with pytest.raises(ValueError):
        stats.stratified_bootstrap_ci(M, stats.aggregate_mean, confidence=95)


def test_interval_estimates_profiles_and_plots(tmp_path):
    score_dict = {"ppo": M, "dqn": M * 0.5}
    est = stats.interval_estimates(score_dict, reps=300)
    assert set(est) == {"ppo", "dqn"}
    assert set(est["ppo"]) == {"iqm", "median", "mean", "optimality_gap"}
    assert est["ppo"]["mean"][0] == pytest.approx(0.75)
    assert est["dqn"]["mean"][0] == pytest.approx(0.375)
    taus = np.linspace(0, 2, 21)
    profiles = stats.performance_profile(score_dict, taus, reps=300)
    point, lo, hi = profiles["ppo"]
    assert point.shape == lo.shape == hi.shape == (21,)
    assert np.all(lo <= point + 1e-12) and np.all(point <= hi + 1e-12)
    assert np.all(np.diff(point) <= 0)  # a survival curve
    for path in (stats.plot_aggregates(est, tmp_path / "agg.png"),
                 stats.plot_profiles(profiles, taus, tmp_path / "prof.png")):
        data = Path(path).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


# ---- against rliable ------------------------------------------------------------------------

CASES = sorted(REFERENCE["cases"])
TAUS = np.array(REFERENCE["taus"])


@pytest.mark.parametrize("case", CASES)
def test_matches_rliable_reference(case):
    ref = REFERENCE["cases"][case]
    scores = np.array(ref["scores"])
    est = stats.interval_estimates({"a": scores}, reps=REFERENCE["reps"],
                                   confidence=REFERENCE["confidence"])["a"]
    for metric, (pt, lo, hi) in ref["metrics"].items():
        mine = est[metric]
        # the same definitions: the same numbers, to rounding
        assert mine[0] == pytest.approx(pt, abs=1e-12), metric
        # two Monte-Carlo draws of the same percentile interval: 5000 resamples put each end
        # within ~0.03 of the interval's width of rliable's (0.032 at worst here); resampling
        # whole rows, or all cells, or tasks too, or a 90% interval lands 0.12 to 3 widths off
        width = hi - lo
        assert abs(mine[1] - lo) < 0.08 * width, (metric, mine, (pt, lo, hi))
        assert abs(mine[2] - hi) < 0.08 * width, (metric, mine, (pt, lo, hi))
    point, lo, hi = stats.performance_profile({"a": scores}, TAUS, reps=REFERENCE["reps"])["a"]
    ref_point, ref_lo, ref_hi = map(np.array, ref["profile"])
    assert np.array_equal(point, ref_point)  # fractions k / (runs * tasks), exactly
    # the bands are percentiles of such fractions: a draw moves an end by one step at most
    step = 1.0 / scores.size
    assert np.abs(lo - ref_lo).max() <= step + 1e-9 and np.abs(hi - ref_hi).max() <= step + 1e-9
    assert np.abs(lo - ref_lo).mean() < 0.2 * step and np.abs(hi - ref_hi).mean() < 0.2 * step


def test_reference_points_match_rliable_metrics_live():
    """rliable.metrics needs only numpy and scipy, so it imports wherever rliable is installed."""
    metrics = pytest.importorskip("rliable.metrics")
    rng = np.random.default_rng(7)
    for scores in [np.array(c["scores"]) for c in REFERENCE["cases"].values()] + [
            rng.normal(0.5, 0.5, size=(13, 7)), M]:
        assert stats.aggregate_iqm(scores) == pytest.approx(metrics.aggregate_iqm(scores),
                                                            abs=1e-12)
        assert stats.aggregate_median(scores) == metrics.aggregate_median(scores)
        assert stats.aggregate_mean(scores) == metrics.aggregate_mean(scores)
        for gamma in (1, 0.5):
            assert stats.aggregate_optimality_gap(scores, gamma) == pytest.approx(
                metrics.aggregate_optimality_gap(scores, gamma), abs=1e-12)


def test_matches_rliable_library_live():
    try:
        from rliable import library as rly
    except Exception as exc:  # not installed, or (pandas 3 + arch 7) not importable
        pytest.skip(f"rliable.library does not import here: {exc!r}")
    scores = np.random.default_rng(11).normal([0.3, 0.7, 1.1, 0.5], 0.3, size=(8, 4))
    np.random.seed(0)
    pts, cis = rly.get_interval_estimates(
        {"a": scores}, lambda x: np.array([stats.aggregate_iqm(x)]), reps=5000)
    pt, lo, hi = stats.stratified_bootstrap_ci(scores, stats.aggregate_iqm, reps=5000)
    width = cis["a"][1, 0] - cis["a"][0, 0]
    assert pt == pytest.approx(pts["a"][0], abs=1e-12)
    assert abs(lo - cis["a"][0, 0]) < 0.08 * width and abs(hi - cis["a"][1, 0]) < 0.08 * width
    prof, _ = rly.create_performance_profile({"a": scores}, TAUS, reps=10)
    assert np.array_equal(stats.performance_profile({"a": scores}, TAUS, reps=10)["a"][0],
                          prof["a"])
